"""Placement against the store: the engine's host table kept in step with the database, and the
decisions written back as allocations on the hosts and assignments on the tasks.

Decisions run inside the store's single writer (RunTask and StartTask place their own tasks in
their transaction; the control loop places what is still waiting), so on one server two
decisions never race. The host table of each cluster lives across units of work, so that a
decision never re-reads thousands of host rows:

- It catches up with the database by comparing row versions (at most every SYNC_INTERVAL, and
  at once after a rolled-back unit or when the control loop places).
- Writing is where it is checked: each host a unit placed on is re-read under a row lock.
  If its version moved (another server, or a change this table has not seen), the host is
  reloaded and the new allocations must still fit, else the unit fails with StaleWrite and the
  store runs it again on fresh state. So a stale table can cost a retry, never a double booking.
- A unit that rolls back after deciding (an error later in the request) leaves its decisions in
  the table; a listener on the connection's rollbacks marks those hosts for reloading.
"""

from __future__ import annotations

import time

from sqlalchemy import bindparam, event, select, update

from shoal import jsonio
from shoal.api.operations import Context, dumps
from shoal.domain.tasks import PENDING_STATES
from shoal.events.changes import emit_task_change
from shoal.scheduler.engine import Decision, HostTable, Plan
from shoal.scheduler.hosts import MAX_MPS_CLIENTS, HostInfo
from shoal.scheduler.resources import demand, gpu_devices, overbooked, remaining_resources, usage
from shoal.store.db import StaleWrite, update_versioned
from shoal.store.prepared import Prepared
from shoal.store.tables import container_instances as cis, daemon_task_definitions, task_definitions, tasks

PENDING_REASON = "shoal:pending-reason"
BATCH = 5000  # waiting tasks placed per unit of work by the control loop
# Seconds a host table may go without comparing versions with the database. It only delays
# seeing new room (tasks that wait are placed by the control loop, which syncs first); what is
# gone is caught when the decision is written.
SYNC_INTERVAL = 2.0
_max_mps_clients = MAX_MPS_CLIENTS  # per GPU: `shoal server --mps-max-clients` (configure)
_definitions: dict[str, dict] = {}  # task definitions never change once registered (status aside)
_plans: dict[str, Plan] = {}
_tables: dict[tuple[int, str], "_ClusterHosts"] = {}
# Every placement and every stop reads and writes its host: see shoal.store.prepared.
_HOST_FOR_UPDATE = Prepared(select(cis).where(cis.c.arn == bindparam("host")).with_for_update())
_HOST_VERSIONS = Prepared(select(cis.c.arn, cis.c.version).where(cis.c.cluster_name == bindparam("cluster"),
                                                                 cis.c.status != "INACTIVE"))
_WRITE_HOST = Prepared(update(cis).where(cis.c.arn == bindparam("host"), cis.c.version == bindparam("expected"))
                       .values(version=bindparam("next_version"), allocations=bindparam("new_allocations"),
                               doc=bindparam("new_doc")))
_WRITE_HOST_AND_SEQ = Prepared(update(cis).where(cis.c.arn == bindparam("host"), cis.c.version == bindparam("expected"))
                               .values(version=bindparam("next_version"), allocations=bindparam("new_allocations"),
                                       doc=bindparam("new_doc"), desired_seq=bindparam("seq")))


def configure(*, max_mps_clients: int) -> None:
    """Server settings that placement reads (before any host table is built)."""
    global _max_mps_clients
    _max_mps_clients = max_mps_clients
    for hosts in _tables.values():
        hosts.table.max_mps_clients = max_mps_clients


def task_definition(ctx: Context, arn: str) -> dict:
    """A task's definition by ARN: an ordinary one, or a daemon's (a daemon task's)."""
    doc = _definitions.get(arn)
    if doc is None:
        table = daemon_task_definitions if ":daemon-task-definition/" in arn else task_definitions
        row = ctx.conn.execute(select(table.c.doc).where(table.c.arn == arn)).first()
        doc = _definitions.setdefault(arn, jsonio.loads(row.doc))
    return doc


