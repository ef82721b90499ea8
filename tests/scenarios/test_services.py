"""Stories of services run for real: boto3 against a real `shoal server`, two real `shoal agent`
processes (zones az-a and az-b) running real child processes.

The server counts a task without health checks as healthy after 1 s of RUNNING (ECS: 40 s), so
that deployments move quickly. Each story proves its point from the event log where it can
(`GET /v1/events`, in commit order), not from samples.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.agent_support import AgentProcess
from tests.support import ServerProcess, wait_for

CLUSTER = "svc"
SLEEP = ["sleep", "600"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("svc-server"), extra_args=("--service-healthy-after", "1")).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def ecs(server):
    client = server.client()
    client.create_cluster(clusterName=CLUSTER)
    return client


@pytest.fixture(scope="module")
def agents(server, ecs, tmp_path_factory):
    root = tmp_path_factory.mktemp("svc-agents")
    started = [AgentProcess(server, root / az, extra_args=("--availability-zone", az), cluster=CLUSTER)
               for az in ("az-a", "az-b")]
    try:
        for agent in started:
            agent.start().wait_active(ecs)
        yield started
    finally:
        for agent in started:
            if agent.proc is not None and agent.proc.poll() is None:
                ecs.deregister_container_instance(cluster=CLUSTER, containerInstance=agent.arn, force=True)
                try:
                    agent.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            agent.stop()
            agent.kill_leftovers()


class Service:
    """One test's service: create it, read it, wait on it; deleted (and its tasks stopped) at the end."""

    def __init__(self, server: ServerProcess, ecs, name: str):
        self.server, self.ecs, self.name = server, ecs, name

    def register(self, command: list[str]) -> str:
        return self.ecs.register_task_definition(family=self.name, containerDefinitions=[
            {"name": "c", "image": "busybox", "memory": 32, "command": command}])["taskDefinition"]["taskDefinitionArn"]

    def describe(self) -> dict:
        return self.ecs.describe_services(cluster=CLUSTER, services=[self.name])["services"][0]

    def wait(self, predicate, what: str, timeout: float = 30) -> dict:
        last = {}

        def check():
            last["svc"] = self.describe()
            return last["svc"] if predicate(last["svc"]) else None
        try:
            return wait_for(check, timeout=timeout, interval=0.1, message=what)
        except AssertionError as err:
            svc = last.get("svc", {})
            raise AssertionError(f"{err}; deployments: {svc.get('deployments')}; "
                                 f"events: {[e['message'] for e in svc.get('events', [])][:8]}") from None

    def wait_steady(self, timeout: float = 30) -> dict:
        return self.wait(lambda s: len(s["deployments"]) == 1 and s["deployments"][0]["rolloutState"] == "COMPLETED"
                         and s["runningCount"] == s["desiredCount"] and s["pendingCount"] == 0,
                         "the service to be steady", timeout)

    def tasks(self, desired: str = "RUNNING") -> list[dict]:
        arns = self.ecs.list_tasks(cluster=CLUSTER, serviceName=self.name, desiredStatus=desired)["taskArns"]
        return self.ecs.describe_tasks(cluster=CLUSTER, tasks=arns)["tasks"] if arns else []

    def events(self) -> list[dict]:
        """This service's events and its tasks' state changes, in commit order."""
        arn = self.describe()["serviceArn"]
        return [e for e in self.server.events()
                if arn in e["resources"] or e["detail"].get("group") == f"service:{self.name}"]

    def delete(self) -> None:
        self.ecs.delete_service(cluster=CLUSTER, service=self.name, force=True)
        self.wait(lambda s: s["status"] == "INACTIVE", "the deleted service to be INACTIVE")


@pytest.fixture
def service(server, ecs, agents, unique):
    svc = Service(server, ecs, unique("web"))
    yield svc
    try:
        svc.delete()
    except Exception:  # the test failed before creating it
        pass


def task_changes(events: list[dict]) -> list[dict]:
    return [e["detail"] for e in events if e["detail-type"] == "ECS Task State Change"]


