"""The process runtime (the default): each container is a child process of its shim, run from
`entryPoint` + `command`, in cgroups where the host lets the agent write them. `image` is
recorded but not used."""

from __future__ import annotations

import logging
import os

from shoal.agent import cgroups as cg
from shoal.agent.runtime import gpus
from shoal.agent.runtime.gpus import MpsEnv

log = logging.getLogger(__name__)
BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ")


class ProcessRuntime:
    name = "process"

    def __init__(self, *, layout: cg.Layout | None, cgroup_parent: str, gpu_index: dict[str, int],
                 mps_env: MpsEnv | None = None):
        self.layout, self.cgroup_parent = layout, cgroup_parent
        self.gpu_index, self.mps_env = gpu_index, mps_env

    def enforced(self) -> dict[str, bool]:
        """Which limits this host really enforces (registered as host attributes)."""
        layout = self.layout
        return {"memory": bool(layout and layout.memory.writable), "cpu": bool(layout and layout.cpu.writable)}

    def env(self, runner, c) -> dict[str, str]:
        env = {k: os.environ[k] for k in BASE_ENV_KEYS if k in os.environ}
        env.update({e["name"]: str(e.get("value", "")) for e in c.definition.get("environment", [])})
        env.update(ECS_CONTAINER_NAME=c.name, SHOAL_TASK_ARN=runner.arn, SHOAL_CONTAINER_ARN=c.arn)
        env.update(self.gpu_env(c))
        return env

    def gpu_env(self, c) -> dict[str, str]:
        """What a GPU container sees: its GPUs by UUID and host index, or for an MPS share the MPS
        client environment (shoal.agent.runtime.gpus)."""
        return gpus.gpu_env(c, self.gpu_index, self.mps_env)

    def argv(self, c) -> list[str]:
        argv = [*(c.definition.get("entryPoint") or []), *(c.definition.get("command") or [])]
        if not argv:
            raise ValueError(f"container {c.name} has no entryPoint or command, and the process runtime "
                             "does not run images (use `shoal agent --runtime podman`)")
        return argv

    def cgroup(self, runner, c) -> cg.ContainerCgroup | None:
        if self.layout is None:
            return None
        d = c.definition
        memory = d.get("memory")
        reservation = d.get("memoryReservation")
        cpu = d.get("cpu")
        if memory is None and reservation is None and not cpu:
            return None
        task_id = runner.arn.rsplit("/", 1)[-1]
        return cg.ContainerCgroup.create(self.layout, self.cgroup_parent, f"{task_id}-{c.name}",
                                         memory_mib=int(memory) if memory is not None else None,
                                         memory_reservation_mib=int(reservation) if reservation is not None else None,
                                         cpu_units=int(cpu) if cpu else None)

    def health_probe(self, runner, c, spec):
        """(spec, env, cwd) of the container's health probes: beside the process, as it sees things."""
        return spec, self.env(runner, c), c.definition.get("workingDirectory")

    def cleanup(self, runner, c) -> None:
        """Nothing outlives a process container's shim."""

    def prepare(self, runner, c):
        """(argv, env, cwd, cgroup) for the container's shim."""
        argv = self.argv(c)
        cwd = c.definition.get("workingDirectory") or str(runner.dir / c.name)
        return argv, self.env(runner, c), cwd, self.cgroup(runner, c)
