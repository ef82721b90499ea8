"""Real GPUs through NVML (nvidia-ml-py, imported as `pynvml`).

Discovery reads each device's index, UUID, name and total memory. Xids arrive through an NVML
event set registered for critical Xid errors; `nvmlEventSetWait_v2` blocks (the caller runs it on
a thread of its own) and its `eventData` is the Xid number.
"""

from __future__ import annotations

import logging
import threading

import pynvml

from shoal.agent.gpu.base import Gpu, XidEvent

log = logging.getLogger(__name__)
_init_lock = threading.Lock()


def driver_present() -> bool:
    try:
        with _init_lock:
            pynvml.nvmlInit()
            pynvml.nvmlShutdown()
        return True
    except pynvml.NVMLError:  # LibraryNotFound, DriverNotLoaded, …
        return False


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlGpus:
    name = "nvml"

    def __init__(self) -> None:
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._events = None

    def devices(self) -> list[Gpu]:
        return [
            Gpu(index=i, uuid=_text(pynvml.nvmlDeviceGetUUID(h)), model=_text(pynvml.nvmlDeviceGetName(h)),
                memory_mib=pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024))
            for i, h in enumerate(self._handles)
        ]

    def _event_set(self):
        if self._events is None:
            self._events = pynvml.nvmlEventSetCreate()
            for i, handle in enumerate(self._handles):
                try:  # one GPU that cannot report Xids (vGPU, some MIG setups) must not blind the others
                    supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
                    mask = supported & pynvml.nvmlEventTypeXidCriticalError
                    if mask:
                        pynvml.nvmlDeviceRegisterEvents(handle, mask, self._events)
                    else:
                        log.warning("GPU %d does not report Xid events", i)
                except pynvml.NVMLError as e:
                    log.warning("GPU %d: cannot register for Xid events: %s", i, e)
        return self._events

    def wait_xid(self, timeout: float) -> XidEvent | None:
        try:
            data = pynvml.nvmlEventSetWait_v2(self._event_set(), int(timeout * 1000))
        except pynvml.NVMLError_Timeout:
            return None
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return None
        return XidEvent(gpu_uuid=_text(pynvml.nvmlDeviceGetUUID(data.device)), xid=int(data.eventData))

    def close(self) -> None:
        if self._events is not None:
            pynvml.nvmlEventSetFree(self._events)
            self._events = None
        pynvml.nvmlShutdown()
