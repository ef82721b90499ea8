"""Faults on the fleet emulator's hosts: `shoal chaos` orders answered as a real agent's GPU
health answers them, without processes (the real thing: shoal.agent.chaos, shoal.agent.mps.
supervisor and shoal.agent.accelerated). Per GPU of a host:

    mps crash    its MPS tasks stop (their clients lost their server); IMPAIRED at once, OK once
                 the daemon has been restarted (RESTART s)
    mps hang     IMPAIRED after 3 probe intervals, until lifted; an MPS task started on the GPU
                 meanwhile fails its gate (TaskFailedToStart, "MPS control daemon is not
                 responding"); running ones are left alone
    mps fault    its MPS tasks stop with the FAULT reason; IMPAIRED until lifted
    mps recover  hang and fault lifted: OK at the next probe
    xid N        in the watched set (the AWS list, as the real agent's default): IMPAIRED
                 `XID_N` for good; any other Xid is logged only
    daemon kill  the daemon's task exits 137

Health goes out as the real agent reports it: the whole ACCELERATED_COMPUTE check, with the
impaired GPUs in `gpus` so that the server fences them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from shoal.agent.accelerated import AWS_XIDS

log = logging.getLogger(__name__)
RESTART = 0.5  # seconds for a crashed daemon to be running and answering again
NOT_RESPONDING = "MPS control daemon is not responding"


def mps_gpu(spec: dict) -> str | None:
    """The GPU an MPS task shares (all its MPS containers are on one), or None."""
    shared = {c["name"] for c in spec["containerDefinitions"]
              if any(r.get("type") == "GPU" and r.get("sharingStrategy") for r in c.get("resourceRequirements", []))}
    ids = [g for c in spec["containers"] if c["name"] in shared for g in c.get("gpuIds", [])]
    return ids[0] if ids else None


class HostFaults:
    """The faults of one host. `report(check)` sends its ACCELERATED_COMPUTE check;
    `fail(task, code, reason)` stops one of its tasks as the agent would."""

    def __init__(self, host, probe_interval: float, report: Callable[[dict], None],
                 fail: Callable[[object, str, str], None]):
        self.host, self.probe_interval, self.report, self.fail = host, probe_interval, report, fail
        self.gpus = {g.uuid for g in host.gpus()}
        self.down: dict[str, str] = {}  # GPU uuid → why it takes no MPS work
        self.hung: set[str] = set()
        self.xid: int | None = None

    def check(self) -> dict:
        reasons = [f"XID_{self.xid}"] if self.xid is not None else []
        gpus = sorted(self.down)
        reasons += [self.down[g] if len(gpus) == 1 else f"{g}: {self.down[g]}" for g in gpus]
        if not reasons:
            return {"status": "OK", "gpus": []}
        return {"status": "IMPAIRED", "reason": "; ".join(reasons)[:1024], "gpus": gpus}

    def _set(self, gpu: str, reason: str | None) -> None:
        before = self.check()
        if reason is None:
            self.down.pop(gpu, None)
        else:
            self.down[gpu] = reason
        if self.check() != before:
            self.report(self.check())

    def _later(self, delay: float, fn) -> None:
        asyncio.get_running_loop().call_later(delay, fn)

    def _stop_mps_tasks(self, gpu: str, reason: str) -> int:
        tasks = [t for t in self.host.tasks.values() if t.status in ("PENDING", "RUNNING") and mps_gpu(t.spec) == gpu]
        for task in tasks:
            self.fail(task, "EssentialContainerExited", reason)
        return len(tasks)

    def gate(self, task) -> str | None:
        """Why an MPS task may not start now (its GPU's daemon hangs), or None."""
        gpu = mps_gpu(task.spec)
        if gpu in self.hung:
            return (f"{NOT_RESPONDING}: no answer to get_default_active_thread_percentage within 3 s "
                    f"(3 attempts in 10.0 s)")
        return None

    # -- orders -----------------------------------------------------------------------------------
    def apply(self, order: dict) -> str:
        """What was done (ValueError: why not)."""
        action = order.get("action")
        if action == "daemon":
            task = self.host.tasks.get(order["taskArn"])
            if task is None or task.status == "STOPPED":
                raise ValueError(f"the task of daemon {order['daemon']} does not run on this host")
            self.fail(task, "EssentialContainerExited", "Essential container in task exited", exit_code=137)
            return f"killed daemon {order['daemon']}'s task {task.arn.rsplit('/', 1)[-1]} (exit 137)"
        gpu = order.get("gpuId")
        if gpu not in self.gpus:
            raise ValueError(f"no GPU {gpu} on this host")
        if action == "xid":
            if order["xid"] not in AWS_XIDS:
                return f"Xid {order['xid']} raised on GPU {order['gpu']} (not in the watched set: logged only)"
            before, self.xid = self.check(), order["xid"]
            if self.check() != before:
                self.report(self.check())
            return f"Xid {order['xid']} raised on GPU {order['gpu']}"
        if action != "mps":
            raise ValueError(f"unknown chaos action {action!r}")
        return getattr(self, f"_mps_{order['mode']}")(gpu, order["gpu"])

    def _mps_crash(self, gpu: str, index: int) -> str:
        stopped = self._stop_mps_tasks(gpu, f"MPS control daemon on GPU {gpu} exited: its clients lost their MPS server")
        self.hung.discard(gpu)  # a new daemon is started
        self._set(gpu, "MPS control daemon process exited")
        self._later(RESTART, lambda: self._set(gpu, None) if gpu not in self.hung else None)
        return f"killed the MPS control daemon of GPU {index} ({gpu}); {stopped} MPS task(s) lost their server"

    def _mps_hang(self, gpu: str, index: int) -> str:
        self.hung.add(gpu)
        reason = "no answer to get_default_active_thread_percentage within 3 s"
        self._later(3 * self.probe_interval, lambda: self._set(gpu, reason) if gpu in self.hung else None)
        return f"the MPS control daemon of GPU {index} ({gpu}) accepts connections and never answers"

    def _mps_fault(self, gpu: str, index: int) -> str:
        reason = f"MPS server on GPU {gpu} entered FAULT state"
        self._set(gpu, reason)
        stopped = self._stop_mps_tasks(gpu, reason)
        return f"the MPS servers of GPU {index} ({gpu}) entered FAULT; {stopped} MPS task(s) failed"

    def _mps_recover(self, gpu: str, index: int) -> str:
        self.hung.discard(gpu)
        self._set(gpu, None)
        return f"hang and fault lifted on GPU {index} ({gpu})"
