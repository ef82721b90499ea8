"""Task definition validation and defaults: pure code, no store, no HTTP.

Beyond the shape checks the service model does, this enforces what ECS itself enforces
(unique container names, an essential container, memory for EC2, dependsOn targets) and the GPU
rules of the 2026 MPS release:
- `value` and `sharingStrategy` are mutually exclusive, and one of them is required for GPU;
- `sharingStrategy` only with type GPU;
- all GPU containers of a task use the same option (all whole GPUs or all MPS);
- `nvidiaMps.memory` >= 1 MiB, `maxComputePercent` in 1..100.
"""

from __future__ import annotations

import re

from shoal.domain import query
from shoal.domain.errors import InvalidParameter

CONTAINER_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,255}$")
MAX_CONTAINERS = 10
DEPENDENCY_CONDITIONS = {"START", "COMPLETE", "SUCCESS", "HEALTHY"}


def parse_cpu(value: str, field: str = "cpu") -> int:
    """Task-level cpu: CPU units ("1024") or vCPUs ("1 vCPU")."""
    text = value.strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*vcpu", text)
    try:
        units = int(float(m.group(1)) * 1024) if m else int(text)
    except (ValueError, OverflowError):
        raise InvalidParameter(f"Invalid parameter '{field}': '{value}' is neither CPU units nor 'N vCPU'.") from None
    if units < 1:
        raise InvalidParameter(f"Invalid parameter '{field}': must be at least 1 CPU unit.")
    return units


def parse_memory(value: str, field: str = "memory") -> int:
    """Task-level memory: MiB ("2048") or GB ("2 GB")."""
    text = value.strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*gb", text)
    try:
        mib = int(float(m.group(1)) * 1024) if m else int(text)
    except (ValueError, OverflowError):
        raise InvalidParameter(f"Invalid parameter '{field}': '{value}' is neither MiB nor 'N GB'.") from None
    if mib < 6:
        raise InvalidParameter(f"Invalid parameter '{field}': a task needs at least 6 MiB of memory.")
    return mib


def gpu_option(container: dict) -> str | None:
    """'whole', 'mps' or None: how a container asks for GPUs."""
    for req in container.get("resourceRequirements", []):
        if req["type"] == "GPU":
            return "mps" if req.get("sharingStrategy") else "whole"
    return None


def _check_resource_requirements(container: dict, path: str) -> None:
    seen = set()
    for j, req in enumerate(container.get("resourceRequirements", [])):
        rpath = f"{path}.resourceRequirements[{j}]"
        kind, value, sharing = req["type"], req.get("value"), req.get("sharingStrategy")
        if kind in seen:
            raise InvalidParameter(f"Invalid parameter '{rpath}.type': {kind} is given more than once.")
        seen.add(kind)
        if sharing is not None and kind != "GPU":
            raise InvalidParameter(f"Invalid parameter '{rpath}.sharingStrategy': only valid with type GPU.")
        if kind != "GPU":
            if value is None:
                raise InvalidParameter(f"Missing required parameter '{rpath}.value' for type {kind}.")
            continue
        if value is not None and sharing is not None:
            raise InvalidParameter(
                f"Invalid parameter '{rpath}': 'value' and 'sharingStrategy' are mutually exclusive.")
        if sharing is not None:
            mps = sharing.get("nvidiaMps")
            if mps is None:
                raise InvalidParameter(f"Invalid parameter '{rpath}.sharingStrategy': 'nvidiaMps' is required.")
            if mps.get("memory", 0) < 1:
                raise InvalidParameter(f"Invalid parameter '{rpath}.sharingStrategy.nvidiaMps.memory': "
                                       "must be at least 1 (MiB).")
            pct = mps.get("maxComputePercent")
            if pct is not None and not 1 <= pct <= 100:
                raise InvalidParameter(f"Invalid parameter '{rpath}.sharingStrategy.nvidiaMps.maxComputePercent':"
                                       " must be between 1 and 100.")
        elif value is None:
            raise InvalidParameter(f"Invalid parameter '{rpath}': GPU needs either 'value' or 'sharingStrategy'.")
        elif value != "ALL" and not (value.isdigit() and int(value) >= 1):
            raise InvalidParameter(f"Invalid parameter '{rpath}.value': the number of GPUs must be a "
                                   f"positive integer or ALL, got '{value}'.")


