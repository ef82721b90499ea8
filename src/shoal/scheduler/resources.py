"""What a task needs and what a host has left: pure functions, no store.

A host's remaining resources are never kept as a running total. They are recomputed from its
registered resources and the allocations placement made on it (one per task, keyed by task ARN),
so adding or releasing an allocation twice changes nothing, and nothing can drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shoal.domain.task_definitions import gpu_option

IDLE, MPS, DEDICATED = "IDLE", "NVIDIA_MPS", "DEDICATED"
ALL_GPUS = -1


@dataclass(frozen=True)
class Demand:
    """One task's requirements, from its document and its task definition."""

    cpu: int
    memory: int
    ports: tuple[str, ...] = ()
    udp_ports: tuple[str, ...] = ()
    whole_gpus: dict[str, int] = field(default_factory=dict)  # container -> count (ALL_GPUS for "ALL")
    mps_memory: dict[str, int] = field(default_factory=dict)  # container -> MiB, all on one GPU
    required_attributes: tuple[str, ...] = ()
    group: str = ""


def _int(value) -> int:
    try:
        return int(str(value).strip() or 0)
    except ValueError:
        return 0


def demand(task: dict, task_definition: dict) -> Demand:
    containers = task["containers"]
    # Task-level cpu/memory reserve that much; otherwise the containers' own figures add up
    # (memory, else memoryReservation), as on ECS's EC2 launch type.
    cpu = _int(task.get("cpu")) or sum(_int(c.get("cpu")) for c in containers)
    memory = _int(task.get("memory")) or sum(_int(c.get("memory") or c.get("memoryReservation"))
                                             for c in containers)
    ports, udp, whole, mps = [], [], {}, {}
    for cdef in task_definition["containerDefinitions"]:
        for mapping in cdef.get("portMappings", []):
            # The process runtime shares the host's network: a container port is a host port.
            port = mapping.get("hostPort") or mapping.get("containerPort")
            if port:
                (udp if mapping.get("protocol") == "udp" else ports).append(str(port))
        option = gpu_option(cdef)
        for req in cdef.get("resourceRequirements", []):
            if req["type"] != "GPU":
                continue
            if option == "mps":
                mps[cdef["name"]] = int(req["sharingStrategy"]["nvidiaMps"]["memory"])
            else:
                whole[cdef["name"]] = ALL_GPUS if str(req["value"]).upper() == "ALL" else int(req["value"])
    required = tuple(a["name"] for a in task_definition.get("requiresAttributes", []))
    return Demand(cpu, memory, tuple(ports), tuple(udp), whole, mps, required, task.get("group", ""))


def allocation(d: Demand, gpus: dict[str, dict]) -> dict:
    """The record placement keeps for a task on a host. `gpus`: uuid -> {mode, containers, memory}."""
    return {"cpu": d.cpu, "memory": d.memory, "ports": list(d.ports), "udpPorts": list(d.udp_ports),
            "gpus": gpus, "group": d.group}


def _resource(registered: list[dict], name: str, default):
    for r in registered:
        if r["name"] == name:
            return r.get("integerValue", r.get("stringSetValue", default))
    return default


@dataclass
class Usage:
    """What a host's allocations take together, summed in one pass over them (a full host holds
    a hundred or more: one pass rather than one per resource and per GPU)."""

    cpu: int
    memory: int
    ports: set[str]
    udp_ports: set[str]
    gpus: dict[str, list[dict]]  # GPU UUID -> its uses, in allocation order


def usage(allocations: dict[str, dict]) -> Usage:
    cpu = memory = 0
    ports, udp_ports, gpus = set(), set(), {}
    for a in allocations.values():
        cpu += a["cpu"]
        memory += a["memory"]
        if a["ports"]:
            ports.update(a["ports"])
        if a["udpPorts"]:
            udp_ports.update(a["udpPorts"])
        for uuid, use in a["gpus"].items():
            if uuid in gpus:
                gpus[uuid].append(use)
            else:
                gpus[uuid] = [use]
    return Usage(cpu, memory, ports, udp_ports, gpus)


def remaining_resources(registered: list[dict], used: Usage) -> list[dict]:
    out = []
    for r in registered:
        r = dict(r)
        if r["name"] == "CPU":
            r["integerValue"] = r["integerValue"] - used.cpu
        elif r["name"] == "MEMORY":
            r["integerValue"] = r["integerValue"] - used.memory
        elif r["name"] == "PORTS":
            r["stringSetValue"] = sorted({*r["stringSetValue"], *used.ports}, key=int)
        elif r["name"] == "PORTS_UDP":
            r["stringSetValue"] = sorted({*r["stringSetValue"], *used.udp_ports}, key=int)
        elif r["name"] == "GPU":
            r["stringSetValue"] = [u for u in r["stringSetValue"] if u not in used.gpus]
        out.append(r)
    return out


