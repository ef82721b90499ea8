"""Automatic repair of managed hosts whose critical daemon fails (issue #5), end to end: a real
server whose local provisioner launches real `shoal agent --simulate` processes, daemon tasks
that are real processes.

- a critical daemon that never starts: the host never becomes ACTIVE and is replaced;
- a critical daemon killed on one of 3 hosts running a 6-task service: a replacement host
  appears, its daemon runs before any service task lands on it, the service never has fewer than
  its 6 running tasks, the old host is terminated;
- 10 hosts whose critical daemon fails at the same moment: never more than 2 drain at once.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.scenarios.test_daemons import task_events, when
from tests.support import ServerProcess, kill_workloads, wait_for

INSTANCE_TYPE = "g6e.xlarge"


def serve(tmp_path):
    """A server whose local provisioner launches real hosts; every host, task and MPS daemon
    they leave is killed afterwards."""
    srv = ServerProcess(tmp_path / "server", extra_args=(
        "--daemon-start-timeout", "6", "--service-healthy-after", "1", "--scale-in-after", "600")).start()
    yield srv
    srv.stop()
    kill_workloads(tmp_path)  # hosts (agents) and their tasks outlive the server by design
    for pid_file in tmp_path.rglob("agent.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@pytest.fixture
def server(tmp_path):
    yield from serve(tmp_path)


def managed_provider(server, hosts: int, *, repair: str = "ENABLED"):
    """A cluster "fleet" whose default is a managed provider "mi" of `hosts` hosts (launched
    by the local provisioner). Returns the ECS client."""
    ecs = server.client()
    ecs.create_cluster(clusterName="fleet")
    ecs.create_capacity_provider(
        name="mi", cluster="fleet", tags=[{"key": "shoal:min-hosts", "value": str(hosts)}],
        managedInstancesProvider={
            "infrastructureRoleArn": "arn:shoal:iam::000000000000:role/x",
            "instanceLaunchTemplate": {
                "ec2InstanceProfileArn": "arn:shoal:iam::000000000000:instance-profile/x",
                "networkConfiguration": {"subnets": []},
                "instanceRequirements": {"vCpuCount": {"min": 1}, "memoryMiB": {"min": 1},
                                         "allowedInstanceTypes": [INSTANCE_TYPE]}},
            "autoRepairConfiguration": {"actionsStatus": repair}})
    ecs.put_cluster_capacity_providers(cluster="fleet", capacityProviders=["mi"],
                                       defaultCapacityProviderStrategy=[{"capacityProvider": "mi", "weight": 1}])
    return ecs


def managed_fleet(server, hosts: int, command: list[str], *, critical: bool = True, repair: str = "ENABLED"):
    """managed_provider, and a daemon running `command` on its hosts (created while they are
    still starting). Returns the ECS client."""
    ecs = managed_provider(server, hosts, repair=repair)
    td = ecs.register_daemon_task_definition(family="agentd", containerDefinitions=[
        {"name": "agentd", "image": "busybox", "memory": 32, "command": command}])["daemonTaskDefinitionArn"]
    ecs.create_daemon(clusterArn="fleet", daemonName="agentd", daemonTaskDefinitionArn=td, critical=critical,
                      capacityProviderArns=["mi"])
    return ecs


def hosts(ecs, status: str | None = None) -> list[dict]:
    arns = ecs.list_container_instances(cluster="fleet", **({"status": status} if status else {}))[
        "containerInstanceArns"]
    if not arns:
        return []
    return ecs.describe_container_instances(cluster="fleet", containerInstances=arns)["containerInstances"]


def instance_changes(server) -> list[dict]:
    return [e["detail"] for e in server.events() if e["detail-type"] == "ECS Container Instance State Change"]


def max_draining(server) -> int:
    """The most hosts DRAINING at the same time, replayed from the event log."""
    status, most = {}, 0
    for change in instance_changes(server):
        status[change["containerInstanceArn"]] = change["status"]
        most = max(most, sum(s == "DRAINING" for s in status.values()))
    return most


def actions(server) -> list[dict]:
    return server.get("/v1/action-logs", {"cluster": "fleet", "limit": 1000}).json()["entries"]


def kill_daemon_on(server, host: dict, ecs) -> None:
    """kill -9 the daemon's process on `host` (the local provisioner keeps each host's data dir)."""
    [arn] = [t for t in ecs.list_tasks(cluster="fleet", containerInstance=host["containerInstanceArn"])["taskArns"]
             if ecs.describe_tasks(cluster="fleet", tasks=[t])["tasks"][0]["group"] == "daemon:agentd"]
    [pid_file] = (server.data_dir / "hosts" / host["ec2InstanceId"] / "tasks" / arn.rsplit("/", 1)[1]).glob("*/pid")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_critical_daemon_that_never_starts_gets_its_managed_host_replaced(server):
    ecs = managed_fleet(server, 1, ["sh", "-c", "exit 3"])
    first = wait_for(lambda: (h := hosts(ecs)) and h[0], timeout=30, message="the first host to register")
    # It never becomes ACTIVE; it is given up on and another host takes its place.
    wait_for(lambda: len(instance_changes(server)) and any(
        c["containerInstanceArn"] == first["containerInstanceArn"] and c["status"] == "INACTIVE"
        for c in instance_changes(server)), timeout=60, message="the failed host to be terminated")
    statuses = [c["status"] for c in instance_changes(server)
                if c["containerInstanceArn"] == first["containerInstanceArn"]]
    assert "ACTIVE" not in statuses and "REGISTRATION_FAILED" in statuses
    wait_for(lambda: any(h["containerInstanceArn"] != first["containerInstanceArn"] for h in hosts(ecs)),
             timeout=30, message="a replacement host")
    assert "HOST_REPAIR_STARTED" in [a["eventName"] for a in actions(server)]


def test_a_killed_critical_daemon_gets_its_host_replaced_start_before_stop(server):
    ecs = managed_fleet(server, 3, ["sleep", "600"])
    wait_for(lambda: len(hosts(ecs, "ACTIVE")) == 3, timeout=60, message="3 ACTIVE hosts")
    ecs.register_task_definition(family="web", containerDefinitions=[
        {"name": "web", "image": "busybox", "memory": 32, "command": ["sleep", "600"]}])
    ecs.create_service(cluster="fleet", serviceName="web", taskDefinition="web", desiredCount=6,
                       capacityProviderStrategy=[{"capacityProvider": "mi", "weight": 1}],
                       placementStrategy=[{"type": "spread", "field": "instanceId"}],
                       deploymentConfiguration={"minimumHealthyPercent": 100, "maximumPercent": 200})
    wait_for(lambda: ecs.describe_services(cluster="fleet", services=["web"])["services"][0]["deployments"][0][
        "rolloutState"] == "COMPLETED", timeout=60, message="the service's 6 tasks running and healthy")
    victim = hosts(ecs, "ACTIVE")[0]
    before = {h["containerInstanceArn"] for h in hosts(ecs)}
    standalone = ecs.start_task(cluster="fleet", taskDefinition="web", group="batch",
                                containerInstances=[victim["containerInstanceArn"]])["tasks"][0]["taskArn"]
    wait_for(lambda: ecs.describe_tasks(cluster="fleet", tasks=[standalone])["tasks"][0]["lastStatus"] == "RUNNING",
             timeout=20, message="the standalone task to run")
    steady = len(server.events())

    kill_daemon_on(server, victim, ecs)
    wait_for(lambda: any(c["containerInstanceArn"] == victim["containerInstanceArn"] and c["status"] == "INACTIVE"
                         for c in instance_changes(server)), timeout=90, message="the old host to be terminated")
    [replacement] = [h for h in hosts(ecs, "ACTIVE") if h["containerInstanceArn"] not in before]

    # Its daemon ran before any service task did there.
    on_new = lambda e: e["detail"].get("containerInstanceArn") == replacement["containerInstanceArn"]  # noqa: E731
    daemon_up = [when(e) for e in task_events(server, "daemon:", "RUNNING") if on_new(e)]
    web_up = [when(e) for e in task_events(server, "service:web", "RUNNING") if on_new(e)]
    assert daemon_up and all(min(daemon_up) <= t for t in web_up)
    # The service never had fewer than 6 tasks running (replayed from the event log).
    state, low = {}, 6
    for i, event in enumerate(server.events()):
        d = event["detail"]
        if event["detail-type"] != "ECS Task State Change" or d.get("group") != "service:web":
            continue
        state[d["taskArn"]] = d["lastStatus"] == "RUNNING" and d["desiredStatus"] == "RUNNING"
        if i >= steady:
            low = min(low, sum(state.values()))
    assert low >= 6, f"the service dropped to {low} running tasks"
    assert ecs.describe_services(cluster="fleet", services=["web"])["services"][0]["runningCount"] == 6
    # The standalone task was re-run once elsewhere, linked by a tag, and the original stopped.
    arns = ecs.list_tasks(cluster="fleet", family="web", desiredStatus="RUNNING")["taskArns"]
    reruns = [t for t in ecs.describe_tasks(cluster="fleet", tasks=arns, include=["TAGS"])["tasks"]
              if {"key": "shoal:rerun-of", "value": standalone} in t.get("tags", [])]
    assert len(reruns) == 1 and reruns[0]["group"] == "batch" and reruns[0]["lastStatus"] == "RUNNING"
    assert reruns[0]["containerInstanceArn"] != victim["containerInstanceArn"]
    original = ecs.describe_tasks(cluster="fleet", tasks=[standalone])["tasks"][0]
    assert original["lastStatus"] == "STOPPED" and original["stopCode"] == "TerminationNotice"
    names = [a["eventName"] for a in actions(server)]
    assert "HOST_REPAIR_STARTED" in names and "HOST_REPAIR_COMPLETED" in names


def test_ten_hosts_whose_critical_daemon_fails_at_once_drain_at_most_two_at_a_time(server, tmp_path):
    flag = tmp_path / "fail"
    ecs = managed_fleet(server, 10, ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.1; done; exit 1"])
    wait_for(lambda: len(hosts(ecs, "ACTIVE")) == 10, timeout=120, interval=0.5, message="10 ACTIVE hosts")
    flag.touch()  # every daemon exits
    wait_for(lambda: sum(a["eventName"] == "REPAIR_WAITING" for a in actions(server)) >= 8, timeout=30,
             message="the repairs beyond the rate limit to wait")
    flag.unlink()  # replacements' daemons run; the hosts still waiting recover by themselves
    wait_for(lambda: sum(a["eventName"] == "HOST_REPAIR_COMPLETED" for a in actions(server)) >= 2, timeout=120,
             interval=0.5, message="two repairs to complete")
    assert max_draining(server) == 2


def test_with_auto_repair_disabled_a_host_whose_critical_daemon_died_is_reported_not_replaced(server):
    ecs = managed_fleet(server, 1, ["sleep", "600"], repair="DISABLED")
    [victim] = wait_for(lambda: (h := hosts(ecs, "ACTIVE")) and h, timeout=60, message="an ACTIVE host")
    kill_daemon_on(server, victim, ecs)

    def impaired():
        [ci] = ecs.describe_container_instances(cluster="fleet", containerInstances=[victim["containerInstanceArn"]],
                                                include=["CONTAINER_INSTANCE_HEALTH"])["containerInstances"]
        return ci if ci["healthStatus"]["overallStatus"] == "IMPAIRED" else None

    wait_for(impaired, timeout=10, message="the host to be reported IMPAIRED")
    # The daemon is restarted in place and the host returns to service by itself: all the while
    # the repair controller had its passes, and did nothing.
    wait_for(lambda: impaired() is None, timeout=30, interval=0.2, message="the host back to OK in place")
    assert [h["containerInstanceArn"] for h in hosts(ecs)] == [victim["containerInstanceArn"]]
    assert "DRAINING" not in [c["status"] for c in instance_changes(server)]
    assert "HOST_REPAIR_STARTED" not in [a["eventName"] for a in actions(server)]


def test_update_daemon_on_managed_capacity_replaces_the_hosts_under_the_rate_limit(server):
    ecs = managed_fleet(server, 3, ["sleep", "600"])
    wait_for(lambda: len(hosts(ecs, "ACTIVE")) == 3, timeout=60, message="3 ACTIVE hosts")
    first = {h["containerInstanceArn"] for h in hosts(ecs, "ACTIVE")}
    v2 = ecs.register_daemon_task_definition(family="agentd", containerDefinitions=[
        {"name": "agentd", "image": "busybox", "memory": 32, "command": ["sleep", "601"]}])["daemonTaskDefinitionArn"]
    daemon = ecs.list_daemons(clusterArn="fleet")["daemonSummariesList"][0]["daemonArn"]
    dep = ecs.update_daemon(daemonArn=daemon, daemonTaskDefinitionArn=v2, capacityProviderArns=["mi"],
                            deploymentConfiguration={"drainPercent": 50})["deploymentArn"]
    wait_for(lambda: ecs.describe_daemon_deployments(daemonDeploymentArns=[dep])["daemonDeployments"][0][
        "status"] == "SUCCESSFUL", timeout=120, interval=0.5, message="the deployment to succeed")
    now = hosts(ecs, "ACTIVE")
    assert len(now) == 3 and not first & {h["containerInstanceArn"] for h in now}, "every host was replaced"
    # Fewer than 9 hosts: one drains at a time, whatever drainPercent says.
    assert max_draining(server) == 1
    arns = ecs.list_tasks(cluster="fleet", desiredStatus="RUNNING")["taskArns"]
    assert {t["taskDefinitionArn"] for t in ecs.describe_tasks(cluster="fleet", tasks=arns)["tasks"]} == {v2}