def validate(req: dict) -> dict:
    """Check a RegisterTaskDefinition request; return the definition's document (no arn/revision)."""
    family = req["family"]
    if not CONTAINER_NAME_RE.match(family):
        raise InvalidParameter(f"Invalid parameter 'family': '{family[:64]}' must have 1 to 255 letters, "
                               "numbers, hyphens and underscores.")
    containers = req["containerDefinitions"]
    if not containers:
        raise InvalidParameter("Invalid parameter 'containerDefinitions': at least one container is required.")
    if len(containers) > MAX_CONTAINERS:
        raise InvalidParameter(f"Invalid parameter 'containerDefinitions': at most {MAX_CONTAINERS} containers.")
    task_cpu = parse_cpu(req["cpu"]) if req.get("cpu") else None
    task_memory = parse_memory(req["memory"]) if req.get("memory") else None

    names: list[str] = []
    for i, c in enumerate(containers):
        path = f"containerDefinitions[{i}]"
        name = c.get("name")
        if not name:
            raise InvalidParameter(f"Missing required parameter '{path}.name'.")
        if not CONTAINER_NAME_RE.match(name):
            raise InvalidParameter(f"Invalid parameter '{path}.name': '{name[:64]}' must have 1 to 255 letters, "
                                   "numbers, hyphens and underscores.")
        if name in names:
            raise InvalidParameter(f"Invalid parameter '{path}.name': duplicate container name '{name}'.")
        names.append(name)
        if task_memory is None and not (c.get("memory") or c.get("memoryReservation")):
            raise InvalidParameter(f"Invalid setting for container '{name}': at least one of 'memory' or "
                                   "'memoryReservation' must be specified when the task has no 'memory'.")
        if c.get("memory") and c.get("memoryReservation") and c["memoryReservation"] > c["memory"]:
            raise InvalidParameter(f"Invalid parameter '{path}.memoryReservation': must not exceed 'memory'.")
        if c.get("memory") is not None and c["memory"] < 6:
            raise InvalidParameter(f"Invalid parameter '{path}.memory': a container needs at least 6 MiB.")
        if task_memory and c.get("memory") and c["memory"] > task_memory:
            raise InvalidParameter(f"Invalid parameter '{path}.memory': exceeds the task memory ({task_memory}).")
        if task_cpu and c.get("cpu") and c["cpu"] > task_cpu:
            raise InvalidParameter(f"Invalid parameter '{path}.cpu': exceeds the task cpu ({task_cpu}).")
        _check_resource_requirements(c, path)

    options = {gpu_option(c) for c in containers} - {None}
    if len(options) > 1:
        raise InvalidParameter("Invalid parameter 'containerDefinitions': all GPU containers of a task must "
                               "use the same option, either whole GPUs ('value') or 'sharingStrategy'.")

    for i, c in enumerate(containers):
        for j, dep in enumerate(c.get("dependsOn", [])):
            dpath = f"containerDefinitions[{i}].dependsOn[{j}]"
            if dep["containerName"] not in names or dep["containerName"] == c["name"]:
                raise InvalidParameter(f"Invalid parameter '{dpath}.containerName': no other container named "
                                       f"'{dep['containerName']}' in this task definition.")
            if dep["condition"] not in DEPENDENCY_CONDITIONS:
                raise InvalidParameter(f"Invalid parameter '{dpath}.condition': must be one of "
                                       f"{sorted(DEPENDENCY_CONDITIONS)}.")

    normalized = [_container_defaults(c) for c in containers]
    if not any(c["essential"] for c in normalized):
        raise InvalidParameter("Invalid parameter 'containerDefinitions': at least one container must be essential.")

    for i, pc in enumerate(req.get("placementConstraints", [])):
        if pc.get("type") != "memberOf":
            raise InvalidParameter(f"Invalid parameter 'placementConstraints[{i}].type': task definitions only "
                                   "allow memberOf.")
        query.parse(pc.get("expression") or "", f"placementConstraints[{i}].expression")
    if len(req.get("placementConstraints", [])) > 10:
        raise InvalidParameter("Invalid parameter 'placementConstraints': at most 10 constraints.")

    doc = {k: v for k, v in req.items() if k not in ("tags", "containerDefinitions")}
    if task_cpu is not None:  # ECS returns "1 vCPU" as "1024" and "2 GB" as "2048"
        doc["cpu"] = str(task_cpu)
    if task_memory is not None:
        doc["memory"] = str(task_memory)
    doc.update(
        containerDefinitions=normalized,
        networkMode=req.get("networkMode", "bridge"),
        volumes=req.get("volumes", []),
        placementConstraints=req.get("placementConstraints", []),
        requiresAttributes=_requires_attributes(normalized),
        compatibilities=["EC2", "EXTERNAL", "MANAGED_INSTANCES"],
        status="ACTIVE",
    )
    return doc


def _container_defaults(c: dict) -> dict:
    out = {"essential": True, "portMappings": [], "environment": [], "mountPoints": [], "volumesFrom": [],
           "cpu": 0}
    out.update(c)
    return out


def _requires_attributes(containers: list[dict]) -> list[dict]:
    if any(gpu_option(c) == "mps" for c in containers):
        return [{"name": "ecs.capability.gpu-sharing-mps"}]
    return []
