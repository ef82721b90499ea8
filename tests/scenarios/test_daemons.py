"""Managed daemons on real hosts (issue #5): a real server, real `shoal agent` processes on a
self-managed capacity provider, daemon tasks that are real child processes.

- a non-critical daemon that exits at once never blocks its host;
- the same daemon marked critical keeps the host out: REGISTRATION_FAILED, naming the daemon;
- daemons start before application tasks and stop after them (from the event log);
- a critical daemon that dies on an ACTIVE host impairs it (no new application tasks, the ones
  there keep running) until the restarted daemon runs again.
"""

from __future__ import annotations

import datetime
import sys

import pytest

from tests.agent_support import AgentProcess
from tests.support import ServerProcess, kill_workloads, wait_for

PY = sys.executable
START_TIMEOUT = 6


def serve(tmp_path):
    """A server with a short daemon start timeout; the agents a test starts go in `srv.agents`."""
    srv = ServerProcess(tmp_path / "server", extra_args=("--daemon-start-timeout", str(START_TIMEOUT))).start()
    agents: list[AgentProcess] = []
    srv.agents = agents
    yield srv
    for agent in agents:
        agent.stop()
    srv.stop()
    kill_workloads(tmp_path)


@pytest.fixture
def server(tmp_path):
    yield from serve(tmp_path)


def setup(server, tmp_path, command: list[str], *, critical: bool, health_check: dict | None = None,
          memory: int = 32):
    """A cluster with a self-managed provider, a daemon running `command` on it, and one host
    (a real agent) of that provider. Returns (ecs, daemon ARN, agent)."""
    ecs = server.client()
    ecs.create_cluster(clusterName="fleet")
    ecs.create_capacity_provider(name="own", autoScalingGroupProvider={
        "autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:x"})
    ecs.put_cluster_capacity_providers(cluster="fleet", capacityProviders=["own"], defaultCapacityProviderStrategy=[])
    container = {"name": "agentd", "image": "busybox", "memory": memory, "command": command}
    if health_check:
        container["healthCheck"] = health_check
    td = ecs.register_daemon_task_definition(family="agentd", containerDefinitions=[container])
    daemon = ecs.create_daemon(clusterArn="fleet", daemonName="agentd", critical=critical,
                               daemonTaskDefinitionArn=td["daemonTaskDefinitionArn"],
                               capacityProviderArns=["own"])["daemonArn"]
    agent = AgentProcess(server, tmp_path / "host", ("--capacity-provider", "own"), cluster="fleet").start()
    server.agents.append(agent)
    return ecs, daemon, agent


def host(ecs, arn: str) -> dict:
    return ecs.describe_container_instances(cluster="fleet", containerInstances=[arn],
                                            include=["CONTAINER_INSTANCE_HEALTH"])["containerInstances"][0]


def daemon_check(ci: dict) -> dict:
    return next(d for d in ci["healthStatus"]["details"] if d["type"] == "DAEMON")


def app_family(ecs, command: list[str]) -> str:
    ecs.register_task_definition(family="app", containerDefinitions=[
        {"name": "app", "image": "busybox", "memory": 32, "command": command}])
    return "app"


def run_app(ecs, td: str) -> dict:
    return ecs.run_task(cluster="fleet", taskDefinition=td, launchType="EC2")


def task(ecs, arn: str) -> dict:
    return ecs.describe_tasks(cluster="fleet", tasks=[arn])["tasks"][0]


def when(event: dict) -> float:
    return datetime.datetime.fromisoformat(event["detail"]["updatedAt"].replace("Z", "+00:00")).timestamp()


def task_events(server, group_prefix: str, status: str) -> list[dict]:
    return [e for e in server.events() if e["detail-type"] == "ECS Task State Change"
            and e["detail"].get("group", "").startswith(group_prefix) and e["detail"]["lastStatus"] == status]


def start_impaired(server) -> list[dict]:
    return [e for e in server.events() if e["detail-type"] == "ECS Daemon Service Action"
            and e["detail"]["eventName"] == "DAEMON_TASK_START_IMPAIRED"]


