"""The agent protocol on the server: register with the join token, long-poll desired state,
report task transitions and health, over plain HTTP as an agent speaks it.

Hosts are registered by these tests directly (no agent process), so every request and every
refusal is the test's own. One server per module and backend; each test has its own cluster.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support import ServerProcess, wait_for

HEALTHY = {"CONTAINER_RUNTIME": {"status": "OK"}}
GPU_MEMORY = 24576
TASK_CHANGE, INSTANCE_CHANGE = "ECS Task State Change", "ECS Container Instance State Change"


# --- the protocol, as an agent calls it ------------------------------------------------------------

def join_token(server) -> str:
    return (server.data_dir / "join-token").read_text().strip()


def call(server, method: str, path: str, token: str | None, *, timeout: float = 30, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.request(method, server.endpoint + path, headers=headers, timeout=timeout, **kwargs)


def register_body(cluster: str, *, gpus: int | list[dict] = 0, cpu: int = 4096, memory: int = 16384,
                  ports: list[int] | None = None, capacity_provider: str | None = None,
                  instance_type: str | None = None, attributes: list[dict] | None = None,
                  host_id: str | None = None) -> dict:
    if isinstance(gpus, int):
        gpus = [{"uuid": f"GPU-{uuid.uuid4()}", "model": "Fake A10G", "memoryMiB": GPU_MEMORY} for _ in range(gpus)]
    body = {"cluster": cluster, "hostId": host_id or f"h-{uuid.uuid4().hex[:10]}", "architecture": "x86_64",
            "resources": {"cpu": cpu, "memory": memory, "ports": ports if ports is not None else [22],
                          "udpPorts": []},
            "gpus": gpus, "attributes": attributes or [], "versionInfo": {"agentVersion": "test"}}
    if capacity_provider:
        body["capacityProvider"] = capacity_provider
    if instance_type:
        body["instanceType"] = instance_type
    return body


def register_raw(server, body: dict, token: str | None = None) -> httpx.Response:
    return call(server, "POST", "/v1/agent/register", join_token(server) if token is None else token, json=body)


def report(server, token: str, updates: list[dict] | None = None, health: dict | None = None) -> httpx.Response:
    body = {"updates": updates or []}
    if health is not None:
        body["health"] = health
    return call(server, "POST", "/v1/agent/report", token, json=body)


def poll(server, token: str, since: str | None = None, wait: float = 0, cursor: int | None = None) -> httpx.Response:
    params = {"wait": wait, **({"since": since} if since is not None else {}),
              **({"cursor": cursor} if cursor is not None else {})}
    return call(server, "GET", "/v1/agent/poll", token, params=params, timeout=wait + 30)


def register_host(server, cluster: str, *, gpus: int | list[dict] = 0, cpu: int = 4096, memory: int = 16384,
                  capacity_provider: str | None = None, **extra) -> tuple[str, str]:
    """Register a host and send its first healthy report: it is ACTIVE, with its agent connected.
    Returns (container instance ARN, host token)."""
    resp = register_raw(server, register_body(cluster, gpus=gpus, cpu=cpu, memory=memory,
                                              capacity_provider=capacity_provider, **extra))
    assert resp.status_code == 200, resp.text
    arn, token = resp.json()["containerInstanceArn"], resp.json()["token"]
    healthy = report(server, token, health=HEALTHY)
    assert healthy.status_code == 200, healthy.text
    return arn, token


def snapshot(task_arn: str, status: str, container_status: str | None = None, **extra) -> dict:
    """A task snapshot as an agent reports it (one container named 'app')."""
    implied = {"PROVISIONING": "PENDING", "PENDING": "PENDING", "ACTIVATING": "PENDING", "RUNNING": "RUNNING",
               "DEACTIVATING": "RUNNING", "STOPPING": "RUNNING"}.get(status, "STOPPED")
    container = {"name": "app", "lastStatus": container_status or implied}
    if container["lastStatus"] == "STOPPED":
        container["exitCode"] = 0
    return {"taskArn": task_arn, "lastStatus": status, "containers": [container], **extra}


def error(resp: httpx.Response, status: int, code: str) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["__type"] == code, body
    return body["message"]


# --- ECS side --------------------------------------------------------------------------------------

def make_cluster(ecs, unique) -> tuple[str, str]:
    name = unique("c")
    return name, ecs.create_cluster(clusterName=name)["cluster"]["clusterArn"]


def family(ecs, unique, **container) -> str:
    name = unique("f")
    ecs.register_task_definition(family=name, containerDefinitions=[
        {"name": "app", "image": "busybox", "memory": 128, **container}])
    return name


def describe_task(ecs, cluster: str, arn: str) -> dict:
    return ecs.describe_tasks(cluster=cluster, tasks=[arn])["tasks"][0]


def describe_host(ecs, cluster: str, arn: str, health: bool = False) -> dict:
    extra = {"include": ["CONTAINER_INSTANCE_HEALTH"]} if health else {}
    return ecs.describe_container_instances(cluster=cluster, containerInstances=[arn], **extra)[
        "containerInstances"][0]


def start_on(ecs, cluster: str, td: str, host_arn: str) -> dict:
    task = ecs.start_task(cluster=cluster, taskDefinition=td, containerInstances=[host_arn])["tasks"][0]
    assert task["containerInstanceArn"] == host_arn
    return task


# --- the event log -----------------------------------------------------------------------------------

def cursor(server) -> str | None:
    """Where the event log ends now."""
    position = None
    while True:
        page = server.events_page(position)
        if not page["events"]:
            return position
        position = page["cursor"]


def events_since(server, position: str | None, *, cluster_arn: str | None = None, resource: str | None = None,
                 kind: str | None = None) -> list[dict]:
    return [e for e in server.events(position)
            if (cluster_arn is None or e["detail"].get("clusterArn") == cluster_arn)
            and (resource is None or e["resources"] == [resource])
            and (kind is None or e["detail-type"] == kind)]


# --- join token --------------------------------------------------------------------------------------

def test_a_bad_join_token_is_refused_and_creates_nothing(server, ecs, unique):
    cluster, cluster_arn = make_cluster(ecs, unique)
    position = cursor(server)
    body = register_body(cluster)
    assert "join token" in error(register_raw(server, body, token="not-the-join-token"), 403,
                                 "AccessDeniedException")
    assert error(register_raw(server, body, token=join_token(server)[:-1]), 403, "AccessDeniedException")
    # No credentials at all, or another scheme.
    no_auth = httpx.post(server.endpoint + "/v1/agent/register", json=body, timeout=10)
    error(no_auth, 403, "UnrecognizedClientException")
    basic = httpx.post(server.endpoint + "/v1/agent/register", json=body, timeout=10,
                       headers={"Authorization": f"Basic {join_token(server)}"})
    error(basic, 403, "UnrecognizedClientException")
    # A host's own credential is not a join token.
    host_arn, host_token = register_host(server, cluster)
    ecs_hosts_before = ecs.list_container_instances(cluster=cluster)["containerInstanceArns"]
    # Past the host's own events (on PostgreSQL the log shows a commit once no older
    # transaction is in flight: its ACTIVE change is the last of them).
    wait_for(lambda: any(e["detail"].get("status") == "ACTIVE" for e in events_since(
        server, position, resource=host_arn, kind=INSTANCE_CHANGE)), timeout=10, message="the host's events")
    after_host = cursor(server)
    error(register_raw(server, body, token=host_token), 403, "AccessDeniedException")

    assert ecs.list_container_instances(cluster=cluster)["containerInstanceArns"] == ecs_hosts_before
    assert len(ecs_hosts_before) == 1
    assert events_since(server, after_host, cluster_arn=cluster_arn) == []
    # Only the one host registered properly left events behind.
    assert {e["resources"][0] for e in events_since(server, position, cluster_arn=cluster_arn)} == set(
        ecs_hosts_before)


# --- registration input --------------------------------------------------------------------------------

@pytest.mark.parametrize("change, field", [
    ({"hostId": None}, "hostId"),
    ({"hostId": ""}, "hostId"),
    ({"hostId": "has space"}, "hostId"),
    ({"hostId": "x" * 65}, "hostId"),
    ({"hostId": 42}, "hostId"),
    ({"resources": {"cpu": -1, "memory": 1024}}, "resources.cpu"),
    ({"resources": {"cpu": "4096", "memory": 1024}}, "resources.cpu"),
    ({"resources": {"cpu": 1.5, "memory": 1024}}, "resources.cpu"),
    ({"resources": {"cpu": True, "memory": 1024}}, "resources.cpu"),
    ({"resources": {"memory": 1024}}, "resources.cpu"),
    ({"resources": {"cpu": 1024, "memory": -5}}, "resources.memory"),
    ({"resources": {"cpu": 1024, "memory": 1024, "ports": [0]}}, "resources.ports"),
    ({"resources": {"cpu": 1024, "memory": 1024, "ports": [70000]}}, "resources.ports"),
    ({"resources": {"cpu": 1024, "memory": 1024, "udpPorts": ["53"]}}, "resources.udpPorts"),
    ({"gpus": [{"memoryMiB": 1024}]}, "gpus[0].uuid"),
    ({"gpus": [{"uuid": 7, "memoryMiB": 1024}]}, "gpus[0].uuid"),
    ({"gpus": ["GPU-1"]}, "gpus[0].uuid"),
    ({"gpus": [{"uuid": "GPU-1", "memoryMiB": 1024}, {"uuid": "GPU-2", "memoryMiB": -1}]}, "gpus[1].memoryMiB"),
    ({"attributes": [{"name": "ecs.instance-type", "value": "p5.48xlarge"}]}, "attributes[0].name"),
    ({"attributes": [{"name": "rack", "value": "r1"}, {"name": "ecs.os-type", "value": "windows"}]},
     "attributes[1].name"),
    ({"attributes": [{"value": "v"}]}, "attributes[0].name"),
    ({"attributes": [{"name": f"a{i}", "value": "v"} for i in range(11)]}, "attributes"),
    # Wrong shapes are refused by name too, not answered with a server error.
    ({"cluster": 123}, "cluster"),
    ({"resources": [4096, 16384]}, "resources"),
    ({"gpus": [{"uuid": "GPU-1", "memoryMiB": 1024}, {"uuid": "GPU-1", "memoryMiB": 1024}]}, "gpus"),
])
def test_register_names_the_bad_field_and_writes_nothing(server, ecs, unique, change, field):
    cluster, cluster_arn = make_cluster(ecs, unique)
    position = cursor(server)
    message = error(register_raw(server, {**register_body(cluster), **change}), 400, "InvalidParameterException")
    assert f"'{field}'" in message, message
    assert ecs.list_container_instances(cluster=cluster)["containerInstanceArns"] == []
    assert events_since(server, position, cluster_arn=cluster_arn) == []


def test_register_in_an_unknown_cluster_or_with_a_provider_the_cluster_lacks(server, ecs, unique):
    cluster, cluster_arn = make_cluster(ecs, unique)
    position = cursor(server)
    error(register_raw(server, register_body(unique("missing"))), 400, "ClusterNotFoundException")

    provider = unique("cp")
    ecs.create_capacity_provider(name=provider, autoScalingGroupProvider={
        "autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:x"})
    for name in (provider, unique("nope")):  # exists but not in the cluster; does not exist
        message = error(register_raw(server, register_body(cluster, capacity_provider=name)), 400,
                        "InvalidParameterException")
        assert "'capacityProvider'" in message and name in message
    assert ecs.list_container_instances(cluster=cluster)["containerInstanceArns"] == []
    assert events_since(server, position, cluster_arn=cluster_arn) == []

    # Once the cluster has the provider, the host joins it.
    ecs.put_cluster_capacity_providers(cluster=cluster, capacityProviders=[provider],
                                       defaultCapacityProviderStrategy=[])
    arn, _ = register_host(server, cluster, capacity_provider=provider)
    assert describe_host(ecs, cluster, arn)["capacityProviderName"] == provider


# --- REGISTERING → ACTIVE -----------------------------------------------------------------------------

def test_a_host_becomes_active_on_its_first_healthy_report(server, ecs, unique):
    cluster, cluster_arn = make_cluster(ecs, unique)
    position = cursor(server)
    body = register_body(cluster, gpus=1, instance_type="g5.xlarge",
                         attributes=[{"name": "rack", "value": "r7"},
                                     {"name": "ecs.capability.gpu-sharing-mps"}])
    resp = register_raw(server, body)
    assert resp.status_code == 200, resp.text
    arn, token = resp.json()["containerInstanceArn"], resp.json()["token"]
    assert resp.json()["cluster"] == cluster and token

    host = describe_host(ecs, cluster, arn, health=True)
    assert host["status"] == "REGISTERING" and host["agentConnected"] is True
    assert host["ec2InstanceId"] == body["hostId"]
    assert host["healthStatus"]["overallStatus"] == "INITIALIZING"
    attributes = {a["name"]: a.get("value") for a in host["attributes"]}
    assert attributes["ecs.instance-type"] == "g5.xlarge" and attributes["rack"] == "r7"
    assert "ecs.capability.gpu-sharing-mps" in attributes
    registered = {r["name"]: r for r in host["registeredResources"]}
    assert registered["CPU"]["integerValue"] == 4096 and registered["MEMORY"]["integerValue"] == 16384
    assert registered["GPU"]["stringSetValue"] == [body["gpus"][0]["uuid"]]
    assert host["gpuDevices"] == [{"gpuId": body["gpus"][0]["uuid"], "sharingMode": "IDLE", "containerCount": 0,
                                   "totalMemoryInMiB": GPU_MEMORY, "remainingMemoryInMiB": GPU_MEMORY}]

    # Placement does not use a REGISTERING host.
    td = family(ecs, unique)
    task = ecs.run_task(cluster=cluster, taskDefinition=td)["tasks"][0]
    assert "containerInstanceArn" not in task

    # A report that is not healthy yet keeps it REGISTERING.
    assert report(server, token, health={"CONTAINER_RUNTIME": {"status": "INITIALIZING"}}).status_code == 200
    assert describe_host(ecs, cluster, arn)["status"] == "REGISTERING"
    assert report(server, token, health=HEALTHY).status_code == 200
    host = describe_host(ecs, cluster, arn, health=True)
    assert host["status"] == "ACTIVE" and host["version"] > 1
    assert next(d for d in host["healthStatus"]["details"] if d["type"] == "CONTAINER_RUNTIME")["status"] == "OK"
    # Another healthy report changes nothing.
    assert report(server, token, health=HEALTHY).status_code == 200
    assert describe_host(ecs, cluster, arn)["version"] == host["version"]

    def instance_changes():
        found = events_since(server, position, resource=arn, kind=INSTANCE_CHANGE)
        return found if any(e["detail"]["status"] == "ACTIVE" for e in found) else None
    changes = wait_for(instance_changes, timeout=5, message="the ACTIVE event")
    assert [e["detail"]["status"] for e in changes] == ["REGISTERING", "ACTIVE"]
    assert all(e["detail"]["clusterArn"] == cluster_arn for e in changes)
    # The task that waited for a host is placed on it once it is ACTIVE.
    placed = wait_for(lambda: describe_task(ecs, cluster, task["taskArn"]).get("containerInstanceArn"), timeout=5,
                      message="the waiting task to be placed")
    assert placed == arn


# --- a host's credential reaches its own tasks only ------------------------------------------------------

def test_one_hosts_credential_is_refused_on_another_hosts_tasks(server, ecs, unique):
    cluster, _ = make_cluster(ecs, unique)
    a_arn, a_token = register_host(server, cluster)
    b_arn, b_token = register_host(server, cluster)
    td = family(ecs, unique)
    task = start_on(ecs, cluster, td, a_arn)
    arn = task["taskArn"]
    before = describe_task(ecs, cluster, arn)
    position = cursor(server)

    message = error(report(server, b_token, [snapshot(arn, "RUNNING")]), 403, "AccessDeniedException")
    assert arn in message
    # Not even wrapped in a healthy report, and not through an update B is allowed to make.
    b_task = start_on(ecs, cluster, td, b_arn)
    error(report(server, b_token, [snapshot(b_task["taskArn"], "RUNNING"), snapshot(arn, "STOPPED")],
                 health=HEALTHY), 403, "AccessDeniedException")
    assert describe_task(ecs, cluster, arn) == before
    assert describe_task(ecs, cluster, b_task["taskArn"])["lastStatus"] == "PENDING"
    assert events_since(server, position, resource=arn) == []

    b_poll = poll(server, b_token)
    assert b_poll.status_code == 200, b_poll.text
    assert [t["taskArn"] for t in b_poll.json()["tasks"]] == [b_task["taskArn"]]
    a_poll = poll(server, a_token).json()
    assert [t["taskArn"] for t in a_poll["tasks"]] == [arn]
    desired = a_poll["tasks"][0]
    assert desired["desiredStatus"] == "RUNNING" and desired["lastStatus"] == "PENDING"
    assert desired["family"] == td and desired["containerDefinitions"][0]["name"] == "app"
    assert desired["containers"][0]["containerArn"] == task["containers"][0]["containerArn"]

    # An unknown credential reaches nothing at all.
    error(poll(server, "not-a-host-token"), 403, "AccessDeniedException")
    error(report(server, "not-a-host-token", [snapshot(arn, "RUNNING")]), 403, "AccessDeniedException")
    error(report(server, join_token(server), [snapshot(arn, "RUNNING")]), 403, "AccessDeniedException")

    resp = report(server, a_token, [snapshot(arn, "RUNNING", startedAt=time.time())])
    assert resp.status_code == 200, resp.text
    assert resp.json()["tasks"] == [{"taskArn": arn, "lastStatus": "RUNNING", "desiredStatus": "RUNNING",
                                     "version": before["version"] + 1}]
    after = describe_task(ecs, cluster, arn)
    assert after["lastStatus"] == "RUNNING" and after["version"] == before["version"] + 1
    assert after["containers"][0]["lastStatus"] == "RUNNING" and "startedAt" in after
    changes = wait_for(lambda: events_since(server, position, resource=arn), timeout=5, message="the task event")
    assert [(e["detail-type"], e["detail"]["lastStatus"], e["detail"]["version"]) for e in changes] == [
        (TASK_CHANGE, "RUNNING", before["version"] + 1)]


# --- reports: all or nothing, never backwards -------------------------------------------------------------

def test_a_bad_report_is_refused_whole(server, ecs, unique):
    cluster, cluster_arn = make_cluster(ecs, unique)
    host_arn, token = register_host(server, cluster)
    td = family(ecs, unique)
    good, bad = (start_on(ecs, cluster, td, host_arn) for _ in range(2))
    health_before = describe_host(ecs, cluster, host_arn, health=True)
    position = cursor(server)

    impaired = {"CONTAINER_RUNTIME": {"status": "IMPAIRED", "reason": "runtime down"}}
    message = error(report(server, token, [snapshot(good["taskArn"], "RUNNING"),
                                           snapshot(bad["taskArn"], "EXPLODED")], health=impaired),
                    400, "InvalidParameterException")
    assert "lastStatus" in message and "EXPLODED" in message
    # A bad health check after good snapshots: nothing either.
    message = error(report(server, token, [snapshot(good["taskArn"], "RUNNING")],
                           health={"GPU_MELTDOWN": {"status": "OK"}}), 400, "InvalidParameterException")
    assert "health.GPU_MELTDOWN" in message
    error(report(server, token, [snapshot(good["taskArn"], "RUNNING")],
                 health={"CONTAINER_RUNTIME": {"status": "FINE"}}), 400, "InvalidParameterException")
    error(call(server, "POST", "/v1/agent/report", token, json={"updates": {"taskArn": good["taskArn"]}}), 400,
          "InvalidParameterException")
    error(call(server, "POST", "/v1/agent/report", token, json={"updates": ["RUNNING"]}), 400,
          "InvalidParameterException")
    error(call(server, "POST", "/v1/agent/report", token, content=b"{not json"), 400, "SerializationException")

    for task in (good, bad):
        now = describe_task(ecs, cluster, task["taskArn"])
        assert (now["lastStatus"], now["version"]) == ("PENDING", task["version"])
        assert now["containers"][0]["lastStatus"] == "PENDING"
    assert describe_host(ecs, cluster, host_arn, health=True) == health_before
    assert events_since(server, position, cluster_arn=cluster_arn) == []

    resp = report(server, token, [snapshot(good["taskArn"], "RUNNING"), snapshot(bad["taskArn"], "RUNNING")])
    assert resp.status_code == 200, resp.text
    assert [t["lastStatus"] for t in resp.json()["tasks"]] == ["RUNNING", "RUNNING"]


@pytest.mark.parametrize("container", [
    {"name": "app", "lastStatus": "EXPLODED"},
    {"name": ["app"], "lastStatus": "RUNNING"},
    None,
])
def test_bad_container_snapshots_are_refused_not_a_server_error(server, ecs, unique, container):
    cluster, _ = make_cluster(ecs, unique)
    host_arn, token = register_host(server, cluster)
    task = start_on(ecs, cluster, family(ecs, unique), host_arn)
    update = {"taskArn": task["taskArn"], "lastStatus": "RUNNING",
              "containers": None if container is None else [container]}
    resp = report(server, token, [update])
    error(resp, 400, "InvalidParameterException")
    assert "containers" in resp.json()["message"]
    assert describe_task(ecs, cluster, task["taskArn"])["version"] == task["version"]


def test_reports_never_move_a_task_backwards(server, ecs, unique):
    cluster, _ = make_cluster(ecs, unique)
    host_arn, token = register_host(server, cluster)
    task = start_on(ecs, cluster, family(ecs, unique), host_arn)
    arn = task["taskArn"]
    assert report(server, token, [snapshot(arn, "RUNNING")]).status_code == 200
    running = describe_task(ecs, cluster, arn)
    assert running["lastStatus"] == "RUNNING" and running["version"] == task["version"] + 1
    position = cursor(server)

    for stale in (snapshot(arn, "PENDING"), snapshot(arn, "ACTIVATING"), snapshot(arn, "PROVISIONING"),
                  snapshot(arn, "RUNNING", container_status="PENDING")):
        resp = report(server, token, [stale])
        assert resp.status_code == 200, resp.text
        assert resp.json()["tasks"][0]["lastStatus"] == "RUNNING"
    now = describe_task(ecs, cluster, arn)
    assert (now["lastStatus"], now["version"]) == ("RUNNING", running["version"])
    assert now["containers"][0]["lastStatus"] == "RUNNING"
    assert events_since(server, position, resource=arn) == []

    # Forwards still works; once STOPPED, a task stays STOPPED.
    assert report(server, token, [snapshot(arn, "STOPPED")]).status_code == 200
    stopped = describe_task(ecs, cluster, arn)
    assert stopped["lastStatus"] == "STOPPED" and stopped["desiredStatus"] == "STOPPED"
    assert stopped["containers"][0]["lastStatus"] == "STOPPED" and stopped["containers"][0]["exitCode"] == 0
    assert report(server, token, [snapshot(arn, "RUNNING")]).json()["tasks"][0]["lastStatus"] == "STOPPED"
    assert describe_task(ecs, cluster, arn)["version"] == stopped["version"]


def test_one_report_of_several_tasks_counts_each_snapshot_in_order(server, ecs, unique):
    """A report is applied as its snapshots one by one: each state change of a task moves its
    version and makes one event, in the report's order; a health-only change makes none."""
    cluster, _ = make_cluster(ecs, unique)
    host_arn, token = register_host(server, cluster)
    td = family(ecs, unique)
    a, b, c = (start_on(ecs, cluster, td, host_arn) for _ in range(3))
    position = cursor(server)
    resp = report(server, token, [snapshot(a["taskArn"], "ACTIVATING"), snapshot(b["taskArn"], "RUNNING"),
                                  snapshot(a["taskArn"], "RUNNING"), snapshot(a["taskArn"], "RUNNING"),
                                  snapshot(c["taskArn"], "PENDING", healthStatus="HEALTHY")])
    assert resp.status_code == 200, resp.text
    states = {t["taskArn"]: (t["lastStatus"], t["version"]) for t in resp.json()["tasks"]}
    assert states == {a["taskArn"]: ("RUNNING", a["version"] + 2), b["taskArn"]: ("RUNNING", b["version"] + 1),
                      c["taskArn"]: ("PENDING", c["version"])}
    changes = [(e["resources"][0], e["detail"]["lastStatus"], e["detail"]["version"])
               for e in events_since(server, position, kind=TASK_CHANGE)]
    assert changes == [(a["taskArn"], "ACTIVATING", a["version"] + 1), (b["taskArn"], "RUNNING", b["version"] + 1),
                       (a["taskArn"], "RUNNING", a["version"] + 2)]
    for task, (status, version) in ((a, states[a["taskArn"]]), (b, states[b["taskArn"]])):
        now = describe_task(ecs, cluster, task["taskArn"])
        assert (now["lastStatus"], now["version"], now["containers"][0]["lastStatus"]) == (status, version, "RUNNING")
    assert describe_task(ecs, cluster, c["taskArn"])["healthStatus"] == "HEALTHY"