def gpu_devices(devices: list[dict], used: Usage) -> list[dict]:
    """The host's gpuDevices: sharingMode, containerCount and remainingMemoryInMiB per GPU."""
    out = []
    for dev in devices:
        uses = used.gpus.get(dev["gpuId"], [])
        mode = IDLE if not uses else (MPS if uses[0]["mode"] == "mps" else DEDICATED)
        total = dev.get("totalMemoryInMiB", 0)
        taken = total if mode == DEDICATED else sum(u.get("memory", 0) for u in uses)
        out.append({**dev, "sharingMode": mode, "containerCount": sum(u["containers"] for u in uses),
                    "remainingMemoryInMiB": total - taken})
    return out


@dataclass
class HostCapacity:
    """A host as placement sees it: what is left, recomputed after every allocation."""

    arn: str
    registered: list[dict]
    devices: list[dict]
    allocations: dict[str, dict]

    def remaining(self) -> list[dict]:
        return remaining_resources(self.registered, usage(self.allocations))

    def devices_now(self) -> list[dict]:
        return gpu_devices(self.devices, usage(self.allocations))

    def groups(self) -> tuple[str, ...]:
        return tuple(a.get("group", "") for a in self.allocations.values())

    def fit(self, d: Demand) -> tuple[dict | None, dict[str, list[str]], str | None]:
        """(allocation, gpu ids per container, None) if the task fits here, else (None, {}, reason)."""
        taken = usage(self.allocations)
        left = remaining_resources(self.registered, taken)
        if d.cpu > _resource(left, "CPU", 0):
            return None, {}, "RESOURCE:CPU"
        if d.memory > _resource(left, "MEMORY", 0):
            return None, {}, "RESOURCE:MEMORY"
        used = set(_resource(left, "PORTS", []))
        if len(set(d.ports)) != len(d.ports) or used & set(d.ports):
            return None, {}, "RESOURCE:PORTS"
        used_udp = set(_resource(left, "PORTS_UDP", []))
        if len(set(d.udp_ports)) != len(d.udp_ports) or used_udp & set(d.udp_ports):
            return None, {}, "RESOURCE:PORTS_UDP"
        gpus, ids = {}, {}
        devices = gpu_devices(self.devices, taken)
        if d.whole_gpus:
            idle = [g["gpuId"] for g in devices if g["sharingMode"] == IDLE]
            if any(n == ALL_GPUS for n in d.whole_gpus.values()) and len(idle) != len(devices):
                return None, {}, "RESOURCE:GPU"
            wanted = sum(len(devices) if n == ALL_GPUS else n for n in d.whole_gpus.values())
            if not devices or wanted > len(idle):
                return None, {}, "RESOURCE:GPU"
            free = iter(idle)
            for name, n in d.whole_gpus.items():
                ids[name] = [next(free) for _ in range(len(devices) if n == ALL_GPUS else n)]
                for uuid in ids[name]:
                    gpus[uuid] = {"mode": "whole", "containers": 1}
        if d.mps_memory:
            need = sum(d.mps_memory.values())
            # Never an MPS share on a dedicated GPU, nor a whole GPU under MPS. Prefer a GPU already
            # shared (the fullest that fits), so that idle GPUs stay whole for whole-GPU work.
            shared = [g for g in devices if g["sharingMode"] != DEDICATED and g["remainingMemoryInMiB"] >= need]
            if not shared:
                return None, {}, "RESOURCE:GPU"
            best = min(shared, key=lambda g: (g["sharingMode"] == IDLE, g["remainingMemoryInMiB"]))
            gpus[best["gpuId"]] = {"mode": "mps", "containers": len(d.mps_memory), "memory": need}
            ids.update({name: [best["gpuId"]] for name in d.mps_memory})
        return allocation(d, gpus), ids, None


def overbooked(registered: list[dict], devices: list[dict], allocations: dict[str, dict]) -> str | None:
    """Why these allocations do not fit together on a host with these resources, or None.
    The check every write of a host's allocations passes, whatever the decision was based on."""
    allocs = list(allocations.values())
    if sum(a["cpu"] for a in allocs) > _resource(registered, "CPU", 0):
        return "RESOURCE:CPU"
    if sum(a["memory"] for a in allocs) > _resource(registered, "MEMORY", 0):
        return "RESOURCE:MEMORY"
    for kind, reserved in (("ports", "PORTS"), ("udpPorts", "PORTS_UDP")):
        taken = [p for a in allocs for p in a[kind]] + list(_resource(registered, reserved, []))
        if len(taken) != len(set(taken)):
            return "RESOURCE:PORTS"
    totals = {d["gpuId"]: d.get("totalMemoryInMiB", 0) for d in devices}
    for uuid, total in totals.items():
        uses = [a["gpus"][uuid] for a in allocs if uuid in a["gpus"]]
        whole = [u for u in uses if u["mode"] != "mps"]
        if whole and len(uses) > 1 or sum(u.get("memory", 0) for u in uses if u["mode"] == "mps") > total:
            return "RESOURCE:GPU"
    if any(uuid not in totals for a in allocs for uuid in a["gpus"]):
        return "RESOURCE:GPU"
    return None
