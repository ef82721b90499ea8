"""The GPU backend interface and the choice of backend."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str
    memory_mib: int


@dataclass(frozen=True)
class XidEvent:
    gpu_uuid: str
    xid: int


class GpuBackend(Protocol):
    name: str

    def devices(self) -> list[Gpu]: ...

    def wait_xid(self, timeout: float) -> XidEvent | None:
        """Block until a GPU reports an Xid, or `timeout` seconds pass (then None)."""
        ...

    def close(self) -> None: ...


def detect(*, fake_spec: Path | None = None, instance_type: str | None = None,
           state_dir: Path | None = None) -> GpuBackend | None:
    """The backend for this host: the fake one when a spec or a simulated instance type is given,
    NVML where an NVIDIA driver answers, and None on a host without GPUs."""
    if fake_spec or instance_type:
        from shoal.agent.gpu.fake import FakeGpus

        return FakeGpus.from_spec(fake_spec, instance_type=instance_type, state_dir=state_dir)
    from shoal.agent.gpu.nvml import NvmlGpus, driver_present

    return NvmlGpus() if driver_present() else None
