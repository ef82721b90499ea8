"""The placement engine: a cluster's hosts as columnar arrays, and one decision per task.

Pure code (numpy, no store, no HTTP). A decision runs the ECS pipeline over every host at
once: filter by resources (CPU, memory, ports, whole GPUs, MPS memory per GPU), then by
constraints (attributes the task definition requires, memberOf, distinctInstance), then order
by the strategies in the order given. Placing a task updates the few array cells it changes,
so a batch of thousands of tasks is one pass of small vectorised steps over consistent state,
never a rebuild per task.

Rows are host slots; a host keeps its slot until it is removed, and a removed slot is reused.
What does not change from task to task (eligibility, providers, attributes: the "static" part
of a decision) is cached per placement plan and dropped whenever a host's static data changes
(`epoch`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from shoal.domain import query
from shoal.scheduler.constraints import evaluate, is_static
from shoal.scheduler.resources import ALL_GPUS, Demand, allocation

NO_GPU, IDLE, MPS, DEDICATED = -1, 0, 1, 2
MAX_MPS_CLIENTS = 48  # per GPU, as the MPS server allows by default (CUDA 11.4+: 48 clients)
UNCHOSEN = np.iinfo(np.int64).max  # the score of a slot that is not a candidate
NO_HOSTS = "No Container Instances were found in your cluster."
MEMBER_OF = "MemberOf placement constraint unsatisfied."
DISTINCT = "DistinctInstance placement constraint unsatisfied."


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

    def static_key(self) -> tuple:
        return (self.status, self.connected, self.provider, tuple(sorted(self.attributes.items(),
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


@dataclass(frozen=True)
class Plan:
    """A placement request compiled once: providers (ordered by preference), constraints, strategies."""

    providers: tuple[str, ...]  # empty: any provider (launch type EC2)
    weights: tuple[tuple[str, int, int], ...]  # (provider, base, weight) of a capacity provider strategy
    static: tuple[query.Expr, ...]  # memberOf on what placing tasks does not change (cached per plan)
    dynamic: tuple[query.Expr, ...]  # memberOf on runningTasksCount or task:group (per decision)
    expressions: tuple[str, ...]
    distinct: bool
    strategies: tuple[tuple[str, str], ...]  # (type, field lower-cased)

    @classmethod
    def compile(cls, placement: dict) -> "Plan":
        weights = tuple((s["capacityProvider"], s.get("base", 0), s.get("weight", 0))
                        for s in placement.get("capacityProviderStrategy", [])
                        if s.get("weight", 0) > 0 or s.get("base", 0) > 0)
        member_of, expressions, distinct = [], [], False
        for c in placement.get("placementConstraints", []):
            if c.get("type") == "distinctInstance":
                distinct = True
            elif c.get("type") == "memberOf" and c.get("expression"):
                member_of.append(query.parse(c["expression"]))
                expressions.append(c["expression"])
        strategies = tuple((s.get("type", ""), (s.get("field") or "").lower())
                           for s in placement.get("placementStrategy", []))
        return cls(tuple(p for p, _, _ in weights), weights, tuple(e for e in member_of if is_static(e)),
                   tuple(e for e in member_of if not is_static(e)), tuple(expressions), distinct, strategies)


@dataclass
class Decision:
    slot: int
    arn: str
    allocation: dict
    gpu_ids: dict[str, list[str]]  # container name -> GPU UUIDs


class HostTable:
    """Every non-INACTIVE host of one cluster, columnar."""

    def __init__(self, capacity: int = 64, gpus_per_host: int = 8, rng: random.Random | None = None):
        self.size = 0  # slots in use or freed, [0, size)
        self.slot: dict[str, int] = {}
        self.hosts: list[HostInfo | None] = []
        self._free: list[int] = []
        self.epoch = 0  # bumped when any host's static data changes
        self.rng = rng or random.Random()
        self._static: dict[tuple, np.ndarray] = {}
        self._spread: dict[tuple[str, str], np.ndarray] = {}  # (group, attribute) -> tasks per value code
        self._value_masks_cache: dict[str, np.ndarray] = {}  # attribute -> one host mask per value
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
                           ("gpu_clients", 0)):
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
        self.present[i], self.active[i], self.connected[i] = True, host.status == "ACTIVE", host.connected
        self.provider[i] = -1 if host.provider is None else self.providers.setdefault(host.provider,
                                                                                      len(self.providers))
        self.cpu_free[i], self.mem_free[i], self.running[i] = host.cpu, host.memory, 0
        self.registered_at[i] = host.registered_at
        self.gpu_count[i] = self.idle_gpus[i] = len(host.gpus)
        self.gpu_mode[i], self.gpu_free[i], self.gpu_clients[i] = NO_GPU, 0, 0
        for g, (_, total) in enumerate(host.gpus):
            self.gpu_mode[i, g], self.gpu_free[i, g] = IDLE, total
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

    def _refresh_gpus(self, i: int) -> None:
        mode = self.gpu_mode[i]
        self.idle_gpus[i] = int(np.count_nonzero(mode == IDLE))
        usable = ((mode == IDLE) | (mode == MPS)) & (self.gpu_clients[i] < MAX_MPS_CLIENTS)
        self.mps_room[i] = int(self.gpu_free[i][usable].max()) if usable.any() else -1

    # -- decisions ------------------------------------------------------------------------------
    # Every step works on whole boolean masks over the host slots: contiguous array operations
    # cost a microsecond or two for 10,000 hosts, while gathering by index costs several times
    # that, so candidates stay a mask until the very end.

    def place(self, task_arn: str, need: Demand, plan: Plan, *, only: str | None = None,
              require_connected: bool = True) -> Decision | str:
        """Choose a host for one task and record the allocation there; or say why not."""
        if only is not None:  # StartTask: the host the operator named, and no other
            base = np.zeros(self.size, bool)
            i = self.slot.get(only)
            if i is not None:
                base[i] = self.active[i]
            return self._decide(task_arn, need, plan, base, self._constrained(base, plan, need))
        reason = None
        for providers in self._provider_order(plan, need.group):
            base, candidates = self._static_candidates(plan, need, providers, require_connected)
            decision = self._decide(task_arn, need, plan, base, candidates)
            if isinstance(decision, Decision):
                return decision
            reason = reason or decision
        return reason

    def _provider_order(self, plan: Plan, group: str) -> list[tuple[str, ...]]:
        """Which providers to try, in order: all of the strategy's at once for one provider or
        none; else the one the base/weight split wants next, then the others (best effort)."""
        if len(plan.weights) <= 1:
            return [plan.providers]
        codes, counts = self.provider[:self.size], self.groups.get(group)
        have = {p: int(counts[:self.size][codes == self.providers[p]].sum())
                if counts is not None and p in self.providers else 0 for p, _, _ in plan.weights}

        def want(entry):  # below its base first, then the lowest share per unit of weight
            p, base, weight = entry
            return have[p] >= base, (have[p] - base) / weight if weight else float("inf")

        return [(p,) for p, _, _ in sorted(plan.weights, key=want)]

    def _static_candidates(self, plan: Plan, need: Demand, providers: tuple[str, ...],
                           require_connected: bool) -> tuple[np.ndarray, np.ndarray]:
        """The eligible slots (ACTIVE, connected, of the providers), and those of them that also
        pass the constraints that do not change as tasks are placed. Cached until a host's
        static data changes."""
        key = (plan, providers, need.required_attributes, require_connected)
        cached = self._static.get(key)
        if cached is None:
            n = self.size
            base = self.active[:n].copy()
            if require_connected:
                base &= self.connected[:n]
            if providers:
                base &= np.isin(self.provider[:n], [self.providers[p] for p in providers if p in self.providers])
            cached = self._static[key] = (base, self._constrained(base, plan, need))
        return cached

    def _constrained(self, base: np.ndarray, plan: Plan, need: Demand) -> np.ndarray:
        ok = base.copy()
        for name in need.required_attributes:
            ok &= self._column(name).codes[:self.size] >= 0
        for expr in plan.static:
            ok &= evaluate(expr, self, np.arange(self.size))
        return ok

    def _decide(self, task_arn: str, need: Demand, plan: Plan, base: np.ndarray,
                candidates: np.ndarray) -> Decision | str:
        ok = self._fits(need, candidates)
        for expr in plan.dynamic:
            ok &= evaluate(expr, self, np.arange(self.size))
        if plan.distinct:
            ok &= self.group_counts(need.group)[:self.size] == 0
        if need.ports or need.udp_ports:
            for i in np.flatnonzero(ok):
                ok[i] = self._ports_free(i, need)
        if not ok.any():
            return self._why_not(need, plan, base)
        i = self._choose(ok, plan.strategies, need.group)
        gpus, ids = self._pick_gpus(i, need)
        alloc = allocation(need, gpus)
        self.apply(i, task_arn, alloc)
        return Decision(i, self.hosts[i].arn, alloc, ids)

    def _fits(self, need: Demand, ok: np.ndarray) -> np.ndarray:
        n = self.size
        ok = ok & (self.cpu_free[:n] >= need.cpu)
        ok &= self.mem_free[:n] >= need.memory
        if need.whole_gpus:
            ok &= self._whole_gpus_fit(need)
        if need.mps_memory:
            ok &= self._mps_fits(need, ok)
        return ok

    def _whole_gpus_fit(self, need: Demand) -> np.ndarray:
        count, idle = self.gpu_count[:self.size], self.idle_gpus[:self.size]
        if ALL_GPUS in need.whole_gpus.values():
            named = sum(n for n in need.whole_gpus.values() if n != ALL_GPUS)
            return (count > 0) & (idle == count) & (named == 0)
        return (count > 0) & (idle >= sum(need.whole_gpus.values()))

    def _mps_fits(self, need: Demand, ok: np.ndarray) -> np.ndarray:
        memory, clients = sum(need.mps_memory.values()), len(need.mps_memory)
        if clients == 1:  # the common case, from the per-host summary
            return self.mps_room[:self.size] >= memory
        out = np.zeros(self.size, bool)
        idx = np.flatnonzero(ok)
        mode = self.gpu_mode[idx]
        usable = ((mode == IDLE) | (mode == MPS)) & (self.gpu_free[idx] >= memory) \
            & (self.gpu_clients[idx] + clients <= MAX_MPS_CLIENTS)
        out[idx] = usable.any(axis=1)
        return out

    def _ports_free(self, i: int, need: Demand) -> bool:
        host = self.hosts[i]
        if len(set(need.ports)) != len(need.ports) or len(set(need.udp_ports)) != len(need.udp_ports):
            return False
        taken = set(host.ports).union(*(a["ports"] for a in host.allocations.values()))
        taken_udp = set(host.udp_ports).union(*(a["udpPorts"] for a in host.allocations.values()))
        return not (taken & set(need.ports) or taken_udp & set(need.udp_ports))

    def _choose(self, ok: np.ndarray, strategies: tuple[tuple[str, str], ...], group: str) -> int:
        """Strategies in order, each keeping its best candidates for the next; the first slot
        (earliest registered) wins a final tie. No strategy: fewest tasks on the host."""
        n = self.size
        for kind, fld in strategies or (("spread", "\0running"),):
            if kind == "random":
                idx = np.flatnonzero(ok)
                return int(idx[self.rng.randrange(len(idx))])
            if kind == "spread" and fld.startswith("attribute:"):
                ok = self._least_spread_value(ok, group, fld[len("attribute:"):])
                continue
            if kind == "binpack":
                score = (self.cpu_free if fld == "cpu" else self.mem_free)[:n]
            elif kind == "spread" and fld in ("instanceid", "host"):
                score = self.group_counts(group)[:n]
            elif fld == "\0running":
                score = self.running[:n]
            else:
                continue
            keyed = np.where(ok, score, UNCHOSEN)
            ok = ok & (score == keyed.min())
        return int(ok.argmax())  # the first True

    def _least_spread_value(self, ok: np.ndarray, group: str, name: str) -> np.ndarray:
        """Keep the candidates on the attribute values (zones, say) holding the fewest of the
        group's tasks; hosts without the attribute count as one more value."""
        counts = self._spread_counts(group, name).tolist()  # a handful of values: plain Python
        masks = self._value_masks(name)
        for level in sorted(set(counts)):
            values = [v for v, c in enumerate(counts) if c == level]
            keep = ok & (masks[values[0]] if len(values) == 1 else masks[values].any(axis=0))
            if keep.any():
                return keep
        return ok

    def _value_masks(self, name: str) -> np.ndarray:
        """One host mask per value of the attribute (the last row: hosts without it)."""
        masks = self._value_masks_cache.get(name)
        if masks is None:
            column = self._column(name)
            codes = column.codes[:self.size]
            bucket = np.where(codes >= 0, codes, len(column.values))
            masks = self._value_masks_cache[name] = bucket[None, :] == np.arange(len(column.values) + 1)[:, None]
        return masks

    def _spread_counts(self, group: str, name: str) -> np.ndarray:
        """The group's tasks per value of the attribute (the last entry: hosts without it), kept
        up to date by every allocation and release."""
        key = (group, name)
        counts = self._spread.get(key)
        if counts is None:
            column = self._column(name)
            codes = column.codes[:self.size]
            bucket = np.where(codes >= 0, codes, len(column.values))
            counts = np.bincount(bucket, weights=self.group_counts(group)[:self.size],
                                 minlength=len(column.values) + 1).astype(np.int64)
            self._spread[key] = counts
        return counts

    def _pick_gpus(self, i: int, need: Demand) -> tuple[dict, dict[str, list[str]]]:
        uuids = [u for u, _ in self.hosts[i].gpus]
        gpus, ids = {}, {}
        if need.whole_gpus:
            idle = iter([uuids[g] for g, mode in enumerate(self.gpu_mode[i, :len(uuids)].tolist()) if mode == IDLE])
            for name, n in need.whole_gpus.items():
                ids[name] = [next(idle) for _ in range(len(uuids) if n == ALL_GPUS else n)]
                for uuid in ids[name]:
                    gpus[uuid] = {"mode": "whole", "containers": 1}
        if need.mps_memory:
            memory, clients = sum(need.mps_memory.values()), len(need.mps_memory)
            # Prefer a GPU already shared, the fullest that fits, so idle GPUs stay whole.
            mode, free = self.gpu_mode[i].tolist(), self.gpu_free[i].tolist()
            users = self.gpu_clients[i].tolist()
            best = min((g for g in range(len(uuids))
                        if mode[g] in (IDLE, MPS) and free[g] >= memory and users[g] + clients <= MAX_MPS_CLIENTS),
                       key=lambda g: (mode[g] == IDLE, free[g]))
            gpus[uuids[best]] = {"mode": "mps", "containers": clients, "memory": memory}
            ids.update({name: [uuids[best]] for name in need.mps_memory})
        return gpus, ids

    def _why_not(self, need: Demand, plan: Plan, base: np.ndarray) -> str:
        """The first filter of the pipeline that leaves no host: resources, then constraints."""
        if not base.any():
            return NO_HOSTS
        n = self.size
        steps = [
            ("RESOURCE:CPU", lambda ok: self.cpu_free[:n] >= need.cpu),
            ("RESOURCE:MEMORY", lambda ok: self.mem_free[:n] >= need.memory),
            ("RESOURCE:PORTS", lambda ok: np.array([bool(ok[i]) and self._ports_free(i, need) for i in range(n)],
                                                   bool) if need.ports or need.udp_ports else ok),
            ("RESOURCE:GPU", lambda ok: (self._whole_gpus_fit(need) if need.whole_gpus else ok)
             & (self._mps_fits(need, ok) if need.mps_memory else ok)),
        ]
        for name in need.required_attributes:
            steps.append((f"MISSING ATTRIBUTE: {name}", lambda ok, name=name: self._column(name).codes[:n] >= 0))
        for expr in plan.static + plan.dynamic:
            steps.append((MEMBER_OF, lambda ok, expr=expr: evaluate(expr, self, np.arange(n))))
        if plan.distinct:
            steps.append((DISTINCT, lambda ok: self.group_counts(need.group)[:n] == 0))
        ok = base
        for reason, keep in steps:
            ok = ok & keep(ok)
            if not ok.any():
                return reason
        return "RESOURCE:CPU"  # not reached: the fast path found nothing, so one of the steps must
