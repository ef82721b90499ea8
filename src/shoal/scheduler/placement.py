"""Placement, first version: filter hosts by resources and constraints, pick one by a simple
strategy, record the allocation on the host and the assignment on the task.

It runs inside the store's single writer (RunTask places its own tasks in its transaction; the
control loop places what is still waiting when capacity appears), so on one server two
decisions never race. Across servers sharing PostgreSQL, the host rows' optimistic versions
catch a double booking and the losing unit of work runs again. The full engine (strategies,
constraints at scale) is its own layer.
"""

from __future__ import annotations

import json
import random

from sqlalchemy import select

from shoal.api.operations import Context, dumps
from shoal.domain import query
from shoal.domain.tasks import PENDING_STATES
from shoal.events.changes import emit_task_change
from shoal.scheduler.resources import HostCapacity, demand
from shoal.store.db import update_versioned
from shoal.store.tables import container_instances as cis, task_definitions, tasks

PENDING_REASON = "shoal:pending-reason"
BATCH = 200
_definitions: dict[str, dict] = {}  # task definitions never change once registered (status aside)


def task_definition(ctx: Context, arn: str) -> dict:
    doc = _definitions.get(arn)
    if doc is None:
        row = ctx.conn.execute(select(task_definitions.c.doc).where(task_definitions.c.arn == arn)).first()
        doc = _definitions.setdefault(arn, json.loads(row.doc))
    return doc


def _providers(placement: dict) -> set[str]:
    """The capacity providers a strategy may place on (a zero weight without base takes none)."""
    return {s["capacityProvider"] for s in placement.get("capacityProviderStrategy", [])
            if s.get("weight", 0) > 0 or s.get("base", 0) > 0}


class Placer:
    """Placement decisions for one cluster within one unit of work."""

    def __init__(self, ctx: Context, cluster_name: str):
        self.ctx, self.cluster_name = ctx, cluster_name
        self._hosts: dict[str, tuple[object, dict, HostCapacity]] | None = None
        self._changed: set[str] = set()

    def _load(self) -> dict[str, tuple[object, dict, HostCapacity]]:
        if self._hosts is None:
            rows = self.ctx.conn.execute(select(cis).where(cis.c.cluster_name == self.cluster_name,
                                                           cis.c.status == "ACTIVE")
                                         .order_by(cis.c.registered_at, cis.c.id)).all()
            self._hosts = {}
            for row in rows:
                doc = json.loads(row.doc)
                self._hosts[row.arn] = (row, doc, HostCapacity(
                    row.arn, doc["registeredResources"],
                    [{"gpuId": g["gpuId"], "totalMemoryInMiB": g.get("totalMemoryInMiB", 0)}
                     for g in doc.get("gpuDevices", [])],
                    json.loads(row.allocations)))
        return self._hosts

    def place(self, task: dict, placement: dict, only: str | None = None) -> str | None:
        """Assign `task` (its document, changed in place) to a host (`only` that one, for
        StartTask); return None, or why not."""
        td = task_definition(self.ctx, task["taskDefinitionArn"])
        need = demand(task, td)
        providers = _providers(placement)
        hosts = [h for h in self._load().values() if not providers or h[0].capacity_provider_name in providers]
        if only:  # StartTask names the host: the operator vouches for it
            hosts = [h for h in hosts if h[0].arn == only]
        else:  # only a connected agent can start what lands on its host
            hosts = [h for h in hosts if h[1].get("agentConnected")]
        if not hosts:
            return "No Container Instances were found in your cluster."
        constraints = [(c["type"], query.parse(c["expression"], "expression") if c.get("expression") else None)
                       for c in placement.get("placementConstraints", [])]
        fits, reason = [], None
        for row, doc, capacity in hosts:
            attributes = {a["name"] for a in doc.get("attributes", [])}
            missing = sorted(set(need.required_attributes) - attributes)
            if missing:
                reason = f"MISSING ATTRIBUTE: {', '.join(missing)}"
                continue
            view = _host_view(doc, capacity)
            if any(kind == "memberOf" and expr is not None and not expr.matches(view) for kind, expr in constraints):
                reason = "MemberOf placement constraint unsatisfied."
                continue
            if any(kind == "distinctInstance" for kind, _ in constraints) and need.group in capacity.groups():
                reason = "DistinctInstance placement constraint unsatisfied."
                continue
            alloc, gpu_ids, why = capacity.fit(need)
            if alloc is None:
                reason = why
                continue
            fits.append((row, doc, capacity, alloc, gpu_ids))
        if not fits:
            return reason
        row, doc, capacity, alloc, gpu_ids = _choose(fits, placement.get("placementStrategy", []))
        capacity.allocations[task["taskArn"]] = alloc
        self._changed.add(row.arn)
        task.update(containerInstanceArn=row.arn, lastStatus="PENDING" if task["lastStatus"] in PENDING_STATES
                    else task["lastStatus"])
        if row.capacity_provider_name:
            task["capacityProviderName"] = row.capacity_provider_name
        task["attributes"] = [a for a in task.get("attributes", []) if a["name"] != PENDING_REASON]
        for container in task["containers"]:
            if container["name"] in gpu_ids:
                container["gpuIds"] = gpu_ids[container["name"]]
        return None

    def flush(self) -> None:
        """Write the hosts whose allocations changed, and tell their agents."""
        for arn in sorted(self._changed):
            row, doc, capacity = self._hosts[arn]
            write_allocations(self.ctx, row, doc, capacity.allocations)
        self._changed.clear()