# --- long-poll ---------------------------------------------------------------------------------------------

class PendingPoll:
    """A long-poll on a thread; remembers when its answer arrived."""

    def __init__(self, server, token: str, since: str, wait: float):
        self.response: httpx.Response | None = None
        self.returned_at: float | None = None
        self.thread = threading.Thread(target=self._run, args=(server, token, since, wait), daemon=True)
        self.thread.start()
        time.sleep(0.3)  # let it reach the server and wait there
        assert self.response is None, "the poll returned before anything changed"

    def _run(self, server, token, since, wait):
        self.response = poll(server, token, since=since, wait=wait)
        self.returned_at = time.monotonic()

    def result(self, timeout: float = 15) -> dict:
        self.thread.join(timeout)
        assert self.response is not None, "the poll did not return"
        assert self.response.status_code == 200, self.response.text
        return self.response.json()


def test_a_server_shutting_down_answers_the_long_polls_waiting_on_it(tmp_path, unique):
    """SIGTERM: a waiting long-poll gets its answer (the host's current state), rather than
    waiting out the grace period and having its connection cut; nothing is logged as an error."""
    server = ServerProcess(tmp_path / "data").start()
    try:
        cluster, _ = make_cluster(server.client("ecs"), unique)
        _, token = register_host(server, cluster)
        first = poll(server, token).json()
        waiting = PendingPoll(server, token, first["version"], wait=60)
        server.proc.terminate()
        answer = waiting.result()
        assert answer["version"] == first["version"] and answer["status"] == "ACTIVE"
        assert server.proc.wait(15) == 0
    finally:
        server.stop()
    log = Path(server.log.name).read_text()
    assert "Exception in ASGI application" not in log and "graceful shutdown exceeded" not in log, log[-3000:]


