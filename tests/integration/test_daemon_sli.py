"""Daemon SLIs against a real server, on SQLite and PostgreSQL: `GET /v1/daemons/sli`, `shoal
daemons sli` and `/metrics`, with exact figures.

The history is written straight into the server's database, as the daemon scheduler and the
repair workflow write it: daemon tasks' rows (createdAt, startedAt, stoppedAt, stopCode) and
action-log entries (through `action_log.record` in a unit of work of a Store). The hosts are
registered through RegisterContainerInstance, so no agent is connected to them and the server's
own daemon scheduler leaves them, and these rows, alone.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid

import httpx
import pytest
from sqlalchemy import insert, update

from shoal.api.metrics import Exposition
from shoal.api.operations import Context
from shoal.control import daemon_sli
from shoal.domain.arns import ArnFactory
from shoal.events import action_log
from shoal.store.db import Store
from shoal.store.tables import container_instances, tasks
from tests.support import shoal_cli

ARNS = ArnFactory()
ASG_CONFIG = {"autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:x"}
AGENT = {"name": "agent", "image": "busybox", "memory": 64, "command": ["sleep", "3600"]}
HOUR = 3600.0


def add_host(ecs, engine, cluster: str, provider: str) -> str:
    """An ACTIVE host of `provider` with no agent connected."""
    arn = ecs.register_container_instance(cluster=cluster, totalResources=[
        {"name": "CPU", "type": "INTEGER", "integerValue": 2048},
        {"name": "MEMORY", "type": "INTEGER", "integerValue": 4096}])["containerInstance"]["containerInstanceArn"]
    with engine.begin() as conn:
        conn.execute(update(container_instances).where(container_instances.c.arn == arn)
                     .values(capacity_provider_name=provider))
    return arn


def add_task(engine, cluster: str, daemon_arn: str | None, host: str, *, created: float, last_status: str,
             started: float | None = None, stopped: float | None = None, stop_code: str | None = None,
             reason: str | None = None) -> str:
    """A task's row as the daemon scheduler and the agent leave it (`daemon_arn` None: an app task)."""
    name = daemon_arn.rsplit("/", 1)[-1] if daemon_arn else None
    task_id = uuid.uuid4().hex
    arn = ARNS.task(cluster, task_id)
    doc = {"taskArn": arn, "clusterArn": ARNS.cluster(cluster), "lastStatus": last_status,
           "desiredStatus": "STOPPED" if last_status == "STOPPED" else "RUNNING", "containers": [],
           "group": f"daemon:{name}" if name else "family:app", "startedBy": daemon_arn,
           "containerInstanceArn": host, "version": 1, "createdAt": created, "attributes": [], "tags": []}
    for key, value in (("startedAt", started), ("stoppedAt", stopped), ("stopCode", stop_code),
                       ("stoppedReason", reason)):
        if value is not None:
            doc[key] = value
    with engine.begin() as conn:
        conn.execute(insert(tasks).values(
            arn=arn, id=task_id, cluster_name=cluster, last_status=last_status, desired_status=doc["desiredStatus"],
            family="logs", started_by=daemon_arn, launch_type="EC2", container_instance_arn=host, created_at=created,
            version=1, doc=json.dumps(doc), daemon_name=name))
    return arn


def log(db: Store, cluster: str, entries: list[tuple]) -> None:
    """Record (at, eventName, daemon name or None, detail) entries, in time order as the server
    writes them: one unit of work each, at its own time."""
    for at, event_name, daemon, detail in sorted(entries, key=lambda e: e[0]):
        def unit(conn, at=at, event_name=event_name, daemon=daemon, detail=detail):
            ctx = Context(conn, ARNS, now=at)
            action_log.record(ctx, cluster=cluster, level="INFO", resource_arn=ARNS.cluster(cluster),
                              source_id=ARNS.daemon(cluster, daemon) if daemon else f"shoal/{cluster}",
                              event_name=event_name, detail=detail, daemon=daemon)
        db.submit(unit).result(10)


def sli(server, **params) -> list[dict]:
    resp = server.get("/v1/daemons/sli", params)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["windowSeconds"] == daemon_sli.parse_window(params.get("window", "1h"))
    return body["daemons"]


def error(resp: httpx.Response) -> tuple[int, str, str]:
    body = resp.json()
    return resp.status_code, body["__type"], body["message"]


