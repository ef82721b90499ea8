"""The placement engine through boto3, on hosts that joined over the agent protocol: the ECS
strategies and constraints as an ECS user relies on them, the reasons a task waits, and
concurrent RunTask storms on two servers sharing one database that never double-book a host.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError

from tests.integration.test_placement import (describe_host, family, make_cluster, pending_reason,
                                              register_host, resources, self_managed_provider)
from tests.support import ServerProcess, database_url_for

DISTINCT = "DistinctInstance placement constraint unsatisfied."


def test_distinct_instance_with_three_tasks_and_two_eligible_hosts_leaves_one_waiting(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    eligible = {register_host(server, cluster, instance_type="g6e.xlarge")[0] for _ in range(2)}
    register_host(server, cluster, instance_type="c7i.large")  # not eligible: filtered by memberOf
    resp = ecs.run_task(cluster=cluster, taskDefinition=family(ecs, unique), count=3, placementConstraints=[
        {"type": "distinctInstance"}, {"type": "memberOf", "expression": "attribute:ecs.instance-type =~ g6e.*"}])
    placed = [t["containerInstanceArn"] for t in resp["tasks"] if t.get("containerInstanceArn")]
    assert sorted(placed) == sorted(eligible)
    [waiting] = [t for t in resp["tasks"] if not t.get("containerInstanceArn")]
    assert pending_reason(waiting) == DISTINCT


def test_member_of_an_instance_type_pattern_only_selects_those_hosts(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    g6e = {register_host(server, cluster, instance_type=t)[0] for t in ("g6e.xlarge", "g6e.12xlarge")}
    for other in ("c7i.large", "g5.xlarge", "p5.48xlarge"):
        register_host(server, cluster, instance_type=other)
    td = family(ecs, unique)
    for _ in range(2):
        resp = ecs.run_task(cluster=cluster, taskDefinition=td, count=10, placementConstraints=[
            {"type": "memberOf", "expression": "attribute:ecs.instance-type =~ g6e.*"}])
        assert {t["containerInstanceArn"] for t in resp["tasks"]} == g6e


def test_binpack_memory_picks_the_host_with_the_least_remaining_memory_that_fits(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    hosts = {memory: register_host(server, cluster, memory=memory)[0] for memory in (8192, 3072, 2048, 4096)}
    td = family(ecs, unique, {"name": "app", "image": "busybox", "memory": 2560})
    binpack = [{"type": "binpack", "field": "memory"}]
    first = ecs.run_task(cluster=cluster, taskDefinition=td, placementStrategy=binpack)["tasks"][0]
    assert first["containerInstanceArn"] == hosts[3072]  # 2048 is too small; 3072 is the tightest fit
    # 3072 has 512 left now, so the next tightest is 4096, then 8192 (twice: 5632 left, then 3072).
    order = [ecs.run_task(cluster=cluster, taskDefinition=td, placementStrategy=binpack)["tasks"][0]
             ["containerInstanceArn"] for _ in range(3)]
    assert order == [hosts[4096], hosts[8192], hosts[8192]]
    assert resources(describe_host(ecs, cluster, hosts[8192])["remainingResources"])["MEMORY"] == 8192 - 2 * 2560


def test_spread_over_availability_zones_balances_three_zones_to_within_one_task(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    zone_of = {}
    for i, zone in enumerate(["az-1", "az-1", "az-1", "az-1", "az-2", "az-3"]):  # uneven on purpose
        zone_of[register_host(server, cluster, zone=zone, memory=65536)[0]] = zone
    td = family(ecs, unique)
    spread = [{"type": "spread", "field": "attribute:ecs.availability-zone"}, {"type": "binpack", "field": "memory"}]
    zones = []
    for count in (10, 10, 4):
        resp = ecs.run_task(cluster=cluster, taskDefinition=td, count=count, placementStrategy=spread, group="web")
        zones += [zone_of[t["containerInstanceArn"]] for t in resp["tasks"]]
        counts = [zones.count(z) for z in ("az-1", "az-2", "az-3")]
        assert max(counts) - min(counts) <= 1, counts
    assert len(zones) == 24


def test_a_member_of_syntax_error_names_the_field_and_the_position(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    td = family(ecs, unique)
    with pytest.raises(ClientError) as err:
        ecs.run_task(cluster=cluster, taskDefinition=td, placementConstraints=[
            {"type": "memberOf", "expression": "attribute:ecs.instance-type =~ g6e.* &&"}])
    error = err.value.response["Error"]
    assert error["Code"] == "InvalidParameterException"
    assert "placementConstraints[0].expression" in error["Message"] and "position 39" in error["Message"], error
    assert "expected a subject" in error["Message"]
    assert ecs.list_tasks(cluster=cluster)["taskArns"] == []  # nothing half-written


def test_placement_limits_are_checked(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    td = family(ecs, unique)
    eleven = [{"type": "memberOf", "expression": "attribute:ecs.os-type == linux"}] * 11
    with pytest.raises(ClientError, match="at most 10 constraints"):
        ecs.run_task(cluster=cluster, taskDefinition=td, placementConstraints=eleven)
    with pytest.raises(ClientError) as err:
        ecs.register_task_definition(family=unique("f"), placementConstraints=[{"type": "distinctInstance"}],
                                     containerDefinitions=[{"name": "app", "image": "busybox", "memory": 128}])
    assert "placementConstraints[0].type" in err.value.response["Error"]["Message"]
    with pytest.raises(ClientError, match="at most 2000 characters"):
        ecs.run_task(cluster=cluster, taskDefinition=td, placementConstraints=[
            {"type": "memberOf", "expression": "attribute:a == b || " * 100 + "attribute:a == b"}])


def test_list_container_instances_filters_with_the_same_language(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    g6e, _ = register_host(server, cluster, instance_type="g6e.xlarge", zone="az-1")
    register_host(server, cluster, instance_type="c7i.large", zone="az-2")
    listed = ecs.list_container_instances(
        cluster=cluster, filter="attribute:ecs.instance-type =~ g6e.* && attribute:ecs.availability-zone == az-1")
    assert listed["containerInstanceArns"] == [g6e]


def test_launch_type_ec2_may_use_any_active_host_whichever_provider_brought_it(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    provider = self_managed_provider(ecs, cluster, unique)
    member, _ = register_host(server, cluster, capacity_provider=provider)
    task = ecs.run_task(cluster=cluster, taskDefinition=family(ecs, unique), launchType="EC2")["tasks"][0]
    assert task["containerInstanceArn"] == member


# --- concurrency ------------------------------------------------------------------------------------------

@pytest.fixture
def two_servers(backend, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    url = database_url_for(backend) or f"sqlite:///{data / 'shared.db'}"
    servers = [ServerProcess(data, url).start(), ServerProcess(data, url).start()]
    yield servers
    for s in servers:
        s.stop()


def test_concurrent_run_task_storms_on_two_servers_never_double_book_a_host(two_servers, unique):
    first, second = two_servers
    ecs = first.client("ecs")
    cluster = make_cluster(ecs, unique)
    hosts = [register_host(first, cluster, cpu=4096, memory=8192, gpus=2, mps=True, gpu_memory=24576)[0]
             for _ in range(3)]
    cpu_td = family(ecs, unique, {"name": "app", "image": "busybox", "cpu": 1024, "memory": 512})
    gpu_td = family(ecs, unique, {"name": "app", "image": "busybox", "memory": 256, "resourceRequirements": [
        {"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 10240}}}]})
    clients = [s.client("ecs") for s in (first, second) for _ in range(4)]

    def storm(i: int) -> list[dict]:
        client = clients[i % len(clients)]
        td = cpu_td if i % 2 else gpu_td
        return client.run_task(cluster=cluster, taskDefinition=td, count=3)["tasks"]

    with ThreadPoolExecutor(len(clients)) as pool:
        launched = [t for batch in pool.map(storm, range(24)) for t in batch]
    assert len(launched) == 72
    # Every host's allocations fit it: CPU 4096 = 4 cpu tasks (minus MPS tasks' 0 CPU), memory,
    # and MPS memory per GPU (two 10 GiB shares per 24 GiB GPU).
    placed = {}
    for host in ecs.describe_container_instances(cluster=cluster, containerInstances=hosts)["containerInstances"]:
        left = resources(host["remainingResources"])
        assert left["CPU"] >= 0 and left["MEMORY"] >= 0, left
        for gpu in host["gpuDevices"]:
            assert gpu["remainingMemoryInMiB"] >= 0 and gpu["containerCount"] <= 2, gpu
        placed[host["containerInstanceArn"]] = (4096 - left["CPU"]) // 1024 + sum(
            g["containerCount"] for g in host["gpuDevices"])
    tasks = []
    arns = [t["taskArn"] for t in launched]
    for start in range(0, len(arns), 100):
        tasks += ecs.describe_tasks(cluster=cluster, tasks=arns[start:start + 100])["tasks"]
    on_hosts = [t for t in tasks if t.get("containerInstanceArn")]
    # What the hosts say they hold is exactly the tasks that say they are on them: 4 CPU tasks
    # and 4 MPS shares per host at most, so 24 of the 72 placed and the rest wait, with a reason.
    assert sum(placed.values()) == len(on_hosts) == 24
    for arn in hosts:
        assert placed[arn] == sum(t["containerInstanceArn"] == arn for t in on_hosts)
    waiting = [t for t in tasks if not t.get("containerInstanceArn")]
    assert all(pending_reason(t) in ("RESOURCE:CPU", "RESOURCE:GPU") for t in waiting), \
        json.dumps([pending_reason(t) for t in waiting])