def plan_for(placement: dict | str) -> Plan:
    """The compiled plan of a placement (its JSON, as stored on the task row, or the dict)."""
    key = placement if isinstance(placement, str) else jsonio.dumps(placement, sort_keys=True)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) > 10_000:
            _plans.clear()
        plan = _plans[key] = Plan.compile(jsonio.loads(key))
    return plan


def host_info(row) -> HostInfo:
    doc = jsonio.loads(row.doc)
    resources = {r["name"]: r for r in doc["registeredResources"]}
    return HostInfo(
        arn=row.arn, version=row.version, status=row.status, connected=bool(doc.get("agentConnected")),
        provider=row.capacity_provider_name, cpu=resources["CPU"]["integerValue"],
        memory=resources["MEMORY"]["integerValue"],
        ports=frozenset(resources.get("PORTS", {}).get("stringSetValue", [])),
        udp_ports=frozenset(resources.get("PORTS_UDP", {}).get("stringSetValue", [])),
        gpus=[(g["gpuId"], g.get("totalMemoryInMiB", 0)) for g in doc.get("gpuDevices", [])],
        attributes={a["name"]: a.get("value") for a in doc.get("attributes", [])},
        registered_at=doc.get("registeredAt") or 0.0,
        agent_version=(doc.get("versionInfo") or {}).get("agentVersion"),
        ec2_instance_id=doc.get("ec2InstanceId"), allocations=jsonio.loads(row.allocations),
        blocked=bool(doc.get("_blocked")), impaired_gpus=frozenset(doc.get("_impairedGpus", ())))


class _ClusterHosts:
    """One cluster's host table and how fresh it is."""

    def __init__(self, cluster_name: str):
        self.cluster_name = cluster_name
        self.table = HostTable(max_mps_clients=_max_mps_clients)
        self.synced_at = float("-inf")
        self.resync = True

    def fresh(self, conn, *, force: bool = False) -> HostTable:
        if force or self.resync or time.monotonic() - self.synced_at > SYNC_INTERVAL:
            self.sync(conn)
        return self.table

    def sync(self, conn) -> None:
        current = dict(_HOST_VERSIONS.tuples(conn, {"cluster": self.cluster_name}))
        table = self.table
        for arn in [a for a in table.slot if a not in current]:
            table.remove(arn)
        stale = [arn for arn, version in current.items()
                 if arn not in table.slot or table.hosts[table.slot[arn]].version != version]
        for start in range(0, len(stale), 500):
            for row in conn.execute(select(cis).where(cis.c.arn.in_(stale[start:start + 500]))):
                table.upsert(host_info(row))
        self.synced_at, self.resync = time.monotonic(), False

    def forget(self, arn: str) -> None:
        """Reload this host at the next use (its cached state may be ahead of the database)."""
        slot = self.table.slot.get(arn)
        if slot is not None:
            self.table.hosts[slot].version = -1
        self.resync = True


def _hosts(conn, cluster_name: str) -> _ClusterHosts:
    engine = conn.engine
    key = (id(engine), cluster_name)
    hosts = _tables.get(key)
    if hosts is None:
        hosts = _tables[key] = _ClusterHosts(cluster_name)
        if not engine.__dict__.get("_shoal_placement_listeners"):
            engine._shoal_placement_listeners = True
            event.listen(engine, "rollback", _rolled_back)
            event.listen(engine, "rollback_savepoint", lambda conn, name, context: _rolled_back(conn))
            event.listen(engine, "commit", lambda conn: conn.info.pop("shoal.placed", None))
    return hosts


def _track(conn, hosts: _ClusterHosts, arn: str) -> None:
    conn.info.setdefault("shoal.placed", []).append((hosts, arn))


def _rolled_back(conn) -> None:
    for hosts, arn in conn.info.pop("shoal.placed", []):
        hosts.forget(arn)