def test_long_poll_wakes_on_a_change(server, ecs, unique):
    cluster, _ = make_cluster(ecs, unique)
    host_arn, token = register_host(server, cluster)
    first = poll(server, token).json()
    assert first["status"] == "ACTIVE" and first["tasks"] == []

    # Nothing changes: the poll waits its time and returns the same version.
    started = time.monotonic()
    idle = poll(server, token, since=first["version"], wait=0.5).json()
    assert 0.4 <= time.monotonic() - started < 5
    assert idle["version"] == first["version"] and idle["tasks"] == []

    td = family(ecs, unique)
    waiting = PendingPoll(server, token, first["version"], wait=10)
    changed_at = time.monotonic()
    task = ecs.run_task(cluster=cluster, taskDefinition=td)["tasks"][0]
    assert task["containerInstanceArn"] == host_arn
    woken = waiting.result()
    assert waiting.returned_at - changed_at < 1.0
    assert woken["version"] != first["version"]
    assert [(t["taskArn"], t["desiredStatus"]) for t in woken["tasks"]] == [(task["taskArn"], "RUNNING")]

    waiting = PendingPoll(server, token, woken["version"], wait=10)
    changed_at = time.monotonic()
    ecs.stop_task(cluster=cluster, task=task["taskArn"], reason="enough")
    stopped = waiting.result()
    assert waiting.returned_at - changed_at < 1.0
    assert stopped["version"] != woken["version"]
    [desired] = stopped["tasks"]
    assert (desired["taskArn"], desired["desiredStatus"], desired["stoppedReason"]) == (
        task["taskArn"], "STOPPED", "enough")
    # The stop waits for the agent: the task has not stopped yet.
    assert describe_task(ecs, cluster, task["taskArn"])["lastStatus"] == "PENDING"

    # Once it has stopped, the host's desired state no longer lists it.
    assert report(server, token, [snapshot(task["taskArn"], "STOPPED")]).status_code == 200
    assert poll(server, token).json()["tasks"] == []