@pytest.fixture
def history(server, ecs, engine, db, unique):
    """A cluster whose daemon `logs` has an hour of known history (and `other`, a second daemon,
    history of its own). Returns the names, ARNs and the `now` the history was written against."""
    cluster, provider = unique("sli"), unique("asg")
    ecs.create_cluster(clusterName=cluster)
    ecs.create_capacity_provider(name=provider, autoScalingGroupProvider=ASG_CONFIG)
    ecs.put_cluster_capacity_providers(cluster=cluster, capacityProviders=[provider],
                                       defaultCapacityProviderStrategy=[])
    td = ecs.register_daemon_task_definition(family=unique("logs"), containerDefinitions=[AGENT])
    arns = {name: ecs.create_daemon(clusterArn=cluster, daemonName=name, capacityProviderArns=[provider],
                                    daemonTaskDefinitionArn=td["daemonTaskDefinitionArn"])["daemonArn"]
            for name in ("logs", "other")}
    a, b, c = (add_host(ecs, engine, cluster, provider) for _ in range(3))
    logs, other = arns["logs"], arns["other"]
    now = float(math.floor(time.time()))  # whole seconds: the figures below come out exact

    def task(daemon, host, ago, status, **kw):
        return add_task(engine, cluster, daemon, host, created=now - ago, last_status=status,
                        **{k: now - v if isinstance(v, (int, float)) else v for k, v in kw.items()})

    # `logs`, created in the last hour: 3 starts succeeded, 2 failed, 3 undecided.
    task(logs, a, 3000, "STOPPED", started=2990, stopped=2988, stop_code="EssentialContainerExited")  # failed: 2 s
    task(logs, a, 2900, "STOPPED", started=2895, stopped=2000, stop_code="EssentialContainerExited")  # ok: ran 895 s
    task(logs, a, 1900, "RUNNING", started=1890)  # ok: running for 1890 s
    task(logs, b, 2500, "STOPPED", stopped=2490, stop_code="TaskFailedToStart")  # failed: never RUNNING
    task(logs, b, 2400, "STOPPED", started=2395, stopped=2390, stop_code="ServiceSchedulerInitiated",
         reason="Host drained")  # ok: RUNNING, then stopped by shoal
    task(logs, b, 5, "PENDING")  # undecided: not RUNNING yet
    add_task(engine, cluster, logs, b, created=now - 3, last_status="RUNNING", started=now)  # undecided: < 10 s
    task(logs, c, 1000, "STOPPED", stopped=990, stop_code="UserInitiated")  # undecided: stopped before RUNNING
    task(logs, c, 7200, "STOPPED", stopped=7190, stop_code="TaskFailedToStart")  # before the window
    # Another daemon's tasks and an application task do not count for `logs`.
    task(other, c, 3000, "RUNNING", started=2995)
    task(other, c, 2000, "STOPPED", started=1999, stopped=1998, stop_code="EssentialContainerExited",
         reason="Essential container in task exited")
    task(None, c, 100, "STOPPED", stopped=90, stop_code="EssentialContainerExited")

    d, e, f, g, h, i = (ARNS.container_instance(cluster, uuid.uuid4().hex) for _ in range(6))
    log(db, cluster, [
        # restarts: 3 in the window
        (now - 4000, "DAEMON_TASK_RESTARTED", "logs", {"containerInstanceArn": a}),
        (now - 2950, "DAEMON_TASK_RESTARTED", "logs", {"containerInstanceArn": a}),
        (now - 2450, "DAEMON_TASK_RESTARTED", "logs", {"containerInstanceArn": b}),
        (now - 100, "DAEMON_TASK_RESTARTED", "logs", {"containerInstanceArn": a}),
        (now - 90, "DAEMON_TASK_RESTARTED", "other", {"containerInstanceArn": c}),
        # recoveries: on b, opened before the window and closed in it (1000 s); on a, a stop and
        # then a failed start, one episode (120 s); on c, one closed before the window and one open.
        (now - 4000, "DAEMON_TASK_START_IMPAIRED", "logs", {"containerInstanceArn": b}),
        (now - 3000, "DAEMON_TASK_RUNNING", "logs", {"containerInstanceArn": b, "afterFailures": 3}),
        (now - 2000, "DAEMON_TASK_STOPPED", "logs", {"containerInstanceArn": a, "critical": True}),
        (now - 1990, "DAEMON_TASK_START_IMPAIRED", "logs", {"containerInstanceArn": a}),
        (now - 1880, "DAEMON_TASK_RUNNING", "logs", {"containerInstanceArn": a, "afterFailures": 2}),
        (now - 9000, "DAEMON_TASK_START_IMPAIRED", "logs", {"containerInstanceArn": c}),
        (now - 8000, "DAEMON_TASK_RUNNING", "logs", {"containerInstanceArn": c, "afterFailures": 1}),
        (now - 500, "DAEMON_TASK_START_IMPAIRED", "logs", {"containerInstanceArn": c}),
        # `other` recovers on c in 30 s
        (now - 1030, "DAEMON_TASK_STOPPED", "other", {"containerInstanceArn": c, "critical": False}),
        (now - 1000, "DAEMON_TASK_RUNNING", "other", {"containerInstanceArn": c, "afterFailures": 1}),
        # repairs: d is attributed to `logs` by its HOST_REPAIR_STARTED, f by its own entry; g is
        # `other`'s (named by ARN), h ended before the window, i was no daemon's doing.
        (now - 1200, "HOST_REPAIR_STARTED", None, {"containerInstanceArn": d, "daemon": "logs"}),
        (now - 1158, "HOST_REPAIR_COMPLETED", None, {"containerInstanceArn": d, "replacementContainerInstanceArn": e,
                                                     "durationSeconds": 42.5}),
        (now - 600, "HOST_REPAIR_COMPLETED", "logs", {"containerInstanceArn": f, "durationSeconds": 57.5}),
        (now - 700, "HOST_REPAIR_STARTED", None, {"containerInstanceArn": g, "daemon": other}),
        (now - 650, "HOST_REPAIR_COMPLETED", None, {"containerInstanceArn": g, "durationSeconds": 10}),
        (now - 5000, "HOST_REPAIR_STARTED", "logs", {"containerInstanceArn": h, "daemon": "logs"}),
        (now - 4000, "HOST_REPAIR_COMPLETED", "logs", {"containerInstanceArn": h, "durationSeconds": 1000}),
        (now - 800, "HOST_REPAIR_STARTED", None, {"containerInstanceArn": i}),
        (now - 700, "HOST_REPAIR_COMPLETED", None, {"containerInstanceArn": i, "durationSeconds": 5}),
    ])
    return {"cluster": cluster, "logs": logs, "other": other, "now": now, "hosts": (a, b, c)}


