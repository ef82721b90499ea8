"""GPU backends for the host agent: `nvml` on hosts with an NVIDIA driver, `fake` for simulated
hosts. Both expose the same small interface (`GpuBackend`), so the agent runs one code path."""

from shoal.agent.gpu.base import Gpu, GpuBackend, XidEvent, detect

__all__ = ["Gpu", "GpuBackend", "XidEvent", "detect"]