def test_a_crashing_deployment_trips_the_circuit_breaker_and_rolls_back(service, ecs):
    good, bad = service.register(SLEEP), service.register(["sh", "-c", "exit 1"])
    ecs.create_service(cluster=CLUSTER, serviceName=service.name, taskDefinition=good, desiredCount=2,
                       deploymentConfiguration={"deploymentCircuitBreaker": {"enable": True, "rollback": True}})
    first = service.wait_steady()["deployments"][0]

    failing = ecs.update_service(cluster=CLUSTER, service=service.name, taskDefinition=bad)["service"]
    failing_id = failing["deployments"][0]["id"]
    assert failing["deployments"][0]["taskDefinition"] == bad and failing["deployments"][1]["id"] == first["id"]

    # Threshold for 2 tasks: clamp(ceil(0.5 × 2), 3, 200) = 3 failures; then back to `good`.
    svc = service.wait(lambda s: s["deployments"][0]["id"] not in (first["id"], failing_id)
                       and len(s["deployments"]) == 1 and s["deployments"][0]["rolloutState"] == "COMPLETED",
                       "the rollback deployment to complete")
    assert svc["taskDefinition"] == good and svc["deployments"][0]["taskDefinition"] == good
    running = service.tasks()
    assert len(running) == 2 and {t["taskDefinitionArn"] for t in running} == {good}
    assert all(t["lastStatus"] == "RUNNING" for t in running)

    events = service.events()
    states = [(e["detail"]["eventName"], e["detail"]["deploymentId"]) for e in events
              if e["detail-type"] == "ECS Deployment State Change"]
    failed_at = states.index(("SERVICE_DEPLOYMENT_FAILED", failing_id))
    assert ("SERVICE_DEPLOYMENT_IN_PROGRESS", failing_id) in states[:failed_at]
    assert states[-1] == ("SERVICE_DEPLOYMENT_COMPLETED", svc["deployments"][0]["id"])
    crashed = {d["taskArn"] for d in task_changes(events) if d["startedBy"] == failing_id
               and d["lastStatus"] == "STOPPED" and d["stopCode"] == "EssentialContainerExited"}
    assert len(crashed) >= 3

    [sd] = ecs.describe_service_deployments(serviceDeploymentArns=[failing["currentServiceDeployment"]]
                                            )["serviceDeployments"]
    assert sd["status"] == "ROLLBACK_SUCCESSFUL"
    assert sd["deploymentCircuitBreaker"]["status"] == "TRIGGERED"
    assert sd["deploymentCircuitBreaker"]["threshold"] == 3 and sd["deploymentCircuitBreaker"]["failureCount"] >= 3
    assert sd["rollback"]["serviceRevisionArn"].endswith(svc["deployments"][0]["id"].split("/")[1])


def test_a_rolling_update_never_drops_below_the_minimum_healthy_tasks(service, ecs):
    v1, v2 = service.register(SLEEP), service.register(["sleep", "601"])
    ecs.create_service(cluster=CLUSTER, serviceName=service.name, taskDefinition=v1, desiredCount=2,
                       deploymentConfiguration={"minimumHealthyPercent": 100, "maximumPercent": 150})
    service.wait_steady()
    before = len(service.events())
    ecs.update_service(cluster=CLUSTER, service=service.name, taskDefinition=v2)
    svc = service.wait(lambda s: s["deployments"][0]["taskDefinition"] == v2 and len(s["deployments"]) == 1
                       and s["deployments"][0]["rolloutState"] == "COMPLETED", "the rolling update to complete")
    assert {t["taskDefinitionArn"] for t in service.tasks()} == {v2} and svc["runningCount"] == 2

    # Replay every task change: after each, at least 2 tasks RUNNING that nobody is stopping
    # (min 100% of 2), and at most 3 that have not stopped (max 150% of 2, rounded down).
    events = service.events()
    tasks: dict[str, tuple[str, str]] = {}
    lowest, highest, steps = 2, 0, 0
    for i, e in enumerate(events):
        if e["detail-type"] != "ECS Task State Change":
            continue
        d = e["detail"]
        tasks[d["taskArn"]] = (d["lastStatus"], d["desiredStatus"])
        if i >= before:
            steps += 1
            lowest = min(lowest, sum(t == ("RUNNING", "RUNNING") for t in tasks.values()))
            highest = max(highest, sum(t[0] != "STOPPED" for t in tasks.values()))
    assert steps >= 8, "two tasks started (PENDING, RUNNING) and two stopped (STOPPING…, STOPPED)"
    assert lowest == 2, "never fewer than 2 healthy RUNNING tasks during the rollout"
    assert highest == 3, "one extra task at a time (maximumPercent 150)"


