"""One task on this host: start its containers in dependency order, watch them, stop them, and
report every transition the moment it happens.

Each container runs under its own shim (shoal.agent.runtime.shim), in
`<data-dir>/tasks/<task-id>/<container-name>/`. The directory is the record: a container whose
directory has a shim is never started again, so a restarted agent adopts what runs and reads
the exits it missed. Exits are seen through a pidfd on the shim (readable the instant the shim
exits, right after it wrote exit.json): no polling.

A task with an MPS share passes the agent's MPS gate (its GPU's control daemon answers) before
any of its containers is created, and on stop its MPS clients are evicted through the control
interface before its containers are stopped (shoal.agent.mps.supervisor).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from shoal.agent import health as hc
from shoal.agent.runtime import shims
from shoal.agent.runtime.files import write_atomic
from shoal.agent.runtime.gpus import mps_share

log = logging.getLogger(__name__)
TASK_FILE = "task.json"
DEFAULT_STOP_TIMEOUT = 30.0
ESSENTIAL_EXITED = "Essential container in task exited"
OOM_REASON = "OutOfMemoryError: Container killed due to memory usage"


@dataclass
class Container:
    name: str
    definition: dict
    arn: str = ""
    gpu_ids: list[str] = field(default_factory=list)
    status: str = "PENDING"  # PENDING -> RUNNING -> STOPPED
    exit_code: int | None = None
    reason: str | None = None
    health: str = hc.UNKNOWN
    handle: shims.ShimHandle | None = None
    checker: hc.HealthChecker | None = None
    cgroup: object | None = None
    launching: bool = False

    @property
    def essential(self) -> bool:
        return self.definition.get("essential", True)

    def public(self) -> dict:
        out = {"name": self.name, "lastStatus": self.status, "healthStatus": self.health}
        if self.exit_code is not None:
            out["exitCode"] = self.exit_code
        if self.reason:
            out["reason"] = self.reason[:255]
        if self.handle is not None:
            out["runtimeId"] = f"{self.handle.dir.parent.name}-{self.name}"
        return out


class TaskRunner:
    """Drives one task to its desired state. `runtime` builds the container's command line and
    environment (process or podman); `report(snapshot)` sends a snapshot to the control plane."""

    def __init__(self, spec: dict, task_dir: Path, runtime, report: Callable[[dict], None], launcher=None,
                 mps=None):
        self.spec, self.dir, self.runtime, self._report = spec, task_dir, runtime, report
        self.launcher = launcher  # the agent's shim fork server (None: start shims as new interpreters)
        self.mps = mps  # the agent's MpsSupervisor (None: no MPS on this host)
        self._mps_released = False
        self.arn = spec["taskArn"]
        self.desired = spec["desiredStatus"]
        self.status = "PENDING"
        self.stop_code: str | None = None
        self.stopped_reason: str | None = None
        self.times: dict[str, float] = {}
        overrides = {o["name"]: o for o in spec.get("overrides", {}).get("containerOverrides", [])}
        assigned = {c["name"]: c for c in spec["containers"]}
        self.containers = {
            d["name"]: Container(d["name"], _with_overrides(d, overrides.get(d["name"], {})),
                                 assigned.get(d["name"], {}).get("containerArn", ""),
                                 assigned.get(d["name"], {}).get("gpuIds", []))
            for d in spec["containerDefinitions"]}
        self._wake = asyncio.Event()
        self._fds: list[int] = []
        self._background: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks
        self.done = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task | None = None  # the agent's handle on run()

    # -- inputs --------------------------------------------------------------------------
    def set_desired(self, desired: str) -> None:
        if desired != self.desired:
            self.desired = desired
            self._wake.set()

    def abort(self, stop_code: str, reason: str) -> None:
        """Stop the task for a reason of the host's (e.g. its GPU's MPS server failed); one whose
        containers have not started yet fails to start."""
        if not self.stop_code:
            started = any(c.handle is not None or c.launching for c in self.containers.values())
            self.stop_code = stop_code if started else "TaskFailedToStart"
            self.stopped_reason = reason[:255]
        self._wake.set()

    @property
    def mps_gpu(self) -> str | None:
        """The GPU of the task's MPS share (all MPS containers of a task are on one GPU), if any."""
        for c in self.containers.values():
            if mps_share(c.definition) is not None and c.gpu_ids:
                return c.gpu_ids[0]
        return None

    def _mps_containers(self) -> list[Container]:
        return [c for c in self.containers.values() if mps_share(c.definition) is not None]

    async def _mps_gate(self) -> None:
        """Before any MPS container is created: the GPU's MPS control daemon must answer (ECS
        §2.3); otherwise the task stops with TaskFailedToStart and no container is made."""
        pending = [c for c in self._mps_containers() if c.status == "PENDING" and c.handle is None]
        if not pending or self.desired == "STOPPED" or self.stop_code:
            return
        gpu = self.mps_gpu
        if gpu is None:
            reason = f"CannotStartContainerError: MPS container {pending[0].name} has no GPU assigned"
        elif self.mps is None:
            reason = "MPS control daemon is not available on this instance"
        else:
            reason = await self.mps.gate(gpu)
        if reason:
            log.warning("task %s: %s", self.arn, reason)
            self._fail(reason)

    # -- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await asyncio.to_thread(self._record_spec)  # an fsync: not on the event loop
            self._adopt()
            await self._mps_gate()
            while True:
                if self.desired == "STOPPED" or self.stop_code:
                    if await self._stop_all():
                        break
                else:
                    self._check_essential()
                    if not self.stop_code:
                        self._start_ready()
                        self._maybe_running()
                await self._wake.wait()
                self._wake.clear()
            self._finish()
        except Exception:
            log.exception("task %s failed in the agent", self.arn)
            self.stop_code = self.stop_code or "TaskFailedToStart"
            self.stopped_reason = self.stopped_reason or "InternalError: the agent failed to run the task"
            for c in self.containers.values():
                if c.status != "RUNNING":
                    c.status = "STOPPED"
            self._finish()
        finally:
            if not self.done.done():
                self.done.set_result(None)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _record_spec(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.dir / TASK_FILE).exists():
            write_atomic(self.dir / TASK_FILE, json.dumps(self.spec).encode())

    def _adopt(self) -> None:
        """Re-attach to containers started before (by this agent before a restart)."""
        for c in self.containers.values():
            try:
                c.handle = shims.attach(self.dir / c.name)
            except FileNotFoundError:
                continue
            # Its cgroup (kept across the restart; created again if already gone) tells an OOM kill
            # that happened while we were away, and is removed with the task as usual.
            c.cgroup = self.runtime.cgroup(self, c)
            exit_status = c.handle.exit_status()
            if exit_status is not None:
                self._exited(c, exit_status, report=False)
            elif c.handle.alive():
                c.status = "RUNNING"
                self._watch(c)
                self._start_health(c, c.handle.started_at())
            else:  # the shim died unrecorded (kill -9 of the shim itself)
                if c.handle.workload_alive():
                    c.handle.stop()  # nothing can record its end now: end it
                c.status, c.reason = "STOPPED", "ContainerRuntimeError: the container's shim was lost"
        started = [c.handle.started_at() for c in self.containers.values() if c.handle and c.handle.started_at()]
        if started:
            self.times["startedAt"] = min(started)
        if any(c.status != "PENDING" for c in self.containers.values()):
            self._check_essential()
            self._maybe_running()
            self.report()  # whatever happened while we were away

    def _deps_state(self, c: Container) -> str:
        """'ready', 'wait' or 'never' for a container's dependsOn conditions."""
        for dep in c.definition.get("dependsOn", []):
            other, cond = self.containers[dep["containerName"]], dep["condition"]
            if cond == "START":
                ok, never = other.status != "PENDING", False
            elif cond == "COMPLETE":
                ok, never = other.status == "STOPPED", False
            elif cond == "SUCCESS":
                ok = other.status == "STOPPED" and other.exit_code == 0
                never = other.status == "STOPPED" and other.exit_code != 0
            else:  # HEALTHY
                ok, never = other.health == hc.HEALTHY, other.status == "STOPPED"
            if never or (other.status == "STOPPED" and other.handle is None):
                return "never"
            if not ok:
                return "wait"
        return "ready"

    def _start_ready(self) -> None:
        for c in self.containers.values():
            if c.status != "PENDING" or c.launching:
                continue
            deps = self._deps_state(c)
            if deps == "never":
                names = ", ".join(d["containerName"] for d in c.definition.get("dependsOn", []))
                self._fail(f"CannotStartContainerError: dependency condition of container {c.name} "
                           f"on {names} can no longer be met")
                return
            if deps == "ready":
                c.launching = True
                self._spawn(self._launch(c))

    async def _launch(self, c: Container) -> None:
        try:
            argv, env, cwd, cgroup = self.runtime.prepare(self, c)
            stop_timeout = float(c.definition.get("stopTimeout") or DEFAULT_STOP_TIMEOUT)
            c.cgroup = cgroup
            self.times.setdefault("pullStartedAt", time.time())
            try:
                c.handle = await asyncio.to_thread(shims.launch, self.dir / c.name, argv, env, cwd, stop_timeout,
                                                   cgroup.paths if cgroup else (), self.launcher)
            except shims.AlreadyLaunched:
                c.handle = shims.attach(self.dir / c.name)
            self.times.setdefault("pullStoppedAt", time.time())
        except Exception as err:
            c.launching = False
            c.status, c.reason = "STOPPED", f"CannotStartContainerError: {err}"[:255]
            self._fail(c.reason)
            return
        c.launching = False
        exit_status = c.handle.exit_status()
        if exit_status is not None and exit_status.get("exitCode") is None:
            c.status, c.reason = "STOPPED", f"CannotStartContainerError: {exit_status.get('error')}"[:255]
            self._fail(c.reason)
            return
        c.status = "RUNNING"
        self.times.setdefault("startedAt", c.handle.started_at() or time.time())
        self._watch(c)
        self._start_health(c, c.handle.started_at())
        self._maybe_running()
        self.report()
        self._wake.set()

    def _watch(self, c: Container) -> None:
        """Call `_exited` when the container's shim exits (it writes exit.json just before)."""
        loop = asyncio.get_running_loop()
        pid = c.handle.shim_pid()
        try:
            fd = os.pidfd_open(pid)
        except (ProcessLookupError, OSError, TypeError):
            self._spawn(self._poll_exit(c))  # no pidfd here (or the shim is gone): fall back
            return
        self._fds.append(fd)

        def readable() -> None:
            loop.remove_reader(fd)
            self._fds.remove(fd)
            os.close(fd)
            self._exited(c, c.handle.wait(1.0) or {})

        loop.add_reader(fd, readable)

    async def _poll_exit(self, c: Container) -> None:
        while c.status != "STOPPED":
            status = c.handle.exit_status()
            if status is not None or not c.handle.alive():
                self._exited(c, status or {})
                return
            await asyncio.sleep(0.05)

    def _exited(self, c: Container, status: dict, report: bool = True) -> None:
        if c.status == "STOPPED" and c.exit_code is not None:
            return
        c.status = "STOPPED"
        c.exit_code = status.get("exitCode")
        if status.get("error"):
            c.reason = f"CannotStartContainerError: {status['error']}"
        elif not status:
            c.reason = "ContainerRuntimeError: the container's shim exited without recording the exit"
        if c.cgroup is not None and c.cgroup.oom_killed():
            c.reason = OOM_REASON
        if c.checker is not None:
            c.checker.stop(timeout=0)
        if report:
            self._check_essential()
            self._maybe_running()
            if not (self.stop_code and self._all_ended()):  # else the STOPPED report follows at once
                self.report()
            self._wake.set()

    def _all_ended(self) -> bool:
        return all(c.status != "RUNNING" and not c.launching for c in self.containers.values())

    def _start_health(self, c: Container, started_at: float | None) -> None:
        check = c.definition.get("healthCheck")
        if not check or c.checker is not None:
            return
        loop = asyncio.get_running_loop()
        spec = hc.HealthCheckSpec.from_ecs(check)

        def changed(status: str, _output: str) -> None:  # HealthChecker passes (new status, probe output)
            loop.call_soon_threadsafe(self._health_changed, c, status)

        spec, env, cwd = self.runtime.health_probe(self, c, spec)  # podman: the probe runs in the container
        c.checker = hc.HealthChecker(spec, env, cwd, changed)
        since = None if started_at is None else time.monotonic() - max(0.0, time.time() - started_at)
        c.checker.start(since)

    def _health_changed(self, c: Container, status: str) -> None:
        if c.status != "RUNNING":
            return
        c.health = status
        self.report()
        self._wake.set()  # a dependsOn HEALTHY may now be met

    def _check_essential(self) -> None:
        if self.stop_code:
            return
        for c in self.containers.values():
            if c.essential and c.status == "STOPPED":
                self.stop_code, self.stopped_reason = "EssentialContainerExited", ESSENTIAL_EXITED
                if c.reason == OOM_REASON:
                    self.stopped_reason = f"{ESSENTIAL_EXITED}: {c.name} {OOM_REASON}"
                return

    def _fail(self, reason: str) -> None:
        if not self.stop_code:
            self.stop_code, self.stopped_reason = "TaskFailedToStart", reason[:255]
        self._wake.set()

    def _maybe_running(self) -> None:
        """RUNNING once every container has started (or has already run to its end)."""
        if self.status == "PENDING" and all(c.status != "PENDING" for c in self.containers.values()) \
                and any(c.handle is not None for c in self.containers.values()) and not self.stop_code:
            self.status = "RUNNING"

    async def _stop_all(self) -> bool:
        """Ask every running container to stop; True once all have stopped."""
        if self.status not in ("STOPPING", "STOPPED") and any(c.status == "RUNNING" for c in self.containers.values()):
            self.status = "STOPPING"
            self.times.setdefault("stoppingAt", time.time())
            self.report()
        running = [c for c in self.containers.values() if c.status == "RUNNING"]
        if self.mps is not None and not self._mps_released and any(c in running for c in self._mps_containers()):
            self._mps_released = True  # evict its MPS clients first: the neighbours keep their server
            gpu = self.mps_gpu
            if gpu is not None:
                await self.mps.release(gpu, self.arn)
        for c in running:
            if c.status == "RUNNING":
                await asyncio.to_thread(c.handle.stop)
        return self._all_ended()

    def _finish(self) -> None:
        for fd in self._fds:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
        self._fds.clear()
        for c in self.containers.values():
            if c.checker is not None:
                c.checker.stop(timeout=0)
            if c.status == "PENDING":
                c.status = "STOPPED"
            if c.cgroup is not None:
                c.cgroup.remove()
            if c.handle is not None:
                self.runtime.cleanup(self, c)
        self.status = "STOPPED"
        now = time.time()
        self.times.setdefault("stoppingAt", now)
        self.times.setdefault("executionStoppedAt", now)
        self.times.setdefault("stoppedAt", now)
        self.report()

    # -- reporting -----------------------------------------------------------------------
    def task_health(self) -> str:
        return hc.task_health([(c.essential, bool(c.definition.get("healthCheck")), c.health)
                               for c in self.containers.values()])

    def snapshot(self) -> dict:
        snap = {"taskArn": self.arn, "lastStatus": self.status, "healthStatus": self.task_health(),
                "containers": [c.public() for c in self.containers.values()], **self.times}
        if self.stop_code:
            snap.update(stopCode=self.stop_code, stoppedReason=self.stopped_reason)
        return snap

    def report(self) -> None:
        self._report(self.snapshot())


def _with_overrides(definition: dict, override: dict) -> dict:
    d = dict(definition)
    if override.get("command"):
        d["command"] = override["command"]
    if override.get("environment"):
        env = {e["name"]: e for e in d.get("environment", [])}
        env.update({e["name"]: e for e in override["environment"]})
        d["environment"] = list(env.values())
    for key in ("cpu", "memory", "memoryReservation"):
        if override.get(key) is not None:
            d[key] = override[key]
    return d