def test_bad_poll_parameters(server, ecs, unique):
    cluster, _ = make_cluster(ecs, unique)
    _, token = register_host(server, cluster)
    message = error(call(server, "GET", "/v1/agent/poll", token, params={"wait": "soon"}), 400,
                    "InvalidParameterException")
    assert "'wait'" in message
    error(call(server, "GET", "/v1/agent/poll", None), 403, "UnrecognizedClientException")
    # A version from elsewhere (an earlier server run) returns at once with the current state.
    started = time.monotonic()
    assert poll(server, token, since="feedface.12", wait=10).status_code == 200
    assert time.monotonic() - started < 2
    message = error(call(server, "GET", "/v1/agent/poll", token, params={"cursor": "-1"}), 400,
                    "InvalidParameterException")
    assert "'cursor'" in message


def test_a_wrong_method_is_refused_with_the_allowed_one_and_an_unknown_path_is_not_found(server):
    for method, path, allowed in (("POST", "poll", "GET"), ("GET", "report", "POST"), ("GET", "register", "POST")):
        r = call(server, method, f"/v1/agent/{path}", None)
        assert (r.status_code, r.headers.get("allow")) == (405, allowed)
    r = call(server, "GET", "/v1/agent/nothing", None)
    assert (r.status_code, r.headers.get("allow")) == (404, None)


