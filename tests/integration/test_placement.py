"""Placement through the ECS API on hosts that joined through the agent protocol: CPU, memory,
ports, whole GPUs and MPS shares, constraints, capacity providers, and what a stop gives back.

Hosts are registered over the protocol by the tests (no agent process), and the tests report
for them. One server per module and backend; each test has its own cluster.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.support import wait_for

HEALTHY = {"CONTAINER_RUNTIME": {"status": "OK"}}
GPU_MEMORY = 24576
MPS_ATTRIBUTE = "ecs.capability.gpu-sharing-mps"
PENDING_REASON = "shoal:pending-reason"
TASK_CHANGE = "ECS Task State Change"
PLACED_WITHIN = 2.0


# --- hosts over the agent protocol -------------------------------------------------------------------

def call(server, method: str, path: str, token: str, **kwargs) -> httpx.Response:
    return httpx.request(method, server.endpoint + path, headers={"Authorization": f"Bearer {token}"},
                         timeout=30, **kwargs)


def register_host(server, cluster: str, *, gpus: int = 0, cpu: int = 4096, memory: int = 16384,
                  capacity_provider: str | None = None, ports: list[int] | None = None,
                  instance_type: str | None = None, mps: bool = False, gpu_memory: int = GPU_MEMORY,
                  attributes: list[dict] | None = None, zone: str | None = None) -> tuple[str, str]:
    """Register a host and send its first healthy report, so that it is ACTIVE with its agent
    connected. Returns (container instance ARN, host token)."""
    join = (server.data_dir / "join-token").read_text().strip()
    attributes = [*(attributes or []), *([{"name": MPS_ATTRIBUTE}] if mps else [])]
    body = {"cluster": cluster, "hostId": f"h-{uuid.uuid4().hex[:10]}", "architecture": "x86_64",
            "resources": {"cpu": cpu, "memory": memory, "ports": ports if ports is not None else [22],
                          "udpPorts": []},
            "gpus": [{"uuid": f"GPU-{uuid.uuid4()}", "model": "Fake A10G", "memoryMiB": gpu_memory}
                     for _ in range(gpus)],
            "attributes": attributes, "versionInfo": {"agentVersion": "test"}}
    if capacity_provider:
        body["capacityProvider"] = capacity_provider
    if instance_type:
        body["instanceType"] = instance_type
    if zone:
        body["availabilityZone"] = zone
    resp = call(server, "POST", "/v1/agent/register", join, json=body)
    assert resp.status_code == 200, resp.text
    arn, token = resp.json()["containerInstanceArn"], resp.json()["token"]
    healthy = report(server, token, health=HEALTHY)
    assert healthy.status_code == 200, healthy.text
    return arn, token


def report(server, token: str, updates: list[dict] | None = None, health: dict | None = None) -> httpx.Response:
    return call(server, "POST", "/v1/agent/report", token,
                json={"updates": updates or [], **({"health": health} if health else {})})


def report_stopped(server, token: str, task: dict) -> None:
    resp = report(server, token, [{"taskArn": task["taskArn"], "lastStatus": "STOPPED", "containers": [
        {"name": c["name"], "lastStatus": "STOPPED", "exitCode": 0} for c in task["containers"]]}])
    assert resp.status_code == 200, resp.text
    assert resp.json()["tasks"][0]["lastStatus"] == "STOPPED"


def poll(server, token: str) -> dict:
    resp = call(server, "GET", "/v1/agent/poll", token, params={"wait": 0})
    assert resp.status_code == 200, resp.text
    return resp.json()


# --- ECS side ----------------------------------------------------------------------------------------

def make_cluster(ecs, unique) -> str:
    name = unique("c")
    ecs.create_cluster(clusterName=name)
    return name


def self_managed_provider(ecs, cluster: str, unique) -> str:
    """A self-managed capacity provider of the cluster, not in its default strategy."""
    provider = unique("cp")
    ecs.create_capacity_provider(name=provider, autoScalingGroupProvider={
        "autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:x"})
    ecs.put_cluster_capacity_providers(cluster=cluster, capacityProviders=[provider],
                                       defaultCapacityProviderStrategy=[])
    return provider


def family(ecs, unique, *containers: dict, **task_level) -> str:
    name = unique("f")
    ecs.register_task_definition(family=name, containerDefinitions=list(containers or [
        {"name": "app", "image": "busybox", "memory": 128}]), **task_level)
    return name


def app(**fields) -> dict:
    return {"name": "app", "image": "busybox", "memory": 128, **fields}


def whole_gpus(n: str = "1") -> dict:
    return app(resourceRequirements=[{"type": "GPU", "value": n}])


def mps_share(memory: int) -> dict:
    return app(resourceRequirements=[{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": memory}}}])


def run(ecs, cluster: str, td: str, **extra) -> dict:
    resp = ecs.run_task(cluster=cluster, taskDefinition=td, **extra)
    assert resp["failures"] == []
    return resp["tasks"][0]


def describe_task(ecs, cluster: str, arn: str) -> dict:
    return ecs.describe_tasks(cluster=cluster, tasks=[arn])["tasks"][0]


def describe_host(ecs, cluster: str, arn: str) -> dict:
    return ecs.describe_container_instances(cluster=cluster, containerInstances=[arn])["containerInstances"][0]


def pending_reason(task: dict) -> str | None:
    return next((a.get("value") for a in task.get("attributes", []) if a["name"] == PENDING_REASON), None)


def assert_waiting(task: dict, reason: str) -> None:
    assert "containerInstanceArn" not in task, task
    assert task["lastStatus"] in ("PROVISIONING", "PENDING") and task["desiredStatus"] == "RUNNING"
    assert pending_reason(task) == reason, task.get("attributes")


def placed_on(ecs, cluster: str, arn: str, timeout: float = PLACED_WITHIN) -> dict:
    """The task once the control loop has placed it (within `timeout` seconds)."""
    def placed():
        task = describe_task(ecs, cluster, arn)
        return task if task.get("containerInstanceArn") else None
    return wait_for(placed, timeout=timeout, interval=0.05, message=f"task {arn} to be placed")


def resources(resource_list: list[dict]) -> dict:
    return {r["name"]: r.get("integerValue", r.get("stringSetValue")) for r in resource_list}


def gpu_devices(host: dict) -> dict[str, dict]:
    return {d["gpuId"]: d for d in host["gpuDevices"]}


def cursor(server) -> str | None:
    position = None
    while True:
        page = server.events_page(position)
        if not page["events"]:
            return position
        position = page["cursor"]


def task_events(server, position: str | None, arn: str) -> list[dict]:
    return [e for e in server.events(position) if e["resources"] == [arn] and e["detail-type"] == TASK_CHANGE]


# --- CPU and memory ------------------------------------------------------------------------------------

def test_a_task_bigger_than_any_host_waits_until_a_host_big_enough_joins(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    small, _ = register_host(server, cluster, cpu=2048, memory=1024)
    big_memory = run(ecs, cluster, family(ecs, unique, app(memory=4096)))
    big_cpu = run(ecs, cluster, family(ecs, unique, app(cpu=8192)))
    assert_waiting(big_memory, "RESOURCE:MEMORY")
    assert_waiting(big_cpu, "RESOURCE:CPU")
    described = describe_task(ecs, cluster, big_memory["taskArn"])
    assert described == {k: v for k, v in big_memory.items() if k != "tags"}  # tags: only when asked for
    assert resources(describe_host(ecs, cluster, small)["remainingResources"])["MEMORY"] == 1024
    position = cursor(server)

    joined_at = time.monotonic()
    big, _ = register_host(server, cluster, cpu=16384, memory=8192)
    for task in (big_memory, big_cpu):
        now = placed_on(ecs, cluster, task["taskArn"])
        assert time.monotonic() - joined_at < PLACED_WITHIN + 0.5
        assert now["containerInstanceArn"] == big and now["lastStatus"] == "PENDING"
        assert pending_reason(now) is None and now["version"] == task["version"] + 1
        [event] = wait_for(lambda: task_events(server, position, task["taskArn"]), timeout=5,
                           message="the placement event")
        assert event["detail"]["containerInstanceArn"] == big and event["detail"]["version"] == now["version"]
    left = resources(describe_host(ecs, cluster, big)["remainingResources"])
    assert (left["CPU"], left["MEMORY"]) == (16384 - 8192, 8192 - 4096 - 128)
    assert resources(describe_host(ecs, cluster, small)["remainingResources"])["MEMORY"] == 1024


def test_task_level_cpu_and_memory_are_what_is_reserved(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    host, _ = register_host(server, cluster, cpu=4096, memory=4096)
    task = run(ecs, cluster, family(ecs, unique, app(cpu=128, memory=256), cpu="1 vCPU", memory="2 GB"))
    assert task["containerInstanceArn"] == host
    left = resources(describe_host(ecs, cluster, host)["remainingResources"])
    assert (left["CPU"], left["MEMORY"]) == (4096 - 1024, 4096 - 2048)
    assert_waiting(run(ecs, cluster, family(ecs, unique, app(), memory="3 GB")), "RESOURCE:MEMORY")
    # RunTask's task-level overrides take the task definition's units and reserve what they say.
    overridden = run(ecs, cluster, family(ecs, unique), overrides={"cpu": "1 vCPU", "memory": "3 GB"})
    assert (overridden["cpu"], overridden["memory"]) == ("1024", "3072")
    assert_waiting(overridden, "RESOURCE:MEMORY")
    fits = run(ecs, cluster, family(ecs, unique), overrides={"cpu": "2 vCPU", "memory": "1 GB"})
    assert fits["containerInstanceArn"] == host
    left = resources(describe_host(ecs, cluster, host)["remainingResources"])
    assert (left["CPU"], left["MEMORY"]) == (4096 - 1024 - 2048, 4096 - 2048 - 1024)


# --- ports -------------------------------------------------------------------------------------------------

def test_a_host_port_is_taken_once(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    host, _ = register_host(server, cluster, ports=[22])
    td = family(ecs, unique, app(portMappings=[{"containerPort": 80, "hostPort": 8080}]))
    first = run(ecs, cluster, td)
    assert first["containerInstanceArn"] == host
    assert_waiting(run(ecs, cluster, td), "RESOURCE:PORTS")
    # The host's own reserved ports are taken too; UDP ports are a separate set.
    assert_waiting(run(ecs, cluster, family(ecs, unique, app(portMappings=[{"containerPort": 22}]))),
                   "RESOURCE:PORTS")
    udp = run(ecs, cluster, family(ecs, unique, app(portMappings=[{"containerPort": 8080, "protocol": "udp"}])))
    assert udp["containerInstanceArn"] == host
    left = resources(describe_host(ecs, cluster, host)["remainingResources"])
    assert left["PORTS"] == ["22", "8080"] and left["PORTS_UDP"] == ["8080"]


# --- whole GPUs ----------------------------------------------------------------------------------------------

def test_whole_gpus_are_dedicated_to_one_task_each(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    host, token = register_host(server, cluster, gpus=2)
    uuids = resources(describe_host(ecs, cluster, host)["registeredResources"])["GPU"]
    td = family(ecs, unique, whole_gpus("1"))

    first = run(ecs, cluster, td)
    assert first["containerInstanceArn"] == host
    [gpu] = first["containers"][0]["gpuIds"]
    assert gpu in uuids
    assert describe_task(ecs, cluster, first["taskArn"])["containers"][0]["gpuIds"] == [gpu]
    described = describe_host(ecs, cluster, host)
    devices = gpu_devices(described)
    assert devices[gpu] == {"gpuId": gpu, "sharingMode": "DEDICATED", "containerCount": 1,
                            "totalMemoryInMiB": GPU_MEMORY, "remainingMemoryInMiB": 0}
    [other] = [u for u in uuids if u != gpu]
    assert (devices[other]["sharingMode"], devices[other]["containerCount"],
            devices[other]["remainingMemoryInMiB"]) == ("IDLE", 0, GPU_MEMORY)
    assert resources(described["remainingResources"])["GPU"] == [other]
    # The agent is told which GPU each container gets.
    [desired] = poll(server, token)["tasks"]
    assert desired["containers"][0]["gpuIds"] == [gpu]

    second = run(ecs, cluster, td)
    assert second["containers"][0]["gpuIds"] == [other]
    assert_waiting(run(ecs, cluster, td), "RESOURCE:GPU")
    assert {d["sharingMode"] for d in describe_host(ecs, cluster, host)["gpuDevices"]} == {"DEDICATED"}
    # A task without GPUs still fits beside them.
    assert run(ecs, cluster, family(ecs, unique))["containerInstanceArn"] == host


def test_all_gpus_takes_every_gpu(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    host, _ = register_host(server, cluster, gpus=2)
    td = family(ecs, unique, whole_gpus("ALL"))
    task = run(ecs, cluster, td)
    assert task["containerInstanceArn"] == host
    assert sorted(task["containers"][0]["gpuIds"]) == sorted(
        resources(describe_host(ecs, cluster, host)["registeredResources"])["GPU"])
    assert_waiting(run(ecs, cluster, family(ecs, unique, whole_gpus("1"))), "RESOURCE:GPU")


# --- MPS ---------------------------------------------------------------------------------------------------------

def test_mps_tasks_share_one_gpu_by_memory(server, ecs, unique):
    """ECS acceptance §6 item 8: a 24 GiB GPU, two tasks of 8192 MiB each."""
    cluster = make_cluster(ecs, unique)
    host, _ = register_host(server, cluster, gpus=1, mps=True)
    [gpu] = resources(describe_host(ecs, cluster, host)["registeredResources"])["GPU"]
    td = family(ecs, unique, mps_share(8192))
    assert ecs.describe_task_definition(taskDefinition=td)["taskDefinition"]["requiresAttributes"] == [
        {"name": MPS_ATTRIBUTE}]

    tasks = [run(ecs, cluster, td) for _ in range(2)]
    for task in tasks:
        assert task["containerInstanceArn"] == host
        assert task["containers"][0]["gpuIds"] == [gpu]
        assert task["containers"][0]["gpuSharingStrategy"] == {"nvidiaMps": {"memory": 8192}}
    assert gpu_devices(describe_host(ecs, cluster, host))[gpu] == {
        "gpuId": gpu, "sharingMode": "NVIDIA_MPS", "containerCount": 2, "totalMemoryInMiB": GPU_MEMORY,
        "remainingMemoryInMiB": 24576 - 16384}

    assert_waiting(run(ecs, cluster, family(ecs, unique, mps_share(12288))), "RESOURCE:GPU")
    assert_waiting(run(ecs, cluster, family(ecs, unique, whole_gpus("1"))), "RESOURCE:GPU")
    # What is left still fits exactly.
    last = run(ecs, cluster, family(ecs, unique, mps_share(8192)))
    assert last["containers"][0]["gpuIds"] == [gpu]
    device = gpu_devices(describe_host(ecs, cluster, host))[gpu]
    assert (device["containerCount"], device["remainingMemoryInMiB"]) == (3, 0)


def test_mps_and_whole_gpu_tasks_land_on_different_gpus(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    host, _ = register_host(server, cluster, gpus=2, mps=True)
    shared = run(ecs, cluster, family(ecs, unique, mps_share(4096)))
    whole = run(ecs, cluster, family(ecs, unique, whole_gpus("1")))
    [shared_gpu], [whole_gpu] = shared["containers"][0]["gpuIds"], whole["containers"][0]["gpuIds"]
    assert shared_gpu != whole_gpu
    devices = gpu_devices(describe_host(ecs, cluster, host))
    assert (devices[shared_gpu]["sharingMode"], devices[whole_gpu]["sharingMode"]) == ("NVIDIA_MPS", "DEDICATED")
    # A second share joins the shared GPU; a second whole GPU has nowhere to go.
    assert run(ecs, cluster, family(ecs, unique, mps_share(4096)))["containers"][0]["gpuIds"] == [shared_gpu]
    assert_waiting(run(ecs, cluster, family(ecs, unique, whole_gpus("1"))), "RESOURCE:GPU")


def test_mps_waits_for_a_gpu_that_a_whole_gpu_task_holds(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    host, token = register_host(server, cluster, gpus=1, mps=True)
    whole = run(ecs, cluster, family(ecs, unique, whole_gpus("1")))
    assert whole["containerInstanceArn"] == host
    shared = run(ecs, cluster, family(ecs, unique, mps_share(1024)))
    assert_waiting(shared, "RESOURCE:GPU")
    # Once the whole-GPU task has stopped, the share gets the GPU.
    ecs.stop_task(cluster=cluster, task=whole["taskArn"])
    report_stopped(server, token, whole)
    now = placed_on(ecs, cluster, shared["taskArn"])
    assert now["containerInstanceArn"] == host and now["containers"][0]["gpuIds"] == whole["containers"][0]["gpuIds"]


def test_a_host_without_the_mps_capability_never_gets_an_mps_task(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    plain, _ = register_host(server, cluster, gpus=1)
    td = family(ecs, unique, mps_share(1024))
    task = run(ecs, cluster, td)
    assert "containerInstanceArn" not in task
    reason = pending_reason(task)
    assert "ATTRIBUTE" in reason.upper() and MPS_ATTRIBUTE in reason, reason
    with pytest.raises(ClientError) as err:  # not even when named
        ecs.start_task(cluster=cluster, taskDefinition=td, containerInstances=[plain])
    assert err.value.response["Error"]["Code"] == "InvalidParameterException"
    assert gpu_devices(describe_host(ecs, cluster, plain))[
        resources(describe_host(ecs, cluster, plain)["registeredResources"])["GPU"][0]]["sharingMode"] == "IDLE"

    capable, _ = register_host(server, cluster, gpus=1, mps=True)
    assert placed_on(ecs, cluster, task["taskArn"])["containerInstanceArn"] == capable


# --- stopping gives resources back --------------------------------------------------------------------------------

def test_a_stopped_task_gives_its_resources_back_and_a_waiting_task_takes_them(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    host, token = register_host(server, cluster, gpus=1, cpu=2048, memory=2048)
    registered = describe_host(ecs, cluster, host)
    td = family(ecs, unique, app(cpu=1024, memory=2048, portMappings=[{"containerPort": 8080}],
                                 resourceRequirements=[{"type": "GPU", "value": "1"}]))
    first = run(ecs, cluster, td)
    assert first["containerInstanceArn"] == host
    second = run(ecs, cluster, td)
    assert_waiting(second, "RESOURCE:MEMORY")

    stopping = ecs.stop_task(cluster=cluster, task=first["taskArn"], reason="make room")["task"]
    # The host's agent is connected: stopping is its job, and until it has, the resources stay taken.
    assert (stopping["desiredStatus"], stopping["lastStatus"]) == ("STOPPED", "PENDING")
    assert [t["desiredStatus"] for t in poll(server, token)["tasks"]] == ["STOPPED"]
    time.sleep(0.3)
    assert "containerInstanceArn" not in describe_task(ecs, cluster, second["taskArn"])

    position = cursor(server)
    report_stopped(server, token, first)
    stopped = describe_task(ecs, cluster, first["taskArn"])
    assert (stopped["lastStatus"], stopped["stopCode"], stopped["stoppedReason"]) == (
        "STOPPED", "UserInitiated", "make room")
    now = placed_on(ecs, cluster, second["taskArn"])
    assert now["containerInstanceArn"] == host and pending_reason(now) is None
    assert now["containers"][0]["gpuIds"] == first["containers"][0]["gpuIds"]
    assert wait_for(lambda: task_events(server, position, second["taskArn"]), timeout=5,
                    message="the placement event")

    ecs.stop_task(cluster=cluster, task=second["taskArn"])
    report_stopped(server, token, now)
    after = describe_host(ecs, cluster, host)
    assert after["remainingResources"] == registered["registeredResources"]
    assert after["gpuDevices"] == registered["gpuDevices"]
    assert (after["runningTasksCount"], after["pendingTasksCount"]) == (0, 0)


# --- constraints ----------------------------------------------------------------------------------------------------

def test_member_of_an_instance_type(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    register_host(server, cluster, instance_type="m5.large")
    g5, _ = register_host(server, cluster, instance_type="g5.xlarge")
    td = family(ecs, unique)
    resp = ecs.run_task(cluster=cluster, taskDefinition=td, count=3, placementConstraints=[
        {"type": "memberOf", "expression": "attribute:ecs.instance-type == g5.xlarge"}])
    assert [t["containerInstanceArn"] for t in resp["tasks"]] == [g5] * 3
    wildcard = run(ecs, cluster, td, placementConstraints=[
        {"type": "memberOf", "expression": "attribute:ecs.instance-type =~ g5.*"}])
    assert wildcard["containerInstanceArn"] == g5
    # From the task definition too.
    in_definition = family(ecs, unique, placementConstraints=[
        {"type": "memberOf", "expression": "attribute:ecs.instance-type == g5.xlarge"}])
    assert run(ecs, cluster, in_definition)["containerInstanceArn"] == g5
    nowhere = run(ecs, cluster, td, placementConstraints=[
        {"type": "memberOf", "expression": "attribute:ecs.instance-type == p5.48xlarge"}])
    assert "containerInstanceArn" not in nowhere and "MemberOf" in pending_reason(nowhere)


def test_distinct_instance_places_one_task_per_host(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    hosts = {register_host(server, cluster)[0] for _ in range(2)}
    resp = ecs.run_task(cluster=cluster, taskDefinition=family(ecs, unique), count=3,
                        placementConstraints=[{"type": "distinctInstance"}])
    assert resp["failures"] == []
    placed = [t["containerInstanceArn"] for t in resp["tasks"] if t.get("containerInstanceArn")]
    assert sorted(placed) == sorted(hosts)
    [waiting] = [t for t in resp["tasks"] if not t.get("containerInstanceArn")]
    assert "DistinctInstance" in pending_reason(waiting)
    # A third host makes room for it.
    third, _ = register_host(server, cluster)
    assert placed_on(ecs, cluster, waiting["taskArn"])["containerInstanceArn"] == third


def test_run_task_only_uses_hosts_whose_agent_is_connected(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    # A host registered through the ECS API has no shoal agent polling for it.
    bare = ecs.register_container_instance(cluster=cluster, totalResources=[
        {"name": "CPU", "type": "INTEGER", "integerValue": 4096},
        {"name": "MEMORY", "type": "INTEGER", "integerValue": 4096}])["containerInstance"]
    assert bare["agentConnected"] is False
    td = family(ecs, unique)
    task = run(ecs, cluster, td)
    assert "containerInstanceArn" not in task and pending_reason(task)
    # StartTask names the host: the operator vouches for it.
    started = ecs.start_task(cluster=cluster, taskDefinition=td,
                             containerInstances=[bare["containerInstanceArn"]])["tasks"][0]
    assert started["containerInstanceArn"] == bare["containerInstanceArn"]
    host, _ = register_host(server, cluster)
    assert placed_on(ecs, cluster, task["taskArn"])["containerInstanceArn"] == host


# --- capacity providers -----------------------------------------------------------------------------------------------

def test_a_capacity_provider_strategy_places_only_on_that_providers_hosts(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    provider = self_managed_provider(ecs, cluster, unique)
    plain, _ = register_host(server, cluster)
    td = family(ecs, unique)
    strategy = [{"capacityProvider": provider, "weight": 1}]

    waiting = run(ecs, cluster, td, capacityProviderStrategy=strategy)
    assert waiting["lastStatus"] == "PROVISIONING" and "containerInstanceArn" not in waiting
    time.sleep(0.3)  # the plain host is not the provider's: it never takes the task
    assert describe_task(ecs, cluster, waiting["taskArn"])["lastStatus"] == "PROVISIONING"

    position = cursor(server)
    member, _ = register_host(server, cluster, capacity_provider=provider)
    now = placed_on(ecs, cluster, waiting["taskArn"])
    assert (now["containerInstanceArn"], now["lastStatus"], now["capacityProviderName"]) == (
        member, "PENDING", provider)
    [event] = wait_for(lambda: task_events(server, position, waiting["taskArn"]), timeout=5,
                       message="the placement event")
    assert event["detail"]["lastStatus"] == "PENDING"

    # With the provider's host there, new tasks of the strategy go straight to it, even when
    # the plain host is emptier; tasks without a strategy may use either.
    for _ in range(2):
        task = run(ecs, cluster, td, capacityProviderStrategy=strategy)
        assert (task["containerInstanceArn"], task["lastStatus"]) == (member, "PENDING")
    assert run(ecs, cluster, td, launchType="EC2")["containerInstanceArn"] == plain
