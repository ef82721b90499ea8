"""Daemon deployments on real self-managed hosts (issue #5 point 9): UpdateDaemon restarts the
daemon in place batch by batch; the circuit breaker and alarms roll a bad revision back."""

from __future__ import annotations

import pytest

from tests.agent_support import AgentProcess
from tests.integration.test_alarms import put
from tests.scenarios.test_daemons import serve
from tests.support import wait_for


@pytest.fixture
def server(tmp_path):
    yield from serve(tmp_path)


def fleet(server, tmp_path, hosts: int):
    """A cluster with a self-managed provider of `hosts` real hosts and a daemon (revision 1:
    sleep) on them, running everywhere. Returns (ecs, daemon ARN)."""
    ecs = server.client()
    ecs.create_cluster(clusterName="fleet")
    ecs.create_capacity_provider(name="own", autoScalingGroupProvider={
        "autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:x"})
    ecs.put_cluster_capacity_providers(cluster="fleet", capacityProviders=["own"], defaultCapacityProviderStrategy=[])
    for i in range(hosts):
        agent = AgentProcess(server, tmp_path / f"host{i}", ("--capacity-provider", "own"), cluster="fleet").start()
        server.agents.append(agent)
        agent.wait_active(ecs)
    created = ecs.create_daemon(clusterArn="fleet", daemonName="agentd", capacityProviderArns=["own"],
                                daemonTaskDefinitionArn=definition(ecs, ["sleep", "600"]))
    # Started in place on the hosts there are; done once it has run a while on each.
    wait_for(lambda: deployment(ecs, created["deploymentArn"])["status"] == "SUCCESSFUL", timeout=60,
             message=f"the daemon on {hosts} hosts")
    assert len(running_revisions(ecs)) == hosts
    return ecs, created["daemonArn"]


def definition(ecs, command: list[str]) -> str:
    return ecs.register_daemon_task_definition(family="agentd", containerDefinitions=[
        {"name": "agentd", "image": "busybox", "memory": 32, "command": command}])["daemonTaskDefinitionArn"]


def running_revisions(ecs) -> list[str]:
    """The daemon task definition of each RUNNING daemon task."""
    arns = ecs.list_tasks(cluster="fleet", desiredStatus="RUNNING")["taskArns"]
    found = ecs.describe_tasks(cluster="fleet", tasks=arns)["tasks"] if arns else []
    return [t["taskDefinitionArn"] for t in found if t["group"] == "daemon:agentd" and t["lastStatus"] == "RUNNING"]


def deployment(ecs, arn: str) -> dict:
    return ecs.describe_daemon_deployments(daemonDeploymentArns=[arn])["daemonDeployments"][0]


def statuses(server, deployment_arn: str) -> list[str]:
    return [e["detail"]["eventName"].removeprefix("DAEMON_DEPLOYMENT_") for e in server.events()
            if e["detail-type"] == "ECS Daemon Deployment State Change"
            and e["detail"]["daemonDeploymentArn"] == deployment_arn]


def test_update_daemon_restarts_it_in_place_one_batch_at_a_time(server, tmp_path):
    ecs, daemon = fleet(server, tmp_path, 2)
    v2 = definition(ecs, ["sleep", "601"])
    dep = ecs.update_daemon(daemonArn=daemon, daemonTaskDefinitionArn=v2, capacityProviderArns=["own"],
                            deploymentConfiguration={"drainPercent": 50})["deploymentArn"]
    wait_for(lambda: deployment(ecs, dep)["status"] == "SUCCESSFUL", timeout=60, message="the deployment to succeed")
    assert running_revisions(ecs) == [v2, v2]
    assert statuses(server, dep) == ["PENDING", "IN_PROGRESS", "SUCCESSFUL"]
    # One host at a time (50 % of 2): never both daemons down together.
    state, most_down = {}, 0
    for e in server.events():
        d = e["detail"]
        if e["detail-type"] == "ECS Task State Change" and d.get("group") == "daemon:agentd":
            state[d["taskArn"]] = (d["containerInstanceArn"], d["lastStatus"] == "RUNNING" and
                                   d["desiredStatus"] == "RUNNING")
            up = {host for host, running in state.values() if running}
            if len(state) > 2:  # after the first two started
                most_down = max(most_down, 2 - len(up))
    assert most_down == 1


def test_a_revision_that_fails_to_start_trips_the_breaker_and_rolls_back(server, tmp_path):
    ecs, daemon = fleet(server, tmp_path, 3)
    [v1] = set(running_revisions(ecs))
    bad = definition(ecs, ["sh", "-c", "exit 1"])
    dep = ecs.update_daemon(daemonArn=daemon, daemonTaskDefinitionArn=bad, capacityProviderArns=["own"])[
        "deploymentArn"]
    wait_for(lambda: deployment(ecs, dep)["status"] == "ROLLBACK_SUCCESSFUL", timeout=90,
             message="the rollback to succeed")
    assert statuses(server, dep) == ["PENDING", "IN_PROGRESS", "STOP_REQUESTED", "ROLLBACK_IN_PROGRESS",
                                     "ROLLBACK_SUCCESSFUL"]
    entries = server.get("/v1/action-logs", {"cluster": "fleet", "daemon": "agentd"}).json()["entries"]
    [rollback] = [e for e in entries if e["eventName"] == "DAEMON_DEPLOYMENT_ROLLBACK_STARTED"]
    assert "circuit breaker" in rollback["detail"]["statusReason"]
    assert sorted(running_revisions(ecs)) == [v1, v1, v1]
    current = ecs.describe_daemon(daemonArn=daemon)["daemon"]["currentRevisions"][0]["arn"]
    assert ecs.describe_daemon_revisions(daemonRevisionArns=[current])["daemonRevisions"][0][
        "daemonTaskDefinitionArn"] == v1


def test_an_alarm_during_the_bake_rolls_back_and_one_already_in_alarm_is_ignored(server, tmp_path):
    ecs, daemon = fleet(server, tmp_path, 1)
    [v1] = running_revisions(ecs)
    def alarm(name: str, state: str) -> None:
        assert put(server, name, {"state": state}).status_code == 200

    alarm("already-bad", "ALARM")
    v2 = definition(ecs, ["sleep", "602"])
    dep = ecs.update_daemon(daemonArn=daemon, daemonTaskDefinitionArn=v2, capacityProviderArns=["own"],
                            deploymentConfiguration={"bakeTimeInMinutes": 1, "alarms": {
                                "alarmNames": ["already-bad", "errors"], "enable": True}})["deploymentArn"]
    wait_for(lambda: running_revisions(ecs) == [v2], timeout=60, message="the new revision on the host")
    assert deployment(ecs, dep)["status"] == "IN_PROGRESS", "baking; the alarm already in ALARM is ignored"
    alarm("errors", "ALARM")
    wait_for(lambda: deployment(ecs, dep)["status"] == "ROLLBACK_SUCCESSFUL", timeout=60,
             message="the rollback to succeed")
    assert deployment(ecs, dep)["alarms"]["triggeredAlarmNames"] == ["errors"]
    previous = ecs.describe_daemon_deployments(daemonDeploymentArns=[dep])["daemonDeployments"][0][
        "sourceDaemonRevisions"][0]["arn"]
    assert deployment(ecs, dep)["rollback"]["rollbackTargetDaemonRevisionArn"] == previous
    assert running_revisions(ecs) == [v1]