def test_draining_a_host_replaces_its_service_tasks_elsewhere_before_stopping_them(service, ecs, agents):
    ecs.create_service(cluster=CLUSTER, serviceName=service.name, taskDefinition=service.register(SLEEP),
                       desiredCount=2)
    service.wait_steady()
    before = service.tasks()
    drained = before[0]["containerInstanceArn"]
    on_drained = [t["taskArn"] for t in before if t["containerInstanceArn"] == drained]
    ecs.update_container_instances_state(cluster=CLUSTER, containerInstances=[drained], status="DRAINING")
    try:
        service.wait(lambda s: s["runningCount"] == 2 and len(service.tasks()) == 2
                     and drained not in {t["containerInstanceArn"] for t in service.tasks()},
                     "the tasks to move off the draining host")
        changes = task_changes(service.events())
        known = {t["taskArn"] for t in before}
        for arn in on_drained:
            stop_at = next(i for i, d in enumerate(changes) if d["taskArn"] == arn and d["desiredStatus"] == "STOPPED")
            assert changes[stop_at]["stoppedReason"] == "Task stopped during instance draining"
            replaced_at = [i for i, d in enumerate(changes) if d["taskArn"] not in known and d["lastStatus"] == "RUNNING"]
            assert replaced_at and replaced_at[0] < stop_at, "a replacement was RUNNING elsewhere first"
            assert changes[replaced_at[0]]["containerInstanceArn"] != drained
    finally:
        ecs.update_container_instances_state(cluster=CLUSTER, containerInstances=[drained], status="ACTIVE")


def test_a_service_task_killed_from_outside_is_replaced(service, ecs, agents):
    ecs.create_service(cluster=CLUSTER, serviceName=service.name, taskDefinition=service.register(SLEEP),
                       desiredCount=1)
    service.wait_steady()
    [victim] = service.tasks()
    agent = next(a for a in agents if a.arn == victim["containerInstanceArn"])
    os.kill(int((agent.container_dir(victim["taskArn"], "c") / "pid").read_text()), signal.SIGKILL)

    def running() -> list[dict]:
        return [t for t in service.tasks() if t["lastStatus"] == "RUNNING"]

    svc = service.wait(lambda s: s["runningCount"] == 1 and [t["taskArn"] for t in running()] not in (
        [], [victim["taskArn"]]), "a replacement task to run")
    [replacement] = running()
    assert replacement["lastStatus"] == "RUNNING" and replacement["group"] == f"service:{service.name}"
    [dead] = ecs.describe_tasks(cluster=CLUSTER, tasks=[victim["taskArn"]])["tasks"]
    assert dead["lastStatus"] == "STOPPED" and dead["stopCode"] == "EssentialContainerExited"
    assert svc["deployments"][0]["failedTasks"] == 0, "a steady task that dies later is no deployment failure"

    # Deleting: DRAINING, its task stopped by the scheduler, then INACTIVE and no longer listed.
    deleted = ecs.delete_service(cluster=CLUSTER, service=service.name, force=True)["service"]
    assert deleted["status"] == "DRAINING"
    service.wait(lambda s: s["status"] == "INACTIVE", "the service to be INACTIVE")
    [stopped] = ecs.describe_tasks(cluster=CLUSTER, tasks=[replacement["taskArn"]])["tasks"]
    assert stopped["lastStatus"] == "STOPPED" and stopped["stopCode"] == "ServiceSchedulerInitiated"
    assert deleted["serviceArn"] not in ecs.list_services(cluster=CLUSTER)["serviceArns"]