def _host_view(doc: dict, capacity: HostCapacity) -> query.Host:
    from shoal.api.ecs.container_instances import host_view

    return host_view(doc, capacity.groups(), len(capacity.allocations))


def _choose(fits: list, strategies: list[dict]):
    """Strategies in order of precedence, v1: binpack on cpu or memory (least left that fits),
    random, or spread (fewest tasks, the default); ties go to the host registered first."""
    for strategy in strategies:
        kind, field = strategy.get("type"), (strategy.get("field") or "").lower()
        if kind == "random":
            return random.choice(fits)
        if kind == "binpack":
            name = "CPU" if field == "cpu" else "MEMORY"
            return min(fits, key=lambda f: next(r["integerValue"] for r in f[2].remaining() if r["name"] == name))
        if kind == "spread":
            break
    return min(fits, key=lambda f: len(f[2].allocations))


def write_allocations(ctx: Context, row, doc: dict, allocations: dict) -> None:
    capacity = HostCapacity(row.arn, doc["registeredResources"], doc.get("gpuDevices", []), allocations)
    doc["remainingResources"] = capacity.remaining()
    doc["gpuDevices"] = capacity.devices_now()
    update_versioned(ctx.conn, cis, {"arn": row.arn}, row.version, allocations=dumps(allocations), doc=dumps(doc))
    ctx.touched_hosts.add(row.arn)


def release(ctx: Context, host_arn: str | None, task_arn: str) -> None:
    """Give back what `task_arn` held on its host (idempotent)."""
    if not host_arn:
        return
    row = ctx.conn.execute(select(cis).where(cis.c.arn == host_arn).with_for_update()).first()
    if row is None:
        return
    allocations = json.loads(row.allocations)
    if allocations.pop(task_arn, None) is not None:
        write_allocations(ctx, row, json.loads(row.doc), allocations)
        ctx.dirty_clusters.add(row.cluster_name)


def place_pending(ctx: Context, cluster_name: str) -> int:
    """Place the cluster's waiting tasks, oldest first; return how many found a host."""
    rows = ctx.conn.execute(
        select(tasks).where(tasks.c.cluster_name == cluster_name, tasks.c.desired_status == "RUNNING",
                            tasks.c.container_instance_arn.is_(None), tasks.c.last_status.in_(PENDING_STATES))
        .order_by(tasks.c.created_at, tasks.c.id).limit(BATCH)).all()
    if not rows:
        return 0
    placer, placed = Placer(ctx, cluster_name), 0
    for row in rows:
        doc = json.loads(row.doc)
        reason = placer.place(doc, json.loads(row.placement or "{}"))
        if reason is None:
            doc["version"] += 1
            update_versioned(ctx.conn, tasks, {"arn": row.arn}, row.version, last_status=doc["lastStatus"],
                             container_instance_arn=doc["containerInstanceArn"], doc=dumps(doc))
            emit_task_change(ctx, doc)
            placed += 1
        elif set_pending_reason(doc, reason):
            update_versioned(ctx.conn, tasks, {"arn": row.arn}, row.version, doc=dumps(doc))
    placer.flush()
    return placed


def set_pending_reason(task: dict, reason: str) -> bool:
    """Record why a task still waits (a task attribute; not a state change, so no event and no
    new version). True if it changed."""
    attributes = [a for a in task.get("attributes", []) if a["name"] != PENDING_REASON]
    attributes.append({"name": PENDING_REASON, "value": reason[:255]})
    if attributes == task.get("attributes"):
        return False
    task["attributes"] = attributes
    return True
