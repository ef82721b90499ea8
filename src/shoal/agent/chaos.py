"""Chaos orders from the control plane (`shoal chaos`, shoal.control.chaos): one fault, injected
on this host, through the same hooks a real fault would hit, so that detection and recovery are
the ordinary code paths.

    mps crash     SIGKILL the GPU's MPS control daemon (its supervisor sees the exit at once)
    mps hang      the daemon accepts connections and never answers: the fake's `hang` knob;
                  on a real daemon, SIGSTOP (the socket still accepts, nothing answers)
    mps fault     the fake's `fault` knob: its servers enter FAULT (a real server cannot be
                  put into FAULT from outside: refused)
    mps recover   undo hang/fault: the knobs cleared; on a real daemon, SIGCONT
    xid           simulated GPUs: through the fake backend's event socket, as NVML would wake;
                  real GPUs: handed to the Xid handler directly (NVML cannot inject one)
    daemon kill   SIGKILL the process group of each container of the daemon's task

The control plane refuses an order for a real host without `really`; the agent checks it again.
`apply` returns (DONE | FAILED, what was done or why not) for the agent to report.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from shoal.agent.gpu import fake as fake_gpus
from shoal.agent.gpu.base import XidEvent
from shoal.agent.runtime.files import killpg

log = logging.getLogger(__name__)


class Refused(Exception):
    """The order cannot be carried out here; the message says why."""


def apply(agent, order: dict) -> tuple[str, str]:
    try:
        if not agent.simulated and not order.get("really"):
            raise Refused("this is a real host: chaos needs --really")
        action = {"mps": _mps, "xid": _xid, "daemon": _daemon}.get(order.get("action"))
        if action is None:
            raise Refused(f"unknown chaos action {order.get('action')!r}")
        done = action(agent, order)
    except Refused as e:
        log.warning("chaos order %s refused: %s", order.get("orderId"), e)
        return "FAILED", str(e)
    except OSError as e:
        log.warning("chaos order %s failed: %s", order.get("orderId"), e)
        return "FAILED", f"{type(e).__name__}: {e}"
    log.warning("chaos order %s: %s", order.get("orderId"), done)
    return "DONE", done


def _mps(agent, order: dict) -> str:
    if agent.mps is None:
        raise Refused("this host runs no MPS control daemon")
    gpu = agent.mps.gpus.get(order["gpuId"])
    if gpu is None:
        raise Refused(f"no GPU {order['gpuId']} on this host")
    manager, mode = agent.mps.manager, order["mode"]
    pid = manager.pid(gpu)
    fake = Path(manager.binary).name.startswith("shoal-fake")
    where = f"GPU {gpu.index} ({gpu.uuid})"
    if mode == "crash":
        if pid is None:
            raise Refused(f"no MPS control daemon runs on {where}")
        os.kill(pid, signal.SIGKILL)
        return f"killed the MPS control daemon of {where} (pid {pid}, SIGKILL)"
    if fake:
        from shoal.agent.mps.fake_control import set_knobs

        knobs = {"hang": {"hang": True}, "fault": {"fault": True}, "recover": {}}[mode]
        set_knobs(manager.pipe_dir(gpu), clear=mode == "recover", **knobs)
        return {"hang": f"the MPS control daemon of {where} accepts connections and never answers",
                "fault": f"the MPS servers of {where} entered FAULT",
                "recover": f"hang and fault lifted on {where}"}[mode]
    if mode == "fault":
        raise Refused("a real MPS server cannot be put into FAULT from outside")
    if pid is None:
        raise Refused(f"no MPS control daemon runs on {where}")
    os.kill(pid, signal.SIGSTOP if mode == "hang" else signal.SIGCONT)
    return f"{'stopped (SIGSTOP)' if mode == 'hang' else 'continued (SIGCONT)'} the MPS control daemon of {where}"


def _xid(agent, order: dict) -> str:
    where = f"GPU {order['gpu']} ({order['gpuId']})"
    if agent.gpu_backend == fake_gpus.FakeGpus.name:
        fake_gpus.inject(agent.data_dir, order["gpuId"], order["xid"])
        return f"Xid {order['xid']} raised on {where}"
    agent.accelerated.xid(XidEvent(gpu_uuid=order["gpuId"], xid=order["xid"]))
    return f"Xid {order['xid']} handed to the Xid handler for {where} (NVML cannot inject one)"


def _daemon(agent, order: dict) -> str:
    runner = agent.runners.get(order["taskArn"])
    if runner is None or runner.done.done():
        raise Refused(f"the task {order['taskArn']} of daemon {order['daemon']} does not run on this host")
    killed = []
    for c in runner.containers.values():
        if c.handle is not None and c.handle.workload_alive() and killpg(c.handle.pid(), signal.SIGKILL):
            killed.append(f"{c.name} (pid {c.handle.pid()})")
    if not killed:
        raise Refused(f"no live container process of daemon {order['daemon']}'s task")
    return f"killed daemon {order['daemon']}'s task {order['taskArn'].rsplit('/', 1)[-1]}: {', '.join(killed)}"
