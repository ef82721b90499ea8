"""The agent's MPS policy, on top of `MpsManager`: one control daemon per GPU, started (or
adopted) when the agent starts, watched for as long as it runs, and let go, not stopped, when it
exits (the daemons serve their clients across an agent restart).

What it does, per GPU (docs/decisions.md, "MPS FAULT and crash policy"):

* **Health.** The manager's watcher probes the daemon every interval: IMPAIRED after 3 failed
  probes, OK after one success, IMPAIRED at once when the daemon's process exits. The state goes
  to `AcceleratedCompute` (the ACCELERATED_COMPUTE check, with the GPU in its `gpus`), which the
  agent reports at once.
* **Crash** (the daemon process exited): its clients lost their MPS server, so this agent's MPS
  tasks on that GPU are stopped ("MPS control daemon on GPU <uuid> exited: …"), and the daemon is
  started again at once; OK again once a probe of the new daemon succeeds.
* **Hung or refusing daemon:** restarted only when that is safe, i.e. no task of this agent uses
  the GPU (a hung control daemon may still have a working server under running clients), at
  most once per backoff (10 s doubling to 5 min); until then the GPU stays IMPAIRED.
* **FAULT:** while this agent runs MPS tasks on a GPU, the GPU's server states are read every
  interval. A server in FAULT: the GPU is IMPAIRED ("MPS server on GPU <uuid> entered FAULT
  state"), every client of the faulted servers is evicted (`terminate_client`), this agent's MPS
  tasks on the GPU stop with that reason, then the faulted servers are shut down (`-f`; the next
  client starts a fresh one), or the whole daemon restarted if they do not go. OK again once no
  server of the GPU is in FAULT.
* **Per-task gate**, **client environment** and **eviction of one task's clients** on stop, for
  the task runner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Callable

from shoal.agent.gpu.base import Gpu
from shoal.agent.mps.manager import OK, MpsError, MpsManager

log = logging.getLogger(__name__)
FAULT_STOP_CODE = CRASH_STOP_CODE = "EssentialContainerExited"  # its containers were made to exit
RESTART_BACKOFF = 10.0
RESTART_BACKOFF_MAX = 300.0
FAULT_TASK_WAIT = 35.0
GATE_RESTART_WAIT = 15.0  # at most a daemon stop (quit, TERM, KILL: ~7 s) and a start  # how long the affected tasks get to stop before the server goes anyway


def fault_reason(uuid: str) -> str:
    return f"MPS server on GPU {uuid} entered FAULT state"


def crash_reason(uuid: str) -> str:
    return f"MPS control daemon on GPU {uuid} exited: its clients lost their MPS server"


class MpsSupervisor:
    """`health`: the AcceleratedCompute to keep informed. `tasks_on(uuid)`: the task runners of
    this agent with an MPS share on that GPU that have not ended (each has `abort(code, reason)`
    and `done`)."""

    def __init__(self, manager: MpsManager, gpus: list[Gpu], *, interval: float, health,
                 tasks_on: Callable[[str], list], probe_timeout: float = 3.0):
        self.manager = manager
        self.gpus = {g.uuid: g for g in gpus}
        self.interval = interval
        self.probe_timeout = min(probe_timeout, max(interval, 0.5))
        self.health = health
        self.tasks_on = tasks_on
        self._status: dict[str, str] = {u: OK for u in self.gpus}  # what the watcher says
        self._faulted: set[str] = set()
        self._recovering: dict[str, asyncio.Task] = {}
        self._last_restart: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        self._tasks: set[asyncio.Task] = set()

    # --- life cycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Start or adopt every GPU's daemon (all at once), then watch them."""
        await asyncio.gather(*(self._start_one(g) for g in self.gpus.values()))
        for g in self.gpus.values():
            self.manager.watch(g, self.interval, lambda status, reason, g=g: self._changed(g, status, reason),
                               timeout=self.probe_timeout)
            self._spawn(self._server_watch(g), f"mps-servers-{g.uuid}")

    async def _start_one(self, g: Gpu) -> bool:
        try:
            await self.manager.start(g)
        except MpsError as e:
            log.error("MPS: control daemon for %s did not start: %s", g.uuid, e)
            self.health.set_gpu(g.uuid, "start", f"MPS control daemon failed to start: {e}")
            self._recover(g)
            return False
        self.health.set_gpu(g.uuid, "start", None)
        return True

    def close(self) -> None:
        """Let go of the daemons (they keep running) and stop watching."""
        for task in list(self._tasks):
            task.cancel()
        self.manager.close()

    def _spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- for the task runner --------------------------------------------------------------------
    def client_env(self, uuid: str, memory_mib: int, max_compute_percent: int | None) -> dict[str, str]:
        if uuid not in self.gpus:
            raise ValueError(f"GPU {uuid} has no MPS control daemon on this instance")
        return self.manager.client_env(self.gpus[uuid], memory_mib, max_compute_percent)

    async def gate(self, uuid: str) -> str | None:
        """None when an MPS task may start on GPU `uuid`; else why not."""
        g = self.gpus.get(uuid)
        if g is None:
            return f"MPS control daemon is not available on this instance for GPU {uuid}"
        if uuid in self._faulted:
            return f"{fault_reason(uuid)}; no new MPS clients until it has recovered"
        # A restart decided while the daemon was down goes on even if the old daemon answers again
        # meanwhile: a client let in now would lose its server with it. Wait for the new one.
        deadline = time.monotonic() + GATE_RESTART_WAIT
        while self.manager.restarting(g) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        result = await self.manager.gate(g)
        return None if result.ok else result.error

    async def release(self, uuid: str, task_arn: str) -> list[int]:
        """Evict the task's MPS clients (processes whose environment names the task) through the
        control interface, so that its neighbours are not disturbed; the usual stop follows. Skipped
        while the daemon is not answering (it would only delay the stop)."""
        g = self.gpus.get(uuid)
        if g is None or self._status.get(uuid) != OK or self.manager.pid(g) is None:
            return []
        try:
            evicted = await self.manager.terminate_clients(g, lambda pid: _of_task(pid, task_arn), timeout=2.0)
        except MpsError as e:
            log.warning("MPS: could not evict the clients of %s on %s: %s", task_arn, uuid, e)
            return []
        if evicted:
            log.info("MPS: evicted clients %s of %s on %s", evicted, task_arn, uuid)
        return evicted

    # --- the watcher's verdicts -----------------------------------------------------------------
    def _changed(self, g: Gpu, status: str, reason: str | None) -> None:
        self._status[g.uuid] = status
        if status == OK:
            log.info("MPS: control daemon for %s answers again", g.uuid)
            self.health.set_gpu(g.uuid, "daemon", None)
            self._backoff.pop(g.uuid, None)
            return
        crashed = self.manager.crashed(g)
        log.error("MPS: control daemon for %s is %s: %s", g.uuid, "gone" if crashed else "not responding", reason)
        self.health.set_gpu(g.uuid, "daemon", reason)
        if crashed:
            self._fail_tasks(g, CRASH_STOP_CODE, crash_reason(g.uuid))
        self._recover(g)

    def _fail_tasks(self, g: Gpu, code: str, reason: str) -> list:
        runners = self.tasks_on(g.uuid)
        for runner in runners:
            runner.abort(code, reason)
        if runners:
            log.warning("MPS: stopping %d task(s) on %s: %s", len(runners), g.uuid, reason)
        return runners

    def _recover(self, g: Gpu) -> None:
        task = self._recovering.get(g.uuid)
        if task is None or task.done():
            self._recovering[g.uuid] = self._spawn(self._recovery(g), f"mps-recover-{g.uuid}")

    def _down(self, g: Gpu) -> bool:
        return self._status[g.uuid] != OK or self.manager.pid(g) is None

    async def _recovery(self, g: Gpu) -> None:
        """Restart the GPU's daemon while it is down: at once after a crash or a failed start;
        for a hung daemon only once no task of this agent uses the GPU; never more often than
        the backoff allows."""
        while self._down(g):
            if self.manager.crashed(g):  # also when it was already IMPAIRED (hung) before it died
                self._fail_tasks(g, CRASH_STOP_CODE, crash_reason(g.uuid))
            crashed = self.manager.crashed(g) or self.manager.pid(g) is None
            since = time.monotonic() - self._last_restart.get(g.uuid, -1e9)
            backoff = self._backoff.get(g.uuid, 0.0)
            if (crashed or not self.tasks_on(g.uuid)) and since >= backoff:
                self._last_restart[g.uuid] = time.monotonic()
                self._backoff[g.uuid] = min(max(backoff * 2, RESTART_BACKOFF), RESTART_BACKOFF_MAX)
                try:
                    info = await self.manager.restart(g)
                    log.warning("MPS: restarted the control daemon for %s (now %d)", g.uuid, info.pid)
                    self.health.set_gpu(g.uuid, "start", None)
                except MpsError as e:
                    log.error("MPS: restarting the control daemon for %s failed: %s", g.uuid, e)
                    self.health.set_gpu(g.uuid, "start", f"MPS control daemon failed to start: {e}")
            # the watcher probes a new daemon at once; give it the time of one probe
            await asyncio.sleep(max(self.probe_timeout, 0.5) + 0.5)

    # --- FAULT ----------------------------------------------------------------------------------
    async def _server_watch(self, g: Gpu) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self._down(g) or self.manager.restarting(g):
                continue
            if g.uuid not in self._faulted and not self.tasks_on(g.uuid):
                continue  # servers start with clients; without our tasks there is nobody to fail
            try:
                state = await self.manager.server_state(g, timeout=self.probe_timeout)
            except MpsError:
                continue  # a daemon that does not answer is the watcher's to report
            if state.fault:
                await self._fault(g, state.faulted)
            elif g.uuid in self._faulted:
                log.warning("MPS: no server on %s is in FAULT any more", g.uuid)
                self._faulted.discard(g.uuid)
                self.health.set_gpu(g.uuid, "fault", None)

    async def _fault(self, g: Gpu, servers: list[int]) -> None:
        reason = fault_reason(g.uuid)
        if g.uuid not in self._faulted:
            log.error("MPS: %s (servers %s): failing its clients, then restarting the server", reason, servers)
            self._faulted.add(g.uuid)
            self.health.set_gpu(g.uuid, "fault", reason)
        try:  # every client of the faulted servers, ours or not
            evicted = await self.manager.terminate_clients(
                g, lambda pid: True, timeout=self.probe_timeout) if servers else []
            if evicted:
                log.warning("MPS: evicted clients %s of the faulted server on %s", evicted, g.uuid)
        except MpsError as e:
            log.warning("MPS: could not evict the clients on %s: %s", g.uuid, e)
        runners = self._fail_tasks(g, FAULT_STOP_CODE, reason)
        deadline = time.monotonic() + FAULT_TASK_WAIT
        while any(not r.done.done() for r in runners) and time.monotonic() < deadline:
            await asyncio.wait([r.done for r in runners if not r.done.done()], timeout=0.5)
        try:
            for pid in servers:
                await self.manager.command(g, f"shutdown_server {pid} -f", timeout=self.probe_timeout)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                state = await self.manager.server_state(g, timeout=self.probe_timeout)
                if not set(servers) & set(state.servers):
                    log.warning("MPS: faulted server(s) %s on %s shut down", servers, g.uuid)
                    return
                await asyncio.sleep(0.1)
        except MpsError as e:
            log.warning("MPS: shutting down the faulted server on %s failed: %s", g.uuid, e)
        log.warning("MPS: the faulted server on %s did not go: restarting its control daemon", g.uuid)
        try:
            await self.manager.restart(g)
        except MpsError as e:
            log.error("MPS: restarting the control daemon for %s failed: %s", g.uuid, e)


def _of_task(pid: int, task_arn: str) -> bool:
    """Whether process `pid` belongs to the task: every container process carries SHOAL_TASK_ARN."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"SHOAL_TASK_ARN={task_arn}".encode() in environ
