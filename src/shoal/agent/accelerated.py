"""ACCELERATED_COMPUTE: the host's GPU health check, as the agent reports it.

Two kinds of input:

* **MPS, per GPU** (from `shoal.agent.mps.supervisor`): the GPU's control daemon is down (three
  failed probes, a crash, a failed start) or its MPS server is in FAULT. Such a GPU is listed in
  the check's `gpus` (the server puts no new MPS share on it), and the check is IMPAIRED with the
  probe error (or the FAULT) as its reason until the GPU is well again.
* **Xids, whole host** (NVML events on real GPUs; `shoal.agent.gpu.fake.inject` on simulated
  ones): an Xid in the configured set (default: the Xids ECS's GPU auto repair acts on) makes the
  check IMPAIRED with reason `XID_<n>`, and it stays so: an Xid does not heal by itself, the host
  is repaired or replaced. It is kept in `<data dir>/gpu-xid.json`, so an agent restart does not
  forget it; an operator who repaired the GPU in place removes that file and restarts the agent.
  Other Xids are logged only.

`on_change()` is called (on the event loop) whenever what `check()` returns changes, so the
agent reports it at once instead of at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from shoal.agent.gpu.base import GpuBackend, XidEvent
from shoal.agent.runtime.files import write_atomic

log = logging.getLogger(__name__)

# ECS Managed Instances GPU auto repair (ecs-semantics §3)
AWS_XIDS = (46, 48, 54, 62, 64, 74, 79, 95, 109, 110, 136, 140, 142, 143, 151, 155, 156, 158)
XID_FILE = "gpu-xid.json"


def parse_xid_set(text: str) -> frozenset[int]:
    """"46,48, 79" → {46, 48, 79}; ValueError naming the bad item."""
    xids = set()
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"an Xid is a positive whole number, got {item!r}")
        xids.add(int(item))
    return frozenset(xids)


class AcceleratedCompute:
    def __init__(self, data_dir: Path, xid_set, on_change: Callable[[], None]):
        self.xid_set = frozenset(xid_set)
        self.on_change = on_change
        self._path = Path(data_dir) / XID_FILE
        self._gpus: dict[str, dict[str, str]] = {}  # uuid → source → reason
        self._xid: dict | None = None
        try:
            self._xid = json.loads(self._path.read_text())
            log.warning("GPU: ACCELERATED_COMPUTE stays IMPAIRED: Xid %s on %s at %s (remove %s once repaired)",
                        self._xid["xid"], self._xid["gpu"], self._xid["at"], self._path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.error("GPU: unreadable %s (%s): taken as an Xid impairment", self._path, e)
            self._xid = {"xid": 0, "gpu": "?", "at": "?"}

    # --- inputs ---------------------------------------------------------------------------------
    def set_gpu(self, uuid: str, source: str, reason: str | None) -> None:
        """`source` ("daemon", "start", "fault") says why GPU `uuid` is impaired (`reason`), or
        no longer (None)."""
        before = self.check()
        sources = self._gpus.setdefault(uuid, {})
        if reason is None:
            sources.pop(source, None)
        else:
            sources[source] = reason
        if not sources:
            del self._gpus[uuid]
        self._changed(before)

    def xid(self, event: XidEvent) -> None:
        if event.xid not in self.xid_set:
            log.info("GPU: Xid %d on %s (not in the watched set: logged only)", event.xid, event.gpu_uuid)
            return
        log.error("GPU: critical Xid %d on %s: ACCELERATED_COMPUTE IMPAIRED", event.xid, event.gpu_uuid)
        before = self.check()
        self._xid = {"xid": event.xid, "gpu": event.gpu_uuid,
                     "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:
            write_atomic(self._path, json.dumps(self._xid).encode())
        except OSError as e:
            log.error("GPU: cannot record the Xid in %s: %s", self._path, e)
        self._changed(before)

    def _changed(self, before: dict) -> None:
        if self.check() != before:
            try:
                self.on_change()
            except Exception:
                log.exception("GPU: health change callback failed")

    # --- output ---------------------------------------------------------------------------------
    def impaired(self, uuid: str) -> bool:
        return uuid in self._gpus

    def check(self) -> dict:
        """The ACCELERATED_COMPUTE check of the agent's health report."""
        reasons = []
        if self._xid is not None:
            reasons.append(f"XID_{self._xid['xid']}")
        gpus = sorted(self._gpus)
        for uuid in gpus:
            why = "; ".join(dict.fromkeys(self._gpus[uuid].values()))
            reasons.append(why if len(gpus) == 1 else f"{uuid}: {why}")
        if not reasons:
            return {"status": "OK", "gpus": []}
        return {"status": "IMPAIRED", "reason": "; ".join(reasons)[:1024], "gpus": gpus}


class XidWatcher:
    """Waits for Xids on a thread of its own (NVML's event wait blocks) and hands each one to
    `on_xid` on the event loop."""

    def __init__(self, backend: GpuBackend, on_xid: Callable[[XidEvent], None]):
        self.backend, self.on_xid = backend, on_xid
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, args=(loop,), name="xid-watch", daemon=True)
        self._thread.start()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        backoff, last_error = 1.0, None
        while not self._stop.is_set():
            try:
                event = self.backend.wait_xid(0.5)
            except Exception as e:  # NVML trouble, an injected Xid for an unknown GPU, …
                if str(e) != last_error:
                    log.warning("GPU: waiting for Xids failed: %s", e)
                    last_error = str(e)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            backoff = 1.0
            if event is not None:
                try:
                    loop.call_soon_threadsafe(self.on_xid, event)
                except RuntimeError:  # the loop is closed: the agent is exiting
                    return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
