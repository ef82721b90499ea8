"""One simulated host: what it registers, and the life of the tasks placed on it.

This is the part of a host agent that owns "what runs here", with the process runtime replaced
by the task model (shoal.sim.model): a placed task reports RUNNING after its start delay and
STOPPED with its exit code after its run time; a task whose desiredStatus becomes STOPPED
reports STOPPING, then STOPPED. Snapshots have the shape the real agent's task runner sends
(shoal.agent.task_runner) and go out in order through `report`, a callback the emulator gives.
No I/O here: timers run on the event loop, the network is the emulator's.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from shoal import catalog
from shoal.agent.gpu.base import Gpu
from shoal.agent.host import registration
from shoal.sim.model import Outcome, TaskModel

ESSENTIAL_EXITED = "Essential container in task exited"  # as shoal.agent.task_runner says it
HEALTH_OK = {kind: {"status": "OK"} for kind in
             ("CONTAINER_RUNTIME", "ACCELERATED_COMPUTE", "DAEMON", "AGENT_CONNECTIVITY")}
GPU_NAMESPACE = uuid.UUID("5d1f0c6e-8a52-4bde-9c53-6f0a3b1e2d47")  # fake GPU uuids: stable per host id


@dataclass
class SimTask:
    arn: str
    spec: dict
    outcome: Outcome
    status: str = "PENDING"   # PENDING -> RUNNING -> (STOPPING ->) STOPPED
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    stop_code: str | None = None
    stopped_reason: str | None = None
    times: dict[str, float] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None

    def containers(self) -> list[dict]:
        out = []
        for c in self.spec["containerDefinitions"]:
            status = {"PENDING": "PENDING", "RUNNING": "RUNNING", "STOPPING": "RUNNING"}.get(self.status, "STOPPED")
            snap = {"name": c["name"], "lastStatus": status,
                    "healthStatus": "HEALTHY" if c.get("healthCheck") and status == "RUNNING" else "UNKNOWN"}
            if self.times.get("startedAt"):
                snap["runtimeId"] = f"{self.arn.rsplit('/', 1)[-1]}-{c['name']}"
            if self.exit_codes.get(c["name"]) is not None:
                snap["exitCode"] = self.exit_codes[c["name"]]
            if self.status == "STOPPED" and self.stop_code == "TaskFailedToStart":
                snap["reason"] = self.stopped_reason
            out.append(snap)
        return out

    def snapshot(self) -> dict:
        checked = [c for c in self.spec["containerDefinitions"] if c.get("essential", True) and c.get("healthCheck")]
        snap = {"taskArn": self.arn, "lastStatus": self.status, "containers": self.containers(),
                "healthStatus": "HEALTHY" if checked and self.status == "RUNNING" else "UNKNOWN", **self.times}
        if self.stop_code:
            snap.update(stopCode=self.stop_code, stoppedReason=self.stopped_reason)
        return snap


def essential_environment(spec: dict) -> dict[str, str]:
    """The environment of the task's first essential container, with RunTask's overrides."""
    defs = spec["containerDefinitions"]
    first = next((c for c in defs if c.get("essential", True)), defs[0] if defs else {})
    env = {e["name"]: str(e.get("value", "")) for e in first.get("environment", [])}
    for override in spec.get("overrides", {}).get("containerOverrides", []):
        if override.get("name") == first.get("name"):
            env.update({e["name"]: str(e.get("value", "")) for e in override.get("environment", [])})
    return env


class SimHost:
    """A host of the fleet. `report(host, snapshot)` queues a task snapshot for the server."""

    def __init__(self, *, index: int, host_id: str, cluster: str, instance_type: str, zone: str | None,
                 capacity_provider: str | None, attributes: dict[str, str], model: TaskModel,
                 report: Callable[["SimHost", dict], None] | None = None,
                 shape: tuple[int, float] | None = None):
        self.index, self.host_id, self.cluster = index, host_id, cluster
        self.instance_type, self.zone, self.capacity_provider = instance_type, zone, capacity_provider
        self.attributes, self.model, self._report = attributes, model, report
        self.shape = shape  # (vCPUs, GiB) of a CPU-only host the catalog does not list
        self.arn: str | None = None        # the container instance ARN, once registered
        self.token: str | None = None      # the host's own credential, once registered
        self.status: str | None = None     # as the latest poll answered (REGISTERING, ACTIVE, …)
        self.tasks: dict[str, SimTask] = {}  # running, or stopped and not yet acknowledged
        # STOPPED and acknowledged, with the sequence number of the task's latest listing: an
        # answer that lists it again (one read before the STOPPED report landed) is ignored.
        self.done: dict[str, int] = {}
        self.outbox: list[dict] = []         # snapshots not yet accepted, in order
        self.queued = False                  # in the emulator's report queue
        self.silenced = False                # stopped polling on purpose (a lost agent)
        self.poller: asyncio.Task | None = None
        self.faults = None  # shoal.sim.faults.HostFaults, once a chaos order came

    # -- registration ------------------------------------------------------------------------
    def gpus(self) -> list[Gpu]:
        if self.shape is not None:
            return []
        spec = catalog.get(self.instance_type).gpu
        if spec is None:
            return []
        return [Gpu(i, f"GPU-{uuid.uuid5(GPU_NAMESPACE, f'{self.host_id}/{i}')}", spec.model, spec.memory_mib)
                for i in range(spec.count)]

    def registration(self, version: str) -> dict:
        # The real agent's own body builder, in its simulated mode: catalog CPU, memory and GPUs,
        # shoal.simulated=true, and the MPS capability (simulated GPUs come with simulated MPS).
        return registration(cluster=self.cluster, capacity_provider=self.capacity_provider, host=self.host_id,
                            instance_type=self.instance_type, availability_zone=self.zone, simulate=True,
                            gpus=self.gpus(), attributes=self.attributes,
                            enforced={"memory": False, "cpu": False}, runtime="simulated", version=version,
                            mps=True, shape=self.shape)

    # -- desired state -----------------------------------------------------------------------
    def reconcile(self, desired: list[dict], *, full: bool = True, cursor: int = 0) -> None:
        """Act on a poll answer (every task, or what changed since the last one): start new
        tasks, stop those whose desiredStatus is STOPPED."""
        listed = set()
        for spec in desired:
            arn = spec["taskArn"]
            listed.add(arn)
            if arn in self.done or spec["lastStatus"] == "STOPPED":
                continue
            task = self.tasks.get(arn)
            if task is None:
                task = SimTask(arn, spec, self.model.outcome(arn, essential_environment(spec)))
                self.tasks[arn] = task
                if spec["desiredStatus"] == "STOPPED":
                    self._finish(task)  # stopped before it reached us: it never runs
                else:
                    self._later(task, task.outcome.start_delay, self._start)
            elif spec["desiredStatus"] == "STOPPED":
                self._stop(task)
        # Past every stale answer: one that no longer lists a finished task, or whose cursor has
        # passed the task's latest change (later answers list it only if it changes again).
        if self.done:
            self.done = {arn: seq for arn, seq in self.done.items() if (arn in listed if full else seq > cursor)}

    def acknowledged(self, state: dict) -> None:
        """The server's answer to a report: forget tasks it has as STOPPED."""
        task = self.tasks.get(state["taskArn"])
        if state["lastStatus"] == "STOPPED" and task is not None and task.status == "STOPPED":
            del self.tasks[task.arn]
            self.done[task.arn] = task.spec.get("seq") or 0

    def close(self) -> None:
        for task in self.tasks.values():
            if task.timer is not None:
                task.timer.cancel()

    # -- transitions -------------------------------------------------------------------------
    def _later(self, task: SimTask, delay: float, step) -> None:
        task.timer = asyncio.get_running_loop().call_later(delay, step, task)

    def _send(self, task: SimTask) -> None:
        self._report(self, task.snapshot())

    def _start(self, task: SimTask) -> None:
        now = time.time()
        task.timer = None
        task.times["pullStartedAt"] = task.times["pullStoppedAt"] = now
        refused = self.faults.gate(task) if self.faults is not None else None
        if task.outcome.fails_to_start or refused:
            task.stop_code = "TaskFailedToStart"
            task.stopped_reason = refused or "CannotStartContainerError: simulated start failure"
            self._finish(task)
            return
        task.status = "RUNNING"
        task.times["startedAt"] = now
        self._send(task)
        if task.outcome.run_time is not None:
            self._later(task, task.outcome.run_time, self._exit)

    def _exit(self, task: SimTask) -> None:
        """The essential containers exit on their own; the agent stops the others."""
        task.timer = None
        for c in task.spec["containerDefinitions"]:
            essential = c.get("essential", True)
            task.exit_codes[c["name"]] = task.outcome.exit_code if essential else self.model.stop_exit_code
        task.stop_code, task.stopped_reason = "EssentialContainerExited", ESSENTIAL_EXITED
        self._finish(task)

    def fail(self, task: SimTask, stop_code: str, reason: str, exit_code: int = 1) -> None:
        """The task's containers exit on their own (a fault made them): STOPPED with `reason`."""
        if task.status == "STOPPED":
            return
        if task.timer is not None:
            task.timer.cancel()
            task.timer = None
        for c in task.spec["containerDefinitions"]:
            task.exit_codes[c["name"]] = exit_code if task.times.get("startedAt") else None
        task.stop_code, task.stopped_reason = stop_code, reason
        self._finish(task)

    def _stop(self, task: SimTask) -> None:
        if task.status in ("STOPPING", "STOPPED"):
            return
        if task.timer is not None:
            task.timer.cancel()
            task.timer = None
        if task.status == "PENDING":  # nothing started yet: nothing to stop
            self._finish(task)
            return
        task.status = "STOPPING"
        task.times["stoppingAt"] = time.time()
        self._send(task)
        self._later(task, self.model.stop_delay, self._stopped)

    def _stopped(self, task: SimTask) -> None:
        task.timer = None
        for c in task.spec["containerDefinitions"]:
            task.exit_codes[c["name"]] = self.model.stop_exit_code
        self._finish(task)

    def _finish(self, task: SimTask) -> None:
        now = time.time()
        task.status = "STOPPED"
        for key in ("stoppingAt", "executionStoppedAt", "stoppedAt"):
            task.times.setdefault(key, now)
        self._send(task)
