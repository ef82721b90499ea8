"""Stories of tasks run for real: boto3 against a real `shoal server`, and a real `shoal agent`
process that runs each container under its shim, as a child process of this machine.

Every test runs tasks in cluster `default` on one ACTIVE host (the module's agent) and reads the
truth twice: through the ECS API (DescribeTasks, DescribeContainerInstances, the event log) and
in the agent's container directories (`<agent-data-dir>/tasks/<task-id>/<container>/`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest

from shoal.agent import cgroups
from shoal.agent.runtime import shims
from tests.agent_support import AgentProcess
from tests.support import wait_for

CLUSTER = "default"
PY = sys.executable  # a real interpreter on this machine, for workloads that need more than sh


@pytest.fixture(scope="module")
def agent(server, ecs, tmp_path_factory):
    """A started server with cluster `default` and one ACTIVE agent on it, for the whole module.
    At the end the agent stops and whatever still runs under its data dir is killed."""
    ecs.create_cluster(clusterName=CLUSTER)
    proc = AgentProcess(server, tmp_path_factory.mktemp("agent") / "data")
    try:
        proc.start().wait_active(ecs)
        yield proc
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            # Deregistering answers the agent's long-poll with INACTIVE and the agent exits on its
            # own. (A poll left open by an agent stopped mid-poll would hold the server's graceful
            # shutdown for up to its 20 s wait.)
            ecs.deregister_container_instance(cluster=CLUSTER, containerInstance=proc.arn, force=True)
            try:
                proc.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        proc.stop()
        proc.kill_leftovers()


class Story:
    """One test's view of the host: register and run task definitions, read tasks back, and
    wait on conditions. Tasks it ran are stopped (and waited for) when the test ends, so every
    test starts on an idle host."""

    def __init__(self, ecs, agent: AgentProcess, name: str):
        self.ecs, self.agent, self.name = ecs, agent, name
        self.task_arns: list[str] = []

    def register(self, *containers: dict, **task: object) -> str:
        for c in containers:
            c.setdefault("image", "busybox")  # recorded, not used by the process runtime
        td = self.ecs.register_task_definition(family=self.name, containerDefinitions=list(containers), **task)
        return td["taskDefinition"]["taskDefinitionArn"]

    def run(self, td_arn: str) -> str:
        out = self.ecs.run_task(cluster=CLUSTER, taskDefinition=td_arn)
        assert out["failures"] == [], f"RunTask failed: {out['failures']}"
        task = out["tasks"][0]
        self.task_arns.append(task["taskArn"])
        assert task.get("containerInstanceArn") == self.agent.arn, \
            f"RunTask should place the task on the only ACTIVE host at once, got {task.get('containerInstanceArn')}"
        return task["taskArn"]

    def task(self, arn: str) -> dict:
        return self.ecs.describe_tasks(cluster=CLUSTER, tasks=[arn])["tasks"][0]

    def container(self, arn: str, name: str, task: dict | None = None) -> dict:
        task = task or self.task(arn)
        return next(c for c in task["containers"] if c["name"] == name)

    def wait_task(self, arn: str, predicate, what: str, timeout: float = 10) -> dict:
        """Poll DescribeTasks until `predicate(task)`; the failure message shows the last state."""
        last = {}

        def check():
            last["task"] = self.task(arn)
            return last["task"] if predicate(last["task"]) else None
        try:
            return wait_for(check, timeout=timeout, interval=0.05, message=what)
        except AssertionError as err:
            raise AssertionError(f"{err}; last state: {_brief(last.get('task'))}\n"
                                 f"agent log tail:\n{self.agent.log_tail(2000)}") from None

    def wait_status(self, arn: str, status: str, timeout: float = 10) -> dict:
        return self.wait_task(arn, lambda t: t["lastStatus"] == status, f"task to be {status}", timeout)

    def host(self) -> dict:
        return self.ecs.describe_container_instances(cluster=CLUSTER, containerInstances=[self.agent.arn]
                                                     )["containerInstances"][0]

    def cleanup(self) -> None:
        for arn in self.task_arns:
            if self.task(arn)["lastStatus"] != "STOPPED":
                self.ecs.stop_task(cluster=CLUSTER, task=arn, reason="test cleanup")
        for arn in self.task_arns:
            self.wait_status(arn, "STOPPED", timeout=15)


@pytest.fixture
def story(agent, ecs, unique):
    if agent.proc.poll() is not None:  # an earlier test killed it and failed before restarting it
        agent.start().wait_active(ecs)
    s = Story(ecs, agent, unique("story"))
    yield s
    if agent.proc.poll() is None:
        s.cleanup()


def _brief(task: dict | None) -> dict | None:
    if task is None:
        return None
    keys = ("lastStatus", "desiredStatus", "healthStatus", "stopCode", "stoppedReason")
    return {**{k: task.get(k) for k in keys},
            "containers": [{k: c.get(k) for k in ("name", "lastStatus", "exitCode", "reason", "healthStatus")}
                           for c in task["containers"]]}


def _epoch(value: datetime) -> float:
    return value.timestamp()


def _resources(host: dict, which: str) -> dict[str, int]:
    return {r["name"]: r["integerValue"] for r in host[which] if r["name"] in ("CPU", "MEMORY")}


def _attribute(host: dict, name: str) -> str | None:
    return next((a.get("value") for a in host["attributes"] if a["name"] == name), None)


# -- the stories ---------------------------------------------------------------------------------
def test_a_task_that_exits_3_stops_with_its_exit_code_and_tells_its_story_in_events(server, story):
    td = story.register({"name": "main", "memory": 64, "command": ["sh", "-c", "echo hi; sleep 1; exit 3"]})
    arn = story.run(td)

    task = story.wait_status(arn, "STOPPED")
    main = story.container(arn, "main", task)
    assert main["exitCode"] == 3, f"the container exited 3, DescribeTasks says {_brief(task)}"
    assert task["stopCode"] == "EssentialContainerExited", _brief(task)
    assert task["stoppedReason"] == "Essential container in task exited", _brief(task)
    assert task["desiredStatus"] == "STOPPED"
    assert _epoch(task["startedAt"]) <= _epoch(task["stoppedAt"])

    events = [e for e in server.events() if e["resources"] == [arn]]
    assert {e["detail-type"] for e in events} == {"ECS Task State Change"}, events
    statuses = [e["detail"]["lastStatus"] for e in events]
    versions = [e["detail"]["version"] for e in events]
    assert all(a < b for a, b in zip(versions, versions[1:])), \
        f"detail.version must strictly increase event by event, got {versions} for {statuses}"
    assert {"PENDING", "RUNNING", "STOPPED"} <= set(statuses), f"missing lifecycle steps in {statuses}"
    order = ["PROVISIONING", "PENDING", "ACTIVATING", "RUNNING", "DEACTIVATING", "STOPPING", "DEPROVISIONING",
             "STOPPED"]
    assert statuses == sorted(statuses, key=order.index), f"events out of lifecycle order: {statuses}"
    assert statuses[-1] == "STOPPED" and statuses.count("STOPPED") == 1, statuses
    last = events[-1]["detail"]
    assert last["stopCode"] == "EssentialContainerExited"
    assert last["containers"][0]["exitCode"] == 3, last["containers"]


def test_stop_task_kills_a_process_that_ignores_sigterm_after_its_stop_timeout(story):
    # The workload ignores SIGTERM (the shim signals its whole process group, so a shell's child
    # would die of it: the ignoring process must be the whole workload) and says so once it does.
    ignore_term = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "print('ignoring TERM', flush=True); time.sleep(600)")
    td = story.register({"name": "stubborn", "memory": 64, "stopTimeout": 2, "command": [PY, "-c", ignore_term]})
    arn = story.run(td)
    story.wait_status(arn, "RUNNING")
    stdout = story.agent.container_dir(arn, "stubborn") / "stdout.log"
    wait_for(lambda: "ignoring TERM" in stdout.read_text(), message="the workload to ignore SIGTERM")

    asked = time.time()
    stopping = story.ecs.stop_task(cluster=CLUSTER, task=arn, reason="enough")["task"]
    assert stopping["desiredStatus"] == "STOPPED"
    task = story.wait_status(arn, "STOPPED", timeout=10)
    took = time.time() - asked

    assert took >= 2.0, f"SIGKILL must wait out stopTimeout 2 s, but the task stopped after {took:.2f}s"
    assert took < 10, f"stopTimeout is 2 s, not the 30 s default: the task took {took:.2f}s to stop"
    assert _epoch(task["stoppedAt"]) - asked >= 2.0, (asked, task["stoppedAt"])
    assert task["stopCode"] == "UserInitiated" and task["stoppedReason"] == "enough", _brief(task)
    assert story.container(arn, "stubborn", task)["exitCode"] == 137, \
        f"SIGKILL after the timeout reads exitCode 137: {_brief(task)}"


def test_a_failing_health_check_marks_a_healthy_task_unhealthy(story, tmp_path):
    flag = tmp_path / "healthy"
    flag.touch()
    td = story.register({"name": "web", "memory": 64, "command": ["sleep", "600"],
                         "healthCheck": {"command": ["CMD-SHELL", f"test -f {flag}"],
                                         "interval": 5, "timeout": 2, "retries": 1}})  # ECS minimums
    arn = story.run(td)

    task = story.wait_task(arn, lambda t: t["healthStatus"] == "HEALTHY", "the task to be HEALTHY", timeout=10)
    assert story.container(arn, "web", task)["healthStatus"] == "HEALTHY", _brief(task)
    assert task["lastStatus"] == "RUNNING"

    flag.unlink()  # the check starts failing; one failure (retries 1) makes it UNHEALTHY
    task = story.wait_task(arn, lambda t: t["healthStatus"] == "UNHEALTHY", "the task to be UNHEALTHY",
                           timeout=10)
    assert story.container(arn, "web", task)["healthStatus"] == "UNHEALTHY", _brief(task)
    assert task["lastStatus"] == "RUNNING", f"an unhealthy standalone task keeps running: {_brief(task)}"


def test_depends_on_healthy_holds_a_container_back_until_its_dependency_is_healthy(story, tmp_path):
    flag = tmp_path / "db-ready"
    td = story.register(
        {"name": "db", "memory": 64, "command": ["sleep", "600"],
         "healthCheck": {"command": ["CMD-SHELL", f"test -f {flag}"], "interval": 5, "timeout": 2, "retries": 1}},
        {"name": "app", "memory": 64, "command": ["sh", "-c", "echo app started; exec sleep 600"],
         "dependsOn": [{"containerName": "db", "condition": "HEALTHY"}]})
    arn = story.run(td)
    app_dir = story.agent.container_dir(arn, "app")

    # db runs, its first probe fails: app must still wait, and no shim was started for it.
    task = story.wait_task(arn, lambda t: story.container(arn, "db", t)["healthStatus"] == "UNHEALTHY",
                           "db's first health probe to fail", timeout=10)
    assert story.container(arn, "db", task)["lastStatus"] == "RUNNING", _brief(task)
    assert story.container(arn, "app", task)["lastStatus"] == "PENDING", \
        f"app depends on db HEALTHY and db is not: {_brief(task)}"
    assert task["lastStatus"] == "PENDING", f"a task is RUNNING only once all its containers are: {_brief(task)}"
    assert not app_dir.exists(), f"app must not have been launched yet, but {app_dir} exists"

    flag.touch()
    created = time.time()
    task = story.wait_task(arn, lambda t: story.container(arn, "app", t)["lastStatus"] == "RUNNING",
                           "app to start once db is HEALTHY", timeout=10)
    assert story.container(arn, "db", task)["healthStatus"] == "HEALTHY", _brief(task)
    app_started = float((app_dir / "started_at").read_text())
    assert app_started > created, \
        f"app started {created - app_started:.2f}s before db could be healthy (the flag was created)"
    assert task["lastStatus"] == "RUNNING", _brief(task)
    wait_for(lambda: "app started" in (app_dir / "stdout.log").read_text(), message="app's first line")


def test_a_containers_output_is_kept_in_its_directory(story):
    td = story.register({"name": "talker", "memory": 64,
                         "command": ["sh", "-c", "echo line one; echo line two; echo oops >&2"]})
    arn = story.run(td)
    task = story.wait_status(arn, "STOPPED")
    assert story.container(arn, "talker", task)["exitCode"] == 0, _brief(task)

    cdir = story.agent.container_dir(arn, "talker")
    assert (cdir / "stdout.log").read_text() == "line one\nline two\n", \
        f"stdout.log of {cdir} should hold exactly what the workload printed"
    assert (cdir / "stderr.log").read_text() == "oops\n", f"stderr.log of {cdir}"


def test_a_memory_limit_is_enforced_where_the_host_says_it_is(story):
    hog = ("b = bytearray(256 * 1024 * 1024); print('allocated', len(b), flush=True); "
           "import time; time.sleep(2)")
    td = story.register({"name": "hog", "memory": 64, "command": [PY, "-c", hog]})
    enforced = _attribute(story.host(), "shoal.cgroups.memory")
    assert enforced in ("enforced", "not-enforced"), f"host attribute shoal.cgroups.memory = {enforced!r}"

    arn = story.run(td)
    task = story.wait_status(arn, "STOPPED", timeout=15)
    hog_container = story.container(arn, "hog", task)
    stdout = (story.agent.container_dir(arn, "hog") / "stdout.log").read_text()
    if enforced == "enforced":
        assert hog_container["exitCode"] == 137, f"256 MiB in a 64 MiB container must be OOM-killed: {_brief(task)}"
        assert "OutOfMemoryError" in hog_container.get("reason", ""), _brief(task)
        assert "OutOfMemoryError" in task["stoppedReason"], _brief(task)
        assert "allocated" not in stdout, f"the allocation should never have succeeded: {stdout!r}"
    else:
        assert hog_container["exitCode"] == 0, f"the host does not enforce memory: nothing may kill it: {_brief(task)}"
        assert "allocated 268435456" in stdout, stdout
        assert "OutOfMemoryError" not in (hog_container.get("reason") or ""), _brief(task)


def test_a_task_outlives_a_killed_agent_and_its_exit_is_reported_after_the_restart(story, ecs, tmp_path):
    flag = tmp_path / "finish"
    td = story.register({"name": "worker", "memory": 64,
                         "environment": [{"name": "FLAG", "value": str(flag)}],
                         "command": ["sh", "-c", 'echo started; while [ ! -e "$FLAG" ]; do sleep 0.05; done; exit 7']})
    arn = story.run(td)
    story.wait_status(arn, "RUNNING")
    cdir = story.agent.container_dir(arn, "worker")
    handle = shims.attach(cdir)
    pid = handle.pid()

    story.agent.kill(signal.SIGKILL)
    assert handle.workload_alive(), f"the workload (pid {pid}) must survive kill -9 of the agent"
    assert handle.alive(), "so must its shim"

    flag.touch()  # the workload exits while no agent runs; its shim records the exit
    wait_for(lambda: handle.exit_status() is not None, message="the shim to record the exit")
    assert handle.exit_status()["exitCode"] == 7
    assert story.task(arn)["lastStatus"] == "RUNNING", "nobody could have reported the exit yet"

    story.agent.start()
    task = story.wait_status(arn, "STOPPED")
    assert story.container(arn, "worker", task)["exitCode"] == 7, _brief(task)
    assert task["stopCode"] == "EssentialContainerExited", _brief(task)
    assert story.agent.wait_active(ecs)["containerInstanceArn"] == story.agent.arn, "the same host came back"

    assert (cdir / "stdout.log").read_text().splitlines() == ["started"], \
        "the container must have run exactly once: one 'started' line"
    shim_log = (cdir / "shim.log").read_text()
    assert shim_log.count("started pid") == 1, f"one shim, one workload start:\n{shim_log}"
    task_dirs = [d for d in story.agent.container_dirs() if d.parent.name == arn.rsplit("/", 1)[-1]]
    assert task_dirs == [cdir], task_dirs


def test_stop_task_stops_a_running_task_and_gives_its_resources_back(story):
    td = story.register({"name": "idle", "cpu": 256, "memory": 128, "command": ["sleep", "600"]})
    registered = _resources(story.host(), "registeredResources")
    assert _resources(story.host(), "remainingResources") == registered, "the host should start idle"

    arn = story.run(td)
    story.wait_status(arn, "RUNNING")
    held = _resources(story.host(), "remainingResources")
    assert held == {"CPU": registered["CPU"] - 256, "MEMORY": registered["MEMORY"] - 128}, (held, registered)

    story.ecs.stop_task(cluster=CLUSTER, task=arn, reason="done here")
    task = story.wait_status(arn, "STOPPED")
    assert task["stopCode"] == "UserInitiated" and task["stoppedReason"] == "done here", _brief(task)
    assert story.container(arn, "idle", task)["exitCode"] == 143, f"sleep dies of SIGTERM: {_brief(task)}"
    wait_for(lambda: _resources(story.host(), "remainingResources") == registered,
             message=f"remainingResources to return to the registered {registered}")


def test_an_oom_kill_while_the_agent_is_down_is_reported_after_the_restart(story, tmp_path):
    if _attribute(story.host(), "shoal.cgroups.memory") != "enforced":
        pytest.skip("this host does not enforce memory limits (shoal.cgroups.memory is not 'enforced')")
    flag = tmp_path / "allocate"
    td = story.register({"name": "hog", "memory": 64, "environment": [{"name": "FLAG", "value": str(flag)}],
                         "command": ["sh", "-c", 'while [ ! -e "$FLAG" ]; do sleep 0.05; done; '
                                     f'exec {PY} -c "bytearray(256 * 1024 * 1024)"']})
    arn = story.run(td)
    story.wait_status(arn, "RUNNING")
    handle = shims.attach(story.agent.container_dir(arn, "hog"))

    story.agent.kill(signal.SIGKILL)
    flag.touch()  # the workload now outgrows its 64 MiB while no agent watches
    wait_for(lambda: handle.exit_status() is not None, message="the shim to record the OOM kill")
    assert handle.exit_status()["exitCode"] == 137, handle.exit_status()

    story.agent.start()
    task = story.wait_status(arn, "STOPPED")
    hog = story.container(arn, "hog", task)
    assert hog["exitCode"] == 137 and "OutOfMemoryError" in hog.get("reason", ""), \
        f"the restarted agent must read the OOM kill from the container's cgroup: {_brief(task)}"
    assert "OutOfMemoryError" in task["stoppedReason"], _brief(task)
    leaf = cgroups.detect(probe=False).memory.hierarchy / f"shoal-{story.agent.identity['hostId']}" / \
        f"{arn.rsplit('/', 1)[-1]}-hog"
    assert not leaf.exists(), f"the stopped container's cgroup {leaf} should be removed"