class Placer:
    """Placement decisions for one cluster within one unit of work."""

    def __init__(self, ctx: Context, cluster_name: str, *, fresh: bool = False):
        self.ctx, self.cluster_name, self._fresh = ctx, cluster_name, fresh
        self._hosts: _ClusterHosts | None = None
        self._placed: dict[str, dict[str, dict]] = {}  # host ARN -> task ARN -> allocation
        self._only: set[str] = set()  # hosts named by StartTask: their agent need not be connected
        self._any_status: set[str] = set()  # hosts given a daemon's task: they need not be ACTIVE

    @property
    def table(self) -> HostTable:
        if self._hosts is None:
            self._hosts = _hosts(self.ctx.conn, self.cluster_name)
            return self._hosts.fresh(self.ctx.conn, force=self._fresh)
        return self._hosts.table

    def place(self, task: dict, placement: dict | str, only: str | None = None, *,
              any_status: bool = False) -> str | None:
        """Assign `task` (its document, changed in place) to a host (`only` that one, for
        StartTask, and whatever its status with `any_status`: a daemon's task, which starts
        before its host is ACTIVE and stays while it drains); return None, or why not."""
        need = demand(task, task_definition(self.ctx, task["taskDefinitionArn"]))
        if only is not None and only not in self.table.slot:
            self._hosts.sync(self.ctx.conn)  # a host that joined since the last sync (a daemon's first task)
        decision = self.table.place(task["taskArn"], need, plan_for(placement), only=only,
                                    require_connected=only is None, any_status=any_status)
        if not isinstance(decision, Decision):
            return decision
        _track(self.ctx.conn, self._hosts, decision.arn)
        self._placed.setdefault(decision.arn, {})[task["taskArn"]] = decision.allocation
        if only:
            self._only.add(decision.arn)
        if any_status:
            self._any_status.add(decision.arn)
        host = self.table.hosts[decision.slot]
        task.update(containerInstanceArn=decision.arn, lastStatus="PENDING" if task["lastStatus"] in PENDING_STATES
                    else task["lastStatus"])
        if host.provider:
            task["capacityProviderName"] = host.provider
        task["attributes"] = [a for a in task.get("attributes", []) if a["name"] != PENDING_REASON]
        for container in task["containers"]:
            if container["name"] in decision.gpu_ids:
                container["gpuIds"] = decision.gpu_ids[container["name"]]
        return None

    def flush(self, *, unwritten: bool = False) -> dict[str, int]:
        """Write the hosts placed on, checked against the database (see the module docstring),
        and tell their agents.

        `unwritten`: the tasks placed have no rows yet (RunTask, a service starting tasks).
        Instead of stamping their rows at the end of the unit of work (an UPDATE of each new
        row; see shoal.api.agent.desired), each host's desired-state sequence moves here, in
        the same write as its allocations and under the same row lock; the caller writes the
        returned number (host ARN -> sequence) into each new row's host_seq."""
        seqs = {arn: self._write(arn, self._placed[arn], unwritten) for arn in sorted(self._placed)}
        self._placed.clear()
        return seqs

    def _write(self, arn: str, new: dict[str, dict], unwritten: bool = False) -> int:
        conn, table = self.ctx.conn, self._hosts.table
        row = _HOST_FOR_UPDATE.first(conn, {"host": arn})
        slot = table.slot.get(arn)
        if row is None or slot is None or row.version != table.hosts[slot].version:
            # The table was behind: check the decisions against what is really there.
            problem = _unusable(row, new, connected_required=arn not in self._only,
                                any_status=arn in self._any_status)
            if problem:
                if row is None or row.status == "INACTIVE":
                    table.remove(arn)
                else:
                    table.upsert(host_info(row))
                raise StaleWrite(f"container instance {arn} changed under placement: {problem}")
        in_step = slot is not None and row.version == table.hosts[slot].version
        if in_step:  # the table's copy is the row's plus these decisions: no need to parse the row's
            allocations = table.hosts[slot].allocations
        else:
            allocations = jsonio.loads(row.allocations)
            allocations.update(new)
        seq = row.desired_seq + 1 if unwritten else None
        version = write_allocations(self.ctx, row, jsonio.loads(row.doc), allocations, desired_seq=seq)
        for task_arn in new:
            self.ctx.tell_agent(arn, None if unwritten else task_arn)
        if in_step:
            table.hosts[slot].version = version  # the table already holds these decisions
        else:  # take the host as it now is
            host = host_info(row)
            host.version, host.allocations = version, allocations
            table.upsert(host)
        return seq


