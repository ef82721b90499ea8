"""The placement engine: one decision per task over a cluster's host columns.

Pure code (numpy, no store, no HTTP). A decision runs the ECS pipeline over every host at
once: filter by resources (CPU, memory, ports, whole GPUs, MPS memory per GPU), then by
constraints (attributes the task definition requires, memberOf, distinctInstance), then order
by the strategies in the order given. The host state is shoal.scheduler.hosts; placing a task
updates it in place, so a batch of thousands of tasks is one pass of small vectorised steps
over consistent state. What does not change from task to task is cached per placement plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.domain import query
from shoal.scheduler.constraints import evaluate, is_static
from shoal.scheduler.hosts import IDLE, HostColumns
from shoal.scheduler.resources import ALL_GPUS, Demand, allocation

UNCHOSEN = np.iinfo(np.int64).max  # the score of a slot that is not a candidate
NO_HOSTS = "No Container Instances were found in your cluster."
MEMBER_OF = "MemberOf placement constraint unsatisfied."
DISTINCT = "DistinctInstance placement constraint unsatisfied."


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


class HostTable(HostColumns):
    """A cluster's hosts, and placement decisions on them.

    Every step works on whole boolean masks over the host slots: contiguous array operations
    cost a microsecond or two for 10,000 hosts, while gathering by index costs several times
    that, so candidates stay a mask until the very end.
    """

    def place(self, task_arn: str, need: Demand, plan: Plan, *, only: str | None = None,
              require_connected: bool = True, any_status: bool = False) -> Decision | str:
        """Choose a host for one task and record the allocation there; or say why not."""
        if only is not None:  # StartTask: the host the operator named, and no other
            base = np.zeros(self.size, bool)
            i = self.slot.get(only)
            if i is not None:
                base[i] = self.present[i] if any_status else self.active[i]
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
        out[idx] = (self.mps_usable(idx, clients) & (self.gpu_free[idx] >= memory)).any(axis=1)
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
        strategies = strategies or (("spread", "\0running"),)
        for step, (kind, fld) in enumerate(strategies):
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
            if step == len(strategies) - 1:  # the last strategy: the first slot with the best score
                return int(keyed.argmin())
            ok = ok & (score == keyed.min())
        return int(ok.argmax())  # the first True

    def _least_spread_value(self, ok: np.ndarray, group: str, name: str) -> np.ndarray:
        """Keep the candidates on the attribute values (zones, say) holding the fewest of the
        group's tasks; hosts without the attribute count as one more value."""
        counts = self._spread_counts(group, name).tolist()  # a handful of values: plain Python
        masks, present = self._value_masks(name)
        levels: dict[int, list[int]] = {}
        for v in present:
            levels.setdefault(counts[v], []).append(v)
        for level in sorted(levels):
            values = levels[level]
            if len(values) == len(present):  # every value ties: the strategy leaves the candidates as they are
                return ok
            chosen = masks[values[0]]
            for v in values[1:]:
                chosen = chosen | masks[v]
            keep = ok & chosen
            if keep.any():
                return keep
        return ok

    def _value_masks(self, name: str) -> tuple[np.ndarray, list[int]]:
        """One host mask per value of the attribute (the last row: hosts without it), and the
        values some host has."""
        found = self._value_masks_cache.get(name)
        if found is None:
            column = self._column(name)
            codes = column.codes[:self.size]
            bucket = np.where(codes >= 0, codes, len(column.values))
            masks = bucket[None, :] == np.arange(len(column.values) + 1)[:, None]
            found = self._value_masks_cache[name] = (masks, np.flatnonzero(masks.any(axis=1)).tolist())
        return found

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
            usable = self.mps_usable(i, clients).tolist()
            best = min((g for g in range(len(uuids)) if usable[g] and free[g] >= memory),
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
