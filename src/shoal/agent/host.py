"""What this host is: its id, resources and attributes, as the agent registers them.

A simulated host (`--simulate`, used by the local provisioner) takes its CPU, memory and GPUs
from the instance catalog, so a `p6-b200.48xlarge` host offers 192 vCPUs and 8 Blackwell GPUs
to placement, whatever this machine has.
"""

from __future__ import annotations

import os
import platform
import secrets
from pathlib import Path

from shoal import catalog
from shoal.agent.gpu.base import Gpu

RESERVED_PORTS = (22,)  # never handed to tasks, as the ECS agent reserves its own and SSH


def host_id(data_dir: Path, given: str | None) -> str:
    """The host's id (its ec2InstanceId), kept in the data dir so that it survives restarts."""
    path = data_dir / "host-id"
    if given:
        return given
    if path.exists():
        return path.read_text().strip()
    new = "i-" + secrets.token_hex(9)[:17]
    path.write_text(new)
    return new


def memory_mib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


def architecture() -> str:
    machine = platform.machine().lower()
    return {"aarch64": "arm64", "amd64": "x86_64"}.get(machine, machine)


def registration(*, cluster: str, capacity_provider: str | None, host: str, instance_type: str | None,
                 availability_zone: str | None = None,
                 simulate: bool, gpus: list[Gpu], attributes: dict[str, str], enforced: dict[str, bool],
                 runtime: str, version: str, mps: bool = False,
                 shape: tuple[int, float] | None = None) -> dict:
    """`shape` (vCPUs, GiB) simulates a host of a type the catalog does not have (CPU-only)."""
    if simulate:
        vcpus, memory_gib = shape or (catalog.get(instance_type).vcpus, catalog.get(instance_type).memory_gib)
        cpu, memory = vcpus * 1024, int(memory_gib * 1024)
    else:
        cpu, memory = (os.cpu_count() or 1) * 1024, memory_mib()
    attrs = [{"name": k, "value": v} for k, v in attributes.items()]
    # Limits the host can really enforce, so nobody mistakes a recorded limit for an enforced one.
    attrs += [{"name": f"shoal.cgroups.{k}", "value": "enforced" if v else "not-enforced"} for k, v in enforced.items()]
    attrs.append({"name": "shoal.runtime", "value": runtime})
    if simulate:
        attrs.append({"name": "shoal.simulated", "value": "true"})
    if mps and gpus:  # what ECS advertises when MPS can serve every GPU (ECS §2.2)
        attrs.append({"name": "ecs.capability.gpu-sharing-mps"})
    return {
        "cluster": cluster,
        "capacityProvider": capacity_provider,
        "hostId": host,
        "instanceType": instance_type or None,
        "availabilityZone": availability_zone or None,
        "architecture": architecture(),
        "resources": {"cpu": cpu, "memory": memory, "ports": list(RESERVED_PORTS), "udpPorts": []},
        "gpus": [{"uuid": g.uuid, "model": g.model, "memoryMiB": g.memory_mib} for g in gpus],
        "attributes": attrs,
        "versionInfo": {"agentVersion": version, "agentHash": "shoal"},
    }