def test_a_poll_with_a_cursor_gets_only_what_changed_since(server, ecs, unique):
    cluster, _ = make_cluster(ecs, unique)
    host_arn, token = register_host(server, cluster)
    td = family(ecs, unique)
    first, second = (start_on(ecs, cluster, td, host_arn)["taskArn"] for _ in range(2))

    full = poll(server, token).json()
    assert full["full"] is True and {t["taskArn"] for t in full["tasks"]} == {first, second}

    third = start_on(ecs, cluster, td, host_arn)["taskArn"]
    ecs.stop_task(cluster=cluster, task=first, reason="enough")
    changes = poll(server, token, cursor=full["cursor"]).json()
    assert changes["full"] is False and changes["cursor"] > full["cursor"]
    assert {(t["taskArn"], t["desiredStatus"]) for t in changes["tasks"]} == {(third, "RUNNING"), (first, "STOPPED")}

    # Reports change what the task is, not what it should be: nothing new for the agent.
    assert report(server, token, [snapshot(second, "RUNNING")]).status_code == 200
    assert poll(server, token, cursor=changes["cursor"]).json()["tasks"] == []
    # A cursor the server never gave (a database recreated under the agent) gets everything.
    again = poll(server, token, cursor=changes["cursor"] + 1000).json()
    assert again["full"] is True and {t["taskArn"] for t in again["tasks"]} == {first, second, third}


# --- deregistration ------------------------------------------------------------------------------------------

def test_a_deregistered_hosts_credential_is_refused(server, ecs, unique):
    cluster, _ = make_cluster(ecs, unique)
    host_arn, token = register_host(server, cluster)
    current = poll(server, token).json()

    waiting = PendingPoll(server, token, current["version"], wait=10)
    changed_at = time.monotonic()
    ecs.deregister_container_instance(cluster=cluster, containerInstance=host_arn)
    told = waiting.result()
    assert waiting.returned_at - changed_at < 1.0
    assert told["status"] == "INACTIVE"

    error(poll(server, token), 403, "AccessDeniedException")
    error(report(server, token, health=HEALTHY), 403, "AccessDeniedException")
    host = describe_host(ecs, cluster, host_arn)
    assert host["status"] == "INACTIVE" and host["agentConnected"] is False
    assert ecs.list_container_instances(cluster=cluster)["containerInstanceArns"] == []