EXPECTED_LOGS = {
    "daemonName": "logs", "status": "ACTIVE", "windowSeconds": HOUR,
    "starts": 8, "startsSucceeded": 3, "startsFailed": 2, "startSuccessRate": 0.6,
    "restarts": 3, "restartsPerHour": 3.0,
    "repairs": 2, "mttrReplaceSeconds": 50.0,
    "recoveries": 2, "mttrRecoverSeconds": 560.0,
    "hostsRunning": 2, "hostsWithoutDaemon": 1,  # a and b run it; c does not
}
EXPECTED_OTHER = {
    "daemonName": "other", "status": "ACTIVE", "windowSeconds": HOUR,
    "starts": 2, "startsSucceeded": 1, "startsFailed": 1, "startSuccessRate": 0.5,
    "restarts": 1, "restartsPerHour": 1.0,
    "repairs": 1, "mttrReplaceSeconds": 10.0,
    "recoveries": 1, "mttrRecoverSeconds": 30.0,
    "hostsRunning": 1, "hostsWithoutDaemon": 2,
}


def expected(history, figures: dict) -> dict:
    name = figures["daemonName"]
    return {"cluster": history["cluster"], "daemonArn": history[name], **figures}


def test_the_report_has_exact_figures_per_daemon(server, db, history):
    cluster = history["cluster"]
    want = [expected(history, EXPECTED_LOGS), expected(history, EXPECTED_OTHER)]
    assert sli(server, cluster=cluster) == want
    # Computed in this process at the very moment the history was written against: the same.
    assert db.read_sync(lambda conn: daemon_sli.compute(conn, cluster=cluster, daemon=None, window_s=HOUR,
                                                        now=history["now"])) == want
    # One daemon, by name or by ARN (whose cluster it names); a bare name matches in every cluster.
    assert sli(server, cluster=cluster, daemon="logs") == want[:1]
    assert sli(server, daemon=history["other"]) == want[1:]
    assert [d for d in sli(server, daemon="logs") if d["cluster"] == cluster] == want[:1]


