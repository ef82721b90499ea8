"""A cluster's hosts as columnar arrays: what placement decides on.

Rows are host slots; a host keeps its slot until it is removed, and a removed slot is reused.
Free CPU and memory, GPU modes, free GPU memory and clients, attribute values (as integer
codes) and the tasks of each group per host are numpy columns, so that a decision is a few
whole-array operations (shoal.scheduler.engine). Placing or releasing a task updates the few
cells it changes; nothing is rebuilt per task. Caches derived from what does not change as
tasks are placed (eligibility, attributes) are dropped whenever a host's static data changes
(`epoch`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

NO_GPU, IDLE, MPS, DEDICATED = -1, 0, 1, 2
MAX_MPS_CLIENTS = 48  # per GPU, as the MPS server allows by default (CUDA 11.4+: 48 clients)


@dataclass
class HostInfo:
    """One host as the engine needs it (parsed from its stored row by the caller)."""

    arn: str
    version: int
    status: str
    connected: bool
    provider: str | None
    cpu: int
    memory: int
    ports: frozenset[str]  # reserved by the host itself (registered PORTS)
    udp_ports: frozenset[str]
    gpus: list[tuple[str, int]]  # (uuid, total MiB)
    attributes: dict[str, str | None]
    registered_at: float = 0.0
    agent_version: str | None = None
    ec2_instance_id: str | None = None
    allocations: dict[str, dict] = field(default_factory=dict)  # task ARN -> allocation
    blocked: bool = False  # ACTIVE, but takes no new application tasks (a critical daemon is down)
    impaired_gpus: frozenset[str] = frozenset()  # GPUs that take no new MPS work (their MPS daemon is down)

    def static_key(self) -> tuple:
        return (self.status, self.blocked, self.impaired_gpus, self.connected, self.provider, tuple(sorted(self.attributes.items(),
                key=lambda kv: kv[0])), self.agent_version, self.ec2_instance_id, self.registered_at,
                self.cpu, self.memory, tuple(self.gpus))


class Column:
    """A string-valued host property as integer codes (-1: absent), so that a comparison is
    evaluated once per distinct value and spread can count per value with a bincount."""

    def __init__(self, size: int):
        self.codes = np.full(size, -1, np.int32)
        self.values: list[str | None] = []
        self._index: dict[str | None, int] = {}

    def set(self, slot: int, value: str | None, present: bool) -> None:
        if not present:
            self.codes[slot] = -1
            return
        code = self._index.get(value)
        if code is None:
            code = self._index[value] = len(self.values)
            self.values.append(value)
        self.codes[slot] = code

    def grow(self, size: int) -> None:
        self.codes = np.concatenate([self.codes, np.full(size - len(self.codes), -1, np.int32)])


AGENT_VERSION, EC2_INSTANCE_ID = "\0agentVersion", "\0ec2InstanceId"  # columns beside the attributes


class HostColumns:
    """Every non-INACTIVE host of one cluster, columnar (the decisions: engine.HostTable)."""

    def __init__(self, capacity: int = 64, gpus_per_host: int = 8, rng: random.Random | None = None,
                 max_mps_clients: int = MAX_MPS_CLIENTS):
        self.max_mps_clients = max_mps_clients
        self.size = 0  # slots in use or freed, [0, size)
        self.slot: dict[str, int] = {}
        self.hosts: list[HostInfo | None] = []
        self._free: list[int] = []
        self.epoch = 0  # bumped when any host's static data changes
        self.rng = rng or random.Random()
        self._static: dict[tuple, np.ndarray] = {}
        self._spread: dict[tuple[str, str], np.ndarray] = {}  # (group, attribute) -> tasks per value code
        self._value_masks_cache: dict[str, tuple] = {}  # attribute -> one host mask per value, values present
        self._alloc_arrays(capacity, gpus_per_host)

    # -- storage --------------------------------------------------------------------------------
    def _alloc_arrays(self, n: int, g: int) -> None:
        self.cap, self.gmax = n, g
        self.present = np.zeros(n, bool)  # a host is in the slot
        self.active = np.zeros(n, bool)  # status ACTIVE
        self.connected = np.zeros(n, bool)
        self.provider = np.full(n, -1, np.int32)
        self.providers: dict[str, int] = {}
        self.cpu_free = np.zeros(n, np.int64)
        self.mem_free = np.zeros(n, np.int64)
        self.running = np.zeros(n, np.int64)
        self.registered_at = np.zeros(n, np.float64)
        self.gpu_count = np.zeros(n, np.int32)
        self.idle_gpus = np.zeros(n, np.int32)
        self.mps_room = np.full(n, -1, np.int64)  # most MiB one more MPS client could get on one GPU
        self.gpu_mode = np.full((n, g), NO_GPU, np.int8)
        self.gpu_free = np.zeros((n, g), np.int64)  # MiB left for MPS shares
        self.gpu_clients = np.zeros((n, g), np.int32)
        self.gpu_mps_ok = np.zeros((n, g), bool)  # the GPU's MPS daemon is healthy: it may take MPS shares
        self.columns: dict[str, Column] = {}
        self.groups: dict[str, np.ndarray] = {}

    def _grow(self, n: int, g: int) -> None:
        def pad(a: np.ndarray, fill) -> np.ndarray:
            out = np.full((n, g) if a.ndim == 2 else n, fill, a.dtype)
            out[tuple(slice(0, s) for s in a.shape)] = a
            return out

        for name, fill in (("present", False), ("active", False), ("connected", False), ("provider", -1),
                           ("cpu_free", 0), ("mem_free", 0), ("running", 0), ("registered_at", 0.0),
                           ("gpu_count", 0), ("idle_gpus", 0), ("mps_room", -1), ("gpu_mode", NO_GPU), ("gpu_free", 0),
                           ("gpu_clients", 0), ("gpu_mps_ok", False)):
            setattr(self, name, pad(getattr(self, name), fill))
        for column in self.columns.values():
            column.grow(n)
        self.groups = {k: pad(v, 0) for k, v in self.groups.items()}
        self.cap, self.gmax = n, g

    def _column(self, name: str) -> Column:
        column = self.columns.get(name)
        if column is None:  # first asked for: fill it in from every host
            column = self.columns[name] = Column(self.cap)
            for i, host in enumerate(self.hosts):
                if host is not None:
                    column.set(i, *self._property(host, name))
        return column

    def group_counts(self, group: str) -> np.ndarray:
        counts = self.groups.get(group)
        if counts is None:
            counts = self.groups[group] = np.zeros(self.cap, np.int64)
        return counts

    # -- hosts ----------------------------------------------------------------------------------
    def upsert(self, host: HostInfo) -> int:
        """Add a host or replace what is known of it (a newer row), allocations included."""
        if len(host.gpus) > self.gmax:
            self._grow(self.cap, len(host.gpus))
        i = self.slot.get(host.arn)
        if i is not None:
            old = self.hosts[i]
            if old.static_key() != host.static_key():
                self._changed_static()
            for task_arn, alloc in list(old.allocations.items()):
                self._unapply(i, alloc)
        else:
            i = self._free.pop() if self._free else self.size
            if i == self.size:
                self.size += 1
            if self.size > self.cap:
                self._grow(2 * self.size, self.gmax)
            self.slot[host.arn] = i
            while len(self.hosts) <= i:
                self.hosts.append(None)
            self._changed_static()
        allocations, host.allocations = host.allocations, {}
        self.hosts[i] = host
        self.present[i], self.connected[i] = True, host.connected
        self.active[i] = host.status == "ACTIVE" and not host.blocked
        self.provider[i] = -1 if host.provider is None else self.providers.setdefault(host.provider,
                                                                                      len(self.providers))
        self.cpu_free[i], self.mem_free[i], self.running[i] = host.cpu, host.memory, 0
        self.registered_at[i] = host.registered_at
        self.gpu_count[i] = self.idle_gpus[i] = len(host.gpus)
        self.gpu_mode[i], self.gpu_free[i], self.gpu_clients[i] = NO_GPU, 0, 0
        self.gpu_mps_ok[i] = False
        for g, (uuid, total) in enumerate(host.gpus):
            self.gpu_mode[i, g], self.gpu_free[i, g] = IDLE, total
            self.gpu_mps_ok[i, g] = uuid not in host.impaired_gpus
        self._refresh_gpus(i)
        for name, column in self.columns.items():
            column.set(i, *self._property(host, name))
        for name in host.attributes:
            if name not in self.columns:
                self._column(name).set(i, *self._property(host, name))
        for task_arn, alloc in allocations.items():
            self.apply(i, task_arn, alloc)
        return i

    @staticmethod
    def _property(host: HostInfo, name: str) -> tuple[str | None, bool]:
        if name == AGENT_VERSION:
            return host.agent_version, host.agent_version is not None
        if name == EC2_INSTANCE_ID:
            return host.ec2_instance_id, host.ec2_instance_id is not None
        return host.attributes.get(name), name in host.attributes

    def remove(self, arn: str) -> None:
        i = self.slot.pop(arn, None)
        if i is None:
            return
        for alloc in self.hosts[i].allocations.values():
            self._unapply(i, alloc)
        self.hosts[i] = None
        self.present[i] = self.active[i] = self.connected[i] = False
        self.gpu_mode[i] = NO_GPU
        self.gpu_count[i] = self.idle_gpus[i] = 0
        self.mps_room[i] = -1
        for column in self.columns.values():
            column.codes[i] = -1
        self._free.append(i)
        self._changed_static()

    def _changed_static(self) -> None:
        self.epoch += 1
        self._static.clear()
        self._spread.clear()
        self._value_masks_cache.clear()

    # -- allocations ----------------------------------------------------------------------------
    def apply(self, i: int, task_arn: str, alloc: dict) -> None:
        host = self.hosts[i]
        if task_arn in host.allocations:
            return
        host.allocations[task_arn] = alloc
        self._count(i, alloc, +1)

    def release(self, arn: str, task_arn: str) -> dict | None:
        i = self.slot.get(arn)
        if i is None:
            return None
        alloc = self.hosts[i].allocations.pop(task_arn, None)
        if alloc is not None:
            self._count(i, alloc, -1)
        return alloc

    def _unapply(self, i: int, alloc: dict) -> None:
        self._count(i, alloc, -1)

    def _count(self, i: int, alloc: dict, sign: int) -> None:
        self.cpu_free[i] -= sign * alloc["cpu"]
        self.mem_free[i] -= sign * alloc["memory"]
        self.running[i] += sign
        group = alloc.get("group", "")
        self.group_counts(group)[i] += sign
        for (g, name), counts in self._spread.items():
            if g == group:
                code = self.columns[name].codes[i] if name in self.columns else -1
                counts[code] += sign
        if alloc["gpus"]:
            uuids = [u for u, _ in self.hosts[i].gpus]
            for uuid, use in alloc["gpus"].items():
                if uuid not in uuids:
                    continue
                g = uuids.index(uuid)
                if use["mode"] == "mps":
                    self.gpu_free[i, g] -= sign * use.get("memory", 0)
                    self.gpu_clients[i, g] += sign * use["containers"]
                    self.gpu_mode[i, g] = MPS if self.gpu_clients[i, g] > 0 else IDLE
                else:
                    self.gpu_mode[i, g] = DEDICATED if sign > 0 else IDLE
                    self.gpu_clients[i, g] += sign
            self._refresh_gpus(i)

    def mps_usable(self, rows, clients: int) -> np.ndarray:
        """Which GPUs of host slot(s) `rows` may take an MPS share of `clients` more clients
        (memory aside): shared or idle, their MPS daemon healthy, room for the clients."""
        mode = self.gpu_mode[rows]
        return (((mode == IDLE) | (mode == MPS)) & self.gpu_mps_ok[rows]
                & (self.gpu_clients[rows] + clients <= self.max_mps_clients))

    def _refresh_gpus(self, i: int) -> None:
        mode = self.gpu_mode[i]
        self.idle_gpus[i] = int(np.count_nonzero(mode == IDLE))
        usable = self.mps_usable(i, 1)
        self.mps_room[i] = int(self.gpu_free[i][usable].max()) if usable.any() else -1
