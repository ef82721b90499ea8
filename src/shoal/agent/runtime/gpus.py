"""What a GPU container sees, for every runtime: one code path for whole GPUs and MPS shares.

* Whole GPUs: `NVIDIA_VISIBLE_DEVICES=<uuid,…>` and, where the runtime runs the process on the
  host itself (process runtime), `CUDA_VISIBLE_DEVICES=<host index,…>`.
* An MPS share (a GPU resourceRequirement with `sharingStrategy.nvidiaMps`): its GPU's UUID in
  `NVIDIA_VISIBLE_DEVICES`, and exactly the MPS manager's client environment
  (`CUDA_MPS_PIPE_DIRECTORY`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M`, and
  `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` only when `maxComputePercent` is given). No
  `CUDA_VISIBLE_DEVICES`: the GPU's per-GPU MPS server already shows it as device 0, and a client
  value would be read relative to the server's list.
"""

from __future__ import annotations

from typing import Callable

# (gpu uuid, memory MiB, maxComputePercent or None) → the MPS client environment
MpsEnv = Callable[[str, int, "int | None"], dict]


def mps_share(definition: dict) -> tuple[int, int | None] | None:
    """(memory MiB, maxComputePercent or None) of a container's MPS share; None for no share."""
    for req in definition.get("resourceRequirements") or []:
        mps = (req.get("sharingStrategy") or {}).get("nvidiaMps") if isinstance(req, dict) else None
        if req.get("type") == "GPU" and mps:
            return int(mps["memory"]), mps.get("maxComputePercent")
    return None


def gpu_env(c, gpu_index: dict[str, int] | None, mps_env: MpsEnv | None) -> dict[str, str]:
    """The GPU variables of container `c` (its `gpu_ids` as placed by the server). `gpu_index`
    None: the runtime isolates GPUs itself, so no CUDA_VISIBLE_DEVICES of host indices."""
    if not c.gpu_ids:
        return {}
    env = {"NVIDIA_VISIBLE_DEVICES": ",".join(c.gpu_ids)}
    share = mps_share(c.definition)
    if share is not None:
        if mps_env is None:
            raise ValueError("MPS control daemon is not available on this instance")
        env.update(mps_env(c.gpu_ids[0], *share))
        return env
    if gpu_index is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu_index.get(u, u)) for u in c.gpu_ids)
    return env