def test_the_window_bounds_every_figure(server, history):
    [half] = sli(server, cluster=history["cluster"], daemon="logs", window="30m")
    assert half == expected(history, {
        **EXPECTED_LOGS, "windowSeconds": 1800.0,
        "starts": 3, "startsSucceeded": 0, "startsFailed": 0, "startSuccessRate": None,  # none decided
        "restarts": 1, "restartsPerHour": 2.0,
        "recoveries": 0, "mttrRecoverSeconds": None,  # a's recovery closed 1880 s ago
    })
    [day] = sli(server, cluster=history["cluster"], daemon="logs", window="2d")
    assert (day["starts"], day["startsFailed"], day["restarts"]) == (9, 3, 4)
    assert (day["recoveries"], day["mttrRecoverSeconds"]) == (3, (1000 + 120 + 1000) / 3)
    assert (day["repairs"], day["mttrReplaceSeconds"]) == (3, (42.5 + 57.5 + 1000) / 3)
    assert day["restartsPerHour"] == pytest.approx(4 / 48)
    [seconds] = sli(server, cluster=history["cluster"], daemon="logs", window="7200")
    assert seconds["windowSeconds"] == 7200.0 and seconds["restarts"] == 4


def test_a_daemon_without_history_has_no_rates(server, ecs, unique):
    cluster, provider = unique("sli"), unique("asg")
    ecs.create_cluster(clusterName=cluster)
    ecs.create_capacity_provider(name=provider, autoScalingGroupProvider=ASG_CONFIG)
    ecs.put_cluster_capacity_providers(cluster=cluster, capacityProviders=[provider],
                                       defaultCapacityProviderStrategy=[])
    td = ecs.register_daemon_task_definition(family=unique("quiet"), containerDefinitions=[AGENT])
    arn = ecs.create_daemon(clusterArn=cluster, daemonName="quiet", capacityProviderArns=[provider],
                            daemonTaskDefinitionArn=td["daemonTaskDefinitionArn"])["daemonArn"]
    assert sli(server, cluster=cluster) == [{
        "cluster": cluster, "daemonName": "quiet", "daemonArn": arn, "status": "ACTIVE", "windowSeconds": HOUR,
        "starts": 0, "startsSucceeded": 0, "startsFailed": 0, "startSuccessRate": None,
        "restarts": 0, "restartsPerHour": 0.0, "repairs": 0, "mttrReplaceSeconds": None,
        "recoveries": 0, "mttrRecoverSeconds": None, "hostsRunning": 0, "hostsWithoutDaemon": 0}]
    empty = unique("sli")
    ecs.create_cluster(clusterName=empty)
    assert sli(server, cluster=empty) == []


@pytest.mark.parametrize("window", ["abc", "0", "0s", "-1h", "1w", "nan", "inf", "91d", "1.5.h", ""])
def test_a_bad_window_is_rejected_naming_it(server, window):
    status, code, message = error(server.get("/v1/daemons/sli", {"window": window}))
    assert (status, code) == (400, "InvalidParameterException") and "'window'" in message, message


def test_bad_filters_and_unsigned_requests_are_rejected(server, ecs, history, unique):
    cluster = history["cluster"]
    status, code, message = error(server.get("/v1/daemons/sli", {"cluster": unique("missing")}))
    assert (status, code) == (400, "ClusterNotFoundException") and "missing-" in message
    status, code, message = error(server.get("/v1/daemons/sli", {"cluster": cluster, "daemon": "nope"}))
    assert (status, code) == (400, "DaemonNotFoundException") and "nope" in message
    for params, field in [({"daemon": ARNS.task(cluster, "abc")}, "daemon"),
                          ({"cluster": ARNS.service(cluster, "web")}, "cluster"),
                          ({"cluster": unique("x"), "daemon": history["logs"]}, "daemon")]:
        status, code, message = error(server.get("/v1/daemons/sli", params))
        assert (status, code) == (400, "InvalidParameterException"), (params, message)
        assert f"'{field}'" in message or f"for {field}:" in message, (params, message)
    assert httpx.get(server.endpoint + "/v1/daemons/sli", timeout=10).status_code == 403


# --- /metrics -----------------------------------------------------------------------------------------

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def parse_exposition(text: str) -> dict[tuple, float]:
    """{(name, frozenset of labels): value}; asserts that every line is well formed and every
    sample's family was declared (HELP and TYPE) before its samples."""
    assert text.endswith("\n")
    declared: dict[str, str] = {}
    samples: dict[tuple, float] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            declared.setdefault(line.split()[2], "")
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert kind in ("gauge", "counter", "untyped"), line
            declared[name] = kind
        else:
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            name, labels, value = m.groups()
            assert declared.get(name) == "gauge", f"{name} has no TYPE line before it"
            key = (name, frozenset(LABEL.findall(labels or "")))
            assert key not in samples, f"duplicate sample {line!r}"
            samples[key] = float(value)
    return samples


