"""The action log: entries written in the caller's transaction (gone with it when it rolls back),
read back oldest first through `GET /v1/action-logs` and `shoal actions list`, filtered by daemon
and time; the JSONL sink gets committed entries only.

Nothing in the server records entries yet (the daemon reconciler will), so the tests record them
the way it will, with `action_log.record` in a unit of work of a real Store: on the test server's
own database for the API and CLI tests, on a store of their own for the sink.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, func, inspect, select, text

from shoal.api.app import create_app
from shoal.api.operations import Context
from shoal.config import Settings
from shoal.domain.arns import ArnFactory
from shoal.domain.errors import InvalidParameter
from shoal.events import action_log
from shoal.events.envelope import iso
from shoal.store import migrate
from shoal.store.db import Store
from shoal.store.tables import action_logs, metadata
from tests.support import database_url_for, shoal_cli, wait_for

ARNS = ArnFactory()
KEYS = {"timestamp", "logLevel", "resourceArn", "actionSourceId", "eventName", "detail"}


def entry(cluster: str, name: str, *, level: str = "INFO", daemon: str | None = None, detail: dict | None = None):
    """What one `record` call takes (the daemon's ARN as the source, as the reconciler will)."""
    return dict(cluster=cluster, level=level, resource_arn=ARNS.cluster(cluster),
                source_id=ARNS.daemon(cluster, daemon) if daemon else f"shoal/{cluster}",
                event_name=name, detail=detail if detail is not None else {"n": name}, daemon=daemon)


def record(store: Store, *entries: dict, now: float | None = None, then=None) -> list[int | None]:
    """Record `entries` in one unit of work (at time `now`), run `then(conn)` after them (it may
    raise, to roll the unit back), and return the ids."""
    def unit(conn):
        ctx = Context(conn, ARNS) if now is None else Context(conn, ARNS, now=now)
        ids = [action_log.record(ctx, **e) for e in entries]
        if then is not None:
            then(conn)
        return ids

    return store.submit(unit).result(10)


def listing(server, cluster: str, **params) -> dict:
    resp = server.get("/v1/action-logs", {"cluster": cluster, **params})
    assert resp.status_code == 200, resp.text
    return resp.json()


def all_entries(server, cluster: str, **params) -> list[dict]:
    found, after = [], None
    while True:
        page = listing(server, cluster, after=after, **params)
        found += page["entries"]
        if page["next"] is None:
            return found
        after = page["next"]


def error(resp: httpx.Response) -> tuple[int, str, str]:
    body = resp.json()
    return resp.status_code, body["__type"], body["message"]


# --- the API --------------------------------------------------------------------------------------


def test_entries_come_back_oldest_first_in_the_action_log_shape(server, ecs, db, unique):
    cluster, other = unique("al"), unique("al")
    ecs.create_cluster(clusterName=cluster)
    ecs.create_cluster(clusterName=other)
    t0 = 1_750_000_000.25
    record(db, entry(cluster, "DAEMON_TASK_STARTED", daemon="logs"), now=t0)
    record(db, entry(other, "ELSEWHERE"), now=t0)
    record(db, entry(cluster, "DAEMON_TASK_START_IMPAIRED", level="WARN", daemon="logs",
                     detail={"statusReason": "RESOURCE:MEMORY - insufficient memory",
                             "containerInstanceArn": "arn:x"}), now=t0 + 1)
    record(db, entry(cluster, "HOST_REPLACEMENT_FAILED", level="ERROR"), now=t0 + 2)

    page = listing(server, ARNS.cluster(cluster))  # the cluster's ARN works as well as its name
    assert page["next"] is None
    entries = page["entries"]
    assert all(set(e) == KEYS for e in entries)
    assert [(e["eventName"], e["logLevel"], e["timestamp"]) for e in entries] == [
        ("DAEMON_TASK_STARTED", "INFO", "2025-06-15T15:06:40.250Z"),
        ("DAEMON_TASK_START_IMPAIRED", "WARN", "2025-06-15T15:06:41.250Z"),
        ("HOST_REPLACEMENT_FAILED", "ERROR", "2025-06-15T15:06:42.250Z"),
    ]
    assert entries[1] == {"timestamp": "2025-06-15T15:06:41.250Z", "logLevel": "WARN",
                          "resourceArn": ARNS.cluster(cluster), "actionSourceId": ARNS.daemon(cluster, "logs"),
                          "eventName": "DAEMON_TASK_START_IMPAIRED",
                          "detail": {"statusReason": "RESOURCE:MEMORY - insufficient memory",
                                     "containerInstanceArn": "arn:x"}}
    assert [e["eventName"] for e in listing(server, other)["entries"]] == ["ELSEWHERE"]


def test_expected_stops_are_filtered_out_and_other_stops_are_kept(server, ecs, db, unique):
    cluster = unique("al")
    ecs.create_cluster(clusterName=cluster)
    ids = record(db, entry(cluster, "DAEMON_TASK_STOPPED", daemon="d",
                           detail={"stopCode": "UserInitiated", "statusReason": "Task stopped by user"}),
                 entry(cluster, "DAEMON_TASK_STOPPED", daemon="d",
                       detail={"stopCode": "EssentialContainerExited", "containerStoppedReason": "exit 1"}))
    assert ids[0] is None and isinstance(ids[1], int)
    assert [e["detail"]["stopCode"] for e in listing(server, cluster)["entries"]] == ["EssentialContainerExited"]


def test_filters_by_daemon_and_since(server, ecs, db, unique):
    cluster = unique("al")
    ecs.create_cluster(clusterName=cluster)
    t0 = time.time() - 3600
    record(db, entry(cluster, "A1", daemon="a"), entry(cluster, "B1", daemon="b"), now=t0)
    record(db, entry(cluster, "C1"), now=t0 + 10)
    record(db, entry(cluster, "A2", daemon="a"), now=t0 + 20)
    record(db, entry(cluster, "B2", daemon="b"), now=t0 + 30)

    def names(**params):
        return [e["eventName"] for e in listing(server, cluster, **params)["entries"]]

    assert names() == ["A1", "B1", "C1", "A2", "B2"]
    assert names(daemon="a") == ["A1", "A2"]
    assert names(daemon=ARNS.daemon(cluster, "b")) == ["B1", "B2"]
    assert names(daemon="nobody") == []
    assert names(since=repr(t0 + 10)) == ["C1", "A2", "B2"]  # from `since` on, inclusive
    assert names(since=iso(t0 + 15)) == ["A2", "B2"]
    assert names(since=iso(t0 + 15).replace("Z", "+00:00")) == ["A2", "B2"]
    assert names(since=iso(t0 + 15)[:-1]) == ["A2", "B2"]  # no offset: UTC
    assert names(daemon="a", since=iso(t0 + 5)) == ["A2"]


def test_pages_link_by_next_until_null(server, ecs, db, unique):
    cluster = unique("al")
    ecs.create_cluster(clusterName=cluster)
    record(db, *[entry(cluster, f"E{i}") for i in range(5)])
    pages, after = [], None
    while True:
        page = listing(server, cluster, limit=2, after=after)
        pages.append([e["eventName"] for e in page["entries"]])
        if page["next"] is None:
            break
        after = page["next"]
    assert pages == [["E0", "E1"], ["E2", "E3"], ["E4"]]
    # Exactly a page left: `next` is null at once, not after an empty page.
    assert listing(server, cluster, limit=5)["next"] is None


def test_bad_parameters_are_rejected_naming_the_parameter(server, ecs, unique):
    cluster = unique("al")
    ecs.create_cluster(clusterName=cluster)
    for params, name in [({}, "cluster"), ({"cluster": cluster, "since": "yesterday"}, "since"),
                         ({"cluster": cluster, "since": "nan"}, "since"),
                         ({"cluster": cluster, "limit": "0"}, "limit"), ({"cluster": cluster, "limit": "1001"}, "limit"),
                         ({"cluster": cluster, "limit": "ten"}, "limit"), ({"cluster": cluster, "after": "-1"}, "after"),
                         ({"cluster": ARNS.service(cluster, "web")}, "cluster"),
                         ({"cluster": cluster, "daemon": ARNS.task(cluster, "abc")}, "daemon")]:
        status, code, message = error(server.get("/v1/action-logs", params))
        assert (status, code) == (400, "InvalidParameterException"), (params, message)
        assert f"'{name}'" in message or f"for {name}:" in message, (params, message)
    status, code, message = error(server.get("/v1/action-logs", {"cluster": unique("missing")}))
    assert (status, code) == (400, "ClusterNotFoundException") and "missing-" in message
    unsigned = httpx.get(server.endpoint + "/v1/action-logs", params={"cluster": cluster}, timeout=10)
    assert unsigned.status_code == 403


def test_a_deleted_cluster_keeps_its_log(server, ecs, db, unique):
    cluster = unique("al")
    ecs.create_cluster(clusterName=cluster)
    record(db, entry(cluster, "BEFORE_DELETE"))
    ecs.delete_cluster(cluster=cluster)
    assert [e["eventName"] for e in listing(server, cluster)["entries"]] == ["BEFORE_DELETE"]


# --- the CLI ----------------------------------------------------------------------------------------



def test_cli_json_is_one_array_oldest_first_across_pages(server, ecs, db, unique, tmp_path, backend):
    if backend != "sqlite":
        pytest.skip("the CLI is a client of the API: one backend is enough")
    cluster = unique("al")
    ecs.create_cluster(clusterName=cluster)
    old = time.time() - 7200
    record(db, entry(cluster, "OLD", daemon="gpu-exporter"), now=old)
    # More than the CLI's page of 1000: `--json` must follow `next` and still print one array.
    record(db, *[entry(cluster, f"N{i:04d}", daemon="gpu-exporter" if i % 2 else None) for i in range(1001)])

    out = shoal_cli(server, tmp_path, "actions", "list", "--cluster", cluster, "--json").stdout
    doc = json.loads(out)  # one JSON document
    assert isinstance(doc, list) and [e["eventName"] for e in doc] == ["OLD"] + [f"N{i:04d}" for i in range(1001)]
    assert all(set(e) == KEYS for e in doc)

    recent = json.loads(shoal_cli(server, tmp_path, "actions", "list", "--cluster", cluster, "--since", "1h",
                              "--daemon", "gpu-exporter", "--json").stdout)
    assert [e["eventName"] for e in recent] == [f"N{i:04d}" for i in range(1, 1001, 2)]
    since_iso = json.loads(shoal_cli(server, tmp_path, "actions", "list", "--cluster", cluster,
                                 "--since", iso(old + 1), "--json").stdout)
    assert len(since_iso) == 1001

    table = shoal_cli(server, tmp_path, "actions", "list", "--cluster", cluster, "--daemon", "gpu-exporter").stdout
    lines = table.splitlines()
    assert len(lines) == 501 and lines[0].split()[1:4] == ["INFO", "OLD", ARNS.daemon(cluster, "gpu-exporter")]
    assert json.loads(lines[0].split(maxsplit=4)[4]) == {"n": "OLD"}

    offset = json.loads(shoal_cli(server, tmp_path, "actions", "list", "--cluster", cluster,
                              "--since", iso(old + 1).replace("Z", "+00:00"), "--json").stdout)
    assert offset == since_iso

    bad = shoal_cli(server, tmp_path, "actions", "list", "--cluster", cluster, "--since", "last tuesday", code=2)
    assert "invalid --since 'last tuesday'" in bad.stderr
    missing = shoal_cli(server, tmp_path, "actions", "list", "--cluster", unique("missing"), code=1)
    assert "ClusterNotFoundException" in missing.stderr


# --- the transaction and the JSONL sink ----------------------------------------------------------


@pytest.fixture
def sunk(backend, tmp_path):
    """A store of its own with the sink attached as the server attaches it (create_app), and the
    path of the sink's file."""
    path = tmp_path / "sink" / "actions.jsonl"
    store = Store(database_url_for(backend) or f"sqlite:///{tmp_path / 'store.db'}")
    create_app(Settings(data_dir=tmp_path, auth=False, action_log_file=path), store=store)
    yield store, path
    store.close()


def sink_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def stored(store: Store) -> list[str]:
    return store.read_sync(lambda conn: list(conn.execute(
        select(action_logs.c.event_name).order_by(action_logs.c.id)).scalars()))


def test_entries_of_units_that_roll_back_vanish_from_the_store_and_never_reach_the_sink(sunk):
    store, path = sunk
    # Hold the writer so that the units below run as one batch, each in its own savepoint.
    release = threading.Event()
    store.submit(lambda conn: release.wait(10))

    def refuse(conn):
        raise InvalidParameter("rejected after recording")

    def inner_rollback(conn):
        # A savepoint inside the unit rolls back on its own: its entry goes, the unit's stay.
        nested = conn.begin_nested()
        action_log.record(Context(conn, ARNS), **entry("c1", "INNER_ROLLED_BACK"))
        nested.rollback()
        action_log.record(Context(conn, ARNS), **entry("c1", "AFTER_INNER"))

    units = []
    for i in range(9):
        then = refuse if i % 3 == 1 else inner_rollback if i == 3 else None
        units.append(store.submit(lambda conn, i=i, then=then: record_in(conn, f"U{i}", then)))
    release.set()
    outcomes = []
    for unit in units:
        try:
            outcomes.append(unit.result(10))
        except InvalidParameter:
            outcomes.append("rolled back")
    assert outcomes.count("rolled back") == 3
    expected = ["U0", "U2", "U3", "AFTER_INNER", "U5", "U6", "U8"]
    assert stored(store) == expected
    wait_for(lambda: path.exists() and len(path.read_text().splitlines()) >= len(expected),
             message="the sink's lines")
    time.sleep(0.2)  # nothing more arrives late
    lines = sink_lines(path)
    assert [line["eventName"] for line in lines] == expected
    assert all(set(line) == KEYS | {"cluster"} and line["cluster"] == "c1" for line in lines)


def record_in(conn, name: str, then=None):
    action_log.record(Context(conn, ARNS), **entry("c1", name))
    if then is not None:
        then(conn)
    return name


def test_the_sink_gets_an_entry_only_once_its_transaction_has_committed(sunk):
    store, path = sunk
    recorded, release = threading.Event(), threading.Event()

    def slow(conn):
        record_in(conn, "SLOW")
        recorded.set()
        release.wait(10)

    done = store.submit(slow)
    assert recorded.wait(10)
    time.sleep(0.2)
    assert path.read_text() == ""  # recorded, not yet committed
    release.set()
    done.result(10)
    wait_for(lambda: path.read_text(), message="the committed entry in the sink")
    assert [line["eventName"] for line in sink_lines(path)] == ["SLOW"]


def test_a_commit_that_fails_leaves_nothing_in_the_sink(sunk):
    """A deferred foreign key is checked at COMMIT: the unit's savepoint is released, and only
    the COMMIT itself fails. The sink must not have written the entry before the COMMIT."""
    store, path = sunk

    def tables(conn):
        conn.execute(text("CREATE TABLE fk_parent (id INTEGER PRIMARY KEY)"))
        conn.execute(text("CREATE TABLE fk_child (pid INTEGER REFERENCES fk_parent (id) "
                          "DEFERRABLE INITIALLY DEFERRED)"))

    store.submit(tables).result(10)
    orphan = store.submit(lambda conn: record_in(conn, "NEVER_COMMITTED", lambda c: c.execute(
        text("INSERT INTO fk_child (pid) VALUES (42)")))).exception(10)
    assert orphan is not None and "may or may not have applied" in str(orphan)
    assert store.submit(lambda conn: record_in(conn, "COMMITTED")).result(10) == "COMMITTED"
    wait_for(lambda: path.read_text(), message="the committed entry in the sink")
    time.sleep(0.2)
    assert [line["eventName"] for line in sink_lines(path)] == ["COMMITTED"]
    assert stored(store) == ["COMMITTED"]


def test_without_a_sink_nothing_is_kept_on_the_connection(backend, tmp_path):
    store = Store(database_url_for(backend) or f"sqlite:///{tmp_path / 'plain.db'}")
    store.migrate()
    try:
        kept = store.submit(lambda conn: (record_in(conn, "PLAIN"), dict(conn.info))[1]).result(10)
        assert not [k for k in kept if k.startswith("shoal.action_log")]
        assert stored(store) == ["PLAIN"]
    finally:
        store.close()


def test_an_unwritable_sink_path_stops_the_server_naming_the_option(tmp_path):
    (tmp_path / "a-file").write_text("")
    proc = subprocess.run([sys.executable, "-m", "shoal.cli.main", "server", "--port", "0", "--data-dir",
                           str(tmp_path / "data"), "--action-log-file", str(tmp_path / "a-file" / "log.jsonl")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--action-log-file" in proc.stderr, proc.stderr


# --- the schema --------------------------------------------------------------------------------


def test_the_migration_creates_what_tables_declares_and_downgrades(backend, tmp_path):
    url = database_url_for(backend) or f"sqlite:///{tmp_path / 'schema.db'}"
    engine = create_engine(url)
    try:
        migrate.upgrade(engine)
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata)
        assert [d for d in diffs if "action_log" in repr(d) or "alarms" in repr(d)] == []
        cfg = Config()
        cfg.set_main_option("script_location", str(migrate._MIGRATIONS))
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0006")
        assert not {"action_logs", "alarms"} & set(inspect(engine).get_table_names())
        migrate.upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(action_logs)).scalar_one() == 0
    finally:
        engine.dispose()