def _unusable(row, new: dict[str, dict], *, connected_required: bool, any_status: bool = False) -> str | None:
    if row is None or row.status == "INACTIVE" or (row.status != "ACTIVE" and not any_status):
        return "not ACTIVE"
    doc = jsonio.loads(row.doc)
    if connected_required and not doc.get("agentConnected"):
        return "agent not connected"
    if connected_required and doc.get("_blocked"):
        return "a critical daemon is down"
    impaired = set(doc.get("_impairedGpus", ()))
    if any(use["mode"] == "mps" and uuid in impaired for a in new.values() for uuid, use in a["gpus"].items()):
        return "the GPU's MPS control daemon is impaired"
    return overbooked(doc["registeredResources"], doc.get("gpuDevices", []), {**jsonio.loads(row.allocations), **new})


def write_allocations(ctx: Context, row, doc: dict, allocations: dict, *, desired_seq: int | None = None) -> int:
    """Write the host's allocations (and its desired-state sequence, if given); return its new
    version."""
    used = usage(allocations)
    doc["remainingResources"] = remaining_resources(doc["registeredResources"], used)
    doc["gpuDevices"] = gpu_devices(doc.get("gpuDevices", []), used)
    values = {"host": row.arn, "expected": row.version, "next_version": row.version + 1,
              "new_allocations": dumps(allocations), "new_doc": dumps(doc)}
    if desired_seq is None:
        written = _WRITE_HOST.run(ctx.conn, values)
    else:
        written = _WRITE_HOST_AND_SEQ.run(ctx.conn, {**values, "seq": desired_seq})
    if written != 1:
        raise StaleWrite(f"container instance {row.arn} changed concurrently")
    return row.version + 1


def host_changed(ctx: Context, cluster_name: str, host_arn: str) -> None:
    """A host's row changed outside placement (it became ACTIVE, say): the table reloads it at
    its next use, so that the next decision sees it as it is."""
    hosts = _tables.get((id(ctx.conn.engine), cluster_name))
    if hosts is not None:
        hosts.forget(host_arn)


def release(ctx: Context, host_arn: str | None, task_arn: str) -> None:
    """Give back what `task_arn` held on its host (idempotent)."""
    if not host_arn:
        return
    row = _HOST_FOR_UPDATE.first(ctx.conn, {"host": host_arn})
    if row is None:
        return
    allocations = jsonio.loads(row.allocations)
    if allocations.pop(task_arn, None) is None:
        return
    version = write_allocations(ctx, row, jsonio.loads(row.doc), allocations)
    ctx.dirty_clusters.add(row.cluster_name)
    hosts = _tables.get((id(ctx.conn.engine), row.cluster_name))
    slot = hosts.table.slot.get(host_arn) if hosts else None
    if slot is not None:
        cached = hosts.table.hosts[slot]
        _track(ctx.conn, hosts, host_arn)
        if cached.version == row.version:  # in step: apply the release, not a reload
            hosts.table.release(host_arn, task_arn)
            cached.version = version
        else:
            hosts.forget(host_arn)


def place_pending(ctx: Context, cluster_name: str) -> int:
    """Place the cluster's waiting tasks, oldest first; return how many found a host."""
    rows = ctx.conn.execute(
        select(tasks).where(tasks.c.cluster_name == cluster_name, tasks.c.desired_status == "RUNNING",
                            tasks.c.container_instance_arn.is_(None), tasks.c.last_status.in_(PENDING_STATES))
        .order_by(tasks.c.created_at, tasks.c.id).limit(BATCH)).all()
    if not rows:
        return 0
    placer, placed = Placer(ctx, cluster_name, fresh=True), 0
    for row in rows:
        doc = jsonio.loads(row.doc)
        reason = placer.place(doc, row.placement or "{}")
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