def sample(samples, name: str, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_metrics_are_prometheus_text_with_each_daemons_series(server, history):
    resp = httpx.get(server.endpoint + "/metrics", timeout=10)  # no signature: scrapers cannot sign
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = parse_exposition(resp.text)
    cluster = history["cluster"]
    mine = {"cluster": cluster, "daemon": "logs"}
    assert sample(samples, "shoal_daemon_start_success_ratio", **mine) == 0.6
    assert sample(samples, "shoal_daemon_restarts_per_hour", **mine) == 3.0
    assert sample(samples, "shoal_daemon_mttr_seconds", **mine, kind="replace") == 50.0
    assert sample(samples, "shoal_daemon_mttr_seconds", **mine, kind="recover") == 560.0
    assert sample(samples, "shoal_daemon_hosts_without_daemon", **mine) == 1
    assert sample(samples, "shoal_daemon_hosts_without_daemon", cluster=cluster, daemon="other") == 2
    assert sample(samples, "shoal_container_instances", cluster=cluster, status="ACTIVE") == 3
    # logs on a and b, other on c RUNNING; logs' new task on b PENDING; no STOPPED series
    assert sample(samples, "shoal_tasks", cluster=cluster, last_status="RUNNING") == 3
    assert sample(samples, "shoal_tasks", cluster=cluster, last_status="PENDING") == 1
    assert sample(samples, "shoal_tasks", cluster=cluster, last_status="STOPPED") is None


def test_a_figure_without_data_has_no_sample_and_label_values_are_escaped():
    out = Exposition()
    out.gauge("x_ratio", "a \\ help\nline", [({"cluster": 'a"b', "daemon": "c\\d\ne"}, 0.25),
                                            ({"cluster": "z", "daemon": "none"}, None),
                                            ({"cluster": "n", "daemon": "n"}, math.nan),
                                            ({"cluster": "i", "daemon": "i"}, math.inf), ({}, 7)])
    assert out.text() == ('# HELP x_ratio a \\\\ help\\nline\n# TYPE x_ratio gauge\n'
                          'x_ratio{cluster="a\\"b",daemon="c\\\\d\\ne"} 0.25\n'
                          'x_ratio{cluster="n",daemon="n"} NaN\nx_ratio{cluster="i",daemon="i"} +Inf\nx_ratio 7\n')
    samples = parse_exposition(out.text())
    assert samples[("x_ratio", frozenset({("cluster", 'a\\"b'), ("daemon", "c\\\\d\\ne")}))] == 0.25


# --- the CLI ------------------------------------------------------------------------------------------



def test_cli_prints_one_json_array_or_a_table(server, history, tmp_path, backend):
    if backend != "sqlite":
        pytest.skip("the CLI is a client of the API: one backend is enough")
    cluster = history["cluster"]
    doc = json.loads(shoal_cli(server, tmp_path, "daemons", "sli", "--cluster", cluster, "--json").stdout)
    assert doc == [expected(history, EXPECTED_LOGS), expected(history, EXPECTED_OTHER)]
    half = json.loads(shoal_cli(server, tmp_path, "daemons", "sli", "--cluster", cluster, "--daemon", history["logs"],
                            "--window", "30m", "--json").stdout)
    assert [(d["daemonName"], d["windowSeconds"], d["restarts"]) for d in half] == [("logs", 1800.0, 1)]

    lines = shoal_cli(server, tmp_path, "daemons", "sli", "--cluster", cluster).stdout.splitlines()
    assert lines[0].split() == ["CLUSTER", "DAEMON", "STARTS", "START", "OK", "RESTARTS/H", "MTTR", "REPLACE",
                                "MTTR", "RECOVER", "WITHOUT"]
    assert lines[1].split() == [cluster, "logs", "8", "60.0%", "3.00", "50.0s", "560.0s", "1"]
    assert lines[2].split() == [cluster, "other", "2", "50.0%", "1.00", "10.0s", "30.0s", "2"]

    bad = shoal_cli(server, tmp_path, "daemons", "sli", "--window", "soon", code=1)
    assert "InvalidParameterException" in bad.stderr and "'window'" in bad.stderr