def test_a_non_critical_daemon_that_exits_at_once_never_blocks_its_host(server, tmp_path):
    ecs, daemon, agent = setup(server, tmp_path, ["sh", "-c", "exit 3"], critical=False)
    ci = agent.wait_active(ecs)

    app = run_app(ecs, app_family(ecs, ["sleep", "600"]))["tasks"][0]
    assert app["containerInstanceArn"] == ci["containerInstanceArn"]
    wait_for(lambda: task(ecs, app["taskArn"])["lastStatus"] == "RUNNING", timeout=20, message="the app task to run")

    # The daemon keeps failing and is restarted with backoff: several tasks, one event.
    wait_for(lambda: len(task_events(server, "daemon:", "STOPPED")) >= 3, timeout=20,
             message="three failed daemon starts")
    [event] = start_impaired(server)
    assert event["detail"]["failureType"] == "TASK_FAILED_TO_RUN"
    assert event["resources"] == [event["detail"]["taskArn"]]
    assert event["detail"]["daemonArn"] == daemon and event["detail"]["capacityProviderName"] == "own"
    assert event["detail"]["reason"].startswith("Task failed to reach RUNNING status")

    [counts] = ecs.describe_daemon(daemonArn=daemon)["daemon"]["currentRevisions"][0]["capacityProviders"]
    assert (counts["runningCount"], counts["withoutDaemonCount"]) == (0, 1)
    ci = host(ecs, ci["containerInstanceArn"])
    assert ci["status"] == "ACTIVE"  # no drain
    assert daemon_check(ci)["status"] == "IMPAIRED" and "non-critical" in daemon_check(ci)["statusReason"]
    assert ci["healthStatus"]["overallStatus"] == "OK"  # non-critical daemons do not count
    # New application tasks are still placed there.
    assert run_app(ecs, "app")["tasks"][0]["containerInstanceArn"] == ci["containerInstanceArn"]
    entries = server.get("/v1/action-logs", {"cluster": "fleet", "daemon": "agentd"}).json()["entries"]
    assert [e["eventName"] for e in entries].count("DAEMON_TASK_START_IMPAIRED") == 1


def test_a_non_critical_daemon_too_big_for_its_host_is_a_creation_failure_and_never_blocks(server, tmp_path):
    ecs, daemon, agent = setup(server, tmp_path, ["sleep", "600"], critical=False, memory=64 * 1024 * 1024)
    ci = agent.wait_active(ecs)
    app = run_app(ecs, app_family(ecs, ["sleep", "600"]))["tasks"][0]
    assert app["containerInstanceArn"] == ci["containerInstanceArn"]
    wait_for(lambda: task(ecs, app["taskArn"])["lastStatus"] == "RUNNING", timeout=20, message="the app task to run")
    wait_for(lambda: start_impaired(server), timeout=10, message="DAEMON_TASK_START_IMPAIRED")
    wait_for(lambda: any(e["eventName"] == "DAEMON_TASK_START_RETRY" for e in server.get(
        "/v1/action-logs", {"cluster": "fleet"}).json()["entries"]), timeout=20, message="a retry")
    [event] = start_impaired(server)
    assert event["detail"]["failureType"] == "TASK_CREATION_FAILED"
    assert "taskArn" not in event["detail"] and event["resources"] == []
    assert event["detail"]["reason"].startswith("RESOURCE:MEMORY")
    [counts] = ecs.describe_daemon(daemonArn=daemon)["daemon"]["currentRevisions"][0]["capacityProviders"]
    assert (counts["runningCount"], counts["withoutDaemonCount"]) == (0, 1)
    assert host(ecs, ci["containerInstanceArn"])["status"] == "ACTIVE"  # no drain


def test_a_critical_daemon_that_cannot_start_keeps_a_self_managed_host_out(server, tmp_path):
    ecs, daemon, agent = setup(server, tmp_path, ["sh", "-c", "exit 3"], critical=True)
    seen = []

    def failed():
        ci = host(ecs, agent.arn)
        seen.append(ci["status"])
        return ci if ci["status"] == "REGISTRATION_FAILED" else None

    ci = wait_for(failed, timeout=START_TIMEOUT + 20, interval=0.2, message="REGISTRATION_FAILED")
    assert "ACTIVE" not in seen
    assert "agentd" in ci["statusReason"]
    [event] = start_impaired(server)
    assert event["detail"]["failureType"] == "TASK_FAILED_TO_RUN"
    assert event["resources"] == [event["detail"]["taskArn"]]
    # Nothing is placed on it.
    reply = run_app(ecs, app_family(ecs, ["sleep", "600"]))
    assert reply["tasks"][0].get("containerInstanceArn") is None


