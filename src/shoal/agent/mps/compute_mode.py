"""GPU compute mode for MPS: EXCLUSIVE_PROCESS while a GPU runs an MPS control daemon, so that
only the MPS server holds a context and a stray non-MPS process fails fast instead of
time-slicing beside it; DEFAULT again when MPS is torn down.

Real GPUs go through NVML (`nvmlDeviceSetComputeMode`, which needs root); simulated GPUs have
nothing to set. Both sit behind `ComputeMode`. A refusal (no permission, not supported) is
reported and logged, never raised: MPS works without the compute mode, only less strictly.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Protocol

from shoal.agent.gpu.base import Gpu

log = logging.getLogger(__name__)


class ComputeMode(Protocol):
    name: str

    def set_exclusive(self, gpu: Gpu) -> str | None:
        """Put `gpu` in EXCLUSIVE_PROCESS; None when done, else why not."""
        ...

    def restore(self, gpu: Gpu) -> str | None:
        """Put `gpu` back in DEFAULT; None when done, else why not."""
        ...


class NoComputeMode:
    """Nothing to set: simulated GPUs (the fake control binary)."""

    name = "none"

    def set_exclusive(self, gpu: Gpu) -> str | None:
        return None

    def restore(self, gpu: Gpu) -> str | None:
        return None


class NvmlComputeMode:
    name = "nvml"
    _lock = threading.Lock()

    def _set(self, gpu: Gpu, mode_name: str) -> str | None:
        import pynvml

        mode = getattr(pynvml, mode_name)
        with self._lock:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as e:
                return f"NVML unavailable: {e}"
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                if pynvml.nvmlDeviceGetComputeMode(handle) != mode:
                    pynvml.nvmlDeviceSetComputeMode(handle, mode)
                return None
            except pynvml.NVMLError as e:  # NoPermission without root, NotSupported on some parts
                reason = f"cannot set {mode_name} on {gpu.uuid}: {e}"
                log.warning("%s", reason)
                return reason
            finally:
                pynvml.nvmlShutdown()

    def set_exclusive(self, gpu: Gpu) -> str | None:
        return self._set(gpu, "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS")

    def restore(self, gpu: Gpu) -> str | None:
        return self._set(gpu, "NVML_COMPUTEMODE_DEFAULT")


def default_compute_mode(binary: str) -> ComputeMode:
    """NVML where a driver answers and the binary is the real one; nothing for the fake."""
    if Path(binary).name.startswith("shoal-fake"):
        return NoComputeMode()
    from shoal.agent.gpu.nvml import driver_present

    return NvmlComputeMode() if driver_present() else NoComputeMode()