def test_daemons_run_before_application_tasks_and_stop_after_them(server, tmp_path):
    ecs, daemon, agent = setup(server, tmp_path, ["sleep", "600"], critical=True)
    ci = agent.wait_active(ecs)
    assert daemon_check(host(ecs, ci["containerInstanceArn"]))["status"] == "OK"
    [counts] = ecs.describe_daemon(daemonArn=daemon)["daemon"]["currentRevisions"][0]["capacityProviders"]
    assert (counts["runningCount"], counts["withoutDaemonCount"]) == (1, 0)

    td = app_family(ecs, ["sh", "-c", "sleep 2"])
    apps = [run_app(ecs, td)["tasks"][0]["taskArn"] for _ in range(2)]
    wait_for(lambda: all(task(ecs, a)["lastStatus"] == "RUNNING" for a in apps), timeout=20, message="apps running")
    ecs.update_container_instances_state(cluster="fleet", containerInstances=[ci["containerInstanceArn"]],
                                         status="DRAINING")
    wait_for(lambda: task_events(server, "daemon:", "STOPPED"), timeout=30, message="the daemon to stop on drain")

    daemon_running = min(when(e) for e in task_events(server, "daemon:", "RUNNING"))
    apps_running = [when(e) for e in task_events(server, "family:app", "RUNNING")]
    assert apps_running and daemon_running <= min(apps_running)
    daemon_stopped = min(when(e) for e in task_events(server, "daemon:", "STOPPED"))
    apps_stopped = [when(e) for e in task_events(server, "family:app", "STOPPED")]
    assert len(apps_stopped) == 2 and daemon_stopped >= max(apps_stopped)


def test_a_critical_daemon_that_dies_impairs_a_self_managed_host_until_it_runs_again(server, tmp_path):
    flag = tmp_path / "fail"
    # Runs until the flag exists; while it exists, every restart fails at once.
    script = f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 1"
    ecs, daemon, agent = setup(server, tmp_path, ["sh", "-c", script], critical=True)
    ci = agent.wait_active(ecs)
    arn = ci["containerInstanceArn"]
    app = run_app(ecs, app_family(ecs, ["sleep", "600"]))["tasks"][0]
    wait_for(lambda: task(ecs, app["taskArn"])["lastStatus"] == "RUNNING", timeout=20, message="the app task to run")

    flag.touch()  # the daemon exits
    impaired = wait_for(lambda: (c := host(ecs, arn)) and daemon_check(c)["status"] == "IMPAIRED" and c,
                        timeout=10, interval=0.05, message="the DAEMON check to go IMPAIRED")
    assert daemon_check(impaired)["statusReason"].startswith("Daemon task: ")
    assert impaired["healthStatus"]["overallStatus"] == "IMPAIRED" and impaired["status"] == "ACTIVE"
    changes = [e for e in server.events() if e["detail-type"] == "ECS Container Instance Health Change"]
    assert changes and changes[-1]["detail"]["overallStatus"] == "IMPAIRED"
    # The host takes no new application tasks; the one there keeps running.
    assert run_app(ecs, "app")["tasks"][0].get("containerInstanceArn") is None
    assert task(ecs, app["taskArn"])["lastStatus"] == "RUNNING"

    flag.unlink()  # the next restart runs: the host returns to service by itself
    wait_for(lambda: daemon_check(host(ecs, arn))["status"] == "OK", timeout=45, interval=0.1,
             message="the DAEMON check to be OK again")
    assert host(ecs, arn)["healthStatus"]["overallStatus"] == "OK"
    assert task(ecs, app["taskArn"])["lastStatus"] == "RUNNING"
    wait_for(lambda: any(t.get("containerInstanceArn") == arn for t in ecs.describe_tasks(
        cluster="fleet", tasks=ecs.list_tasks(cluster="fleet", family="app")["taskArns"])["tasks"]
        if t["taskArn"] != app["taskArn"]), timeout=10, message="the waiting app task to be placed")
