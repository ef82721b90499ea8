"""Automatic repair of managed hosts: start-before-stop, under a rate limit (issue #5 point 4,
issue #6 point 3; ecs-semantics §1.7 and §3).

Scope: hosts of MANAGED_INSTANCES capacity providers whose `autoRepairConfiguration.actionsStatus`
is not DISABLED (it is ENABLED by default). On self-managed capacity, or with repair disabled,
nothing here acts: the fault is reported and the operator owns recovery.

A host needs repair when it is ACTIVE and impaired (a critical daemon is down: the DAEMON check
counts and is IMPAIRED; or ACCELERATED_COMPUTE is IMPAIRED), or when it ended
REGISTRATION_FAILED (a critical daemon never started on it). The controller pattern, each step
idempotent and recorded in `host_repairs`, so that a restarted server carries on:

1. start, if the provider's rate limit allows (else one REPAIR_WAITING action-log entry per
   wait): the host is set DRAINING, which stops new placements and makes services replace their
   tasks elsewhere first; a replacement host of the same instance type is launched;
2. standalone tasks are re-run once on healthy capacity, each copy tagged
   `shoal:rerun-of=<original task ARN>`; an original is stopped once its copy runs;
3. once no application task is left on the old host (its daemons stop last: the daemon
   scheduler) and its replacement is ACTIVE, the old host is terminated through the provisioner
   and deregistered (HOST_REPAIR_COMPLETED, with how long the repair took).

Rate limit: at most 20 % of a provider's hosts drain for repair at once, and at most 1 when it
has fewer than 9 (replacements launched by repairs in flight are not counted as hosts). A host
is not repaired twice within COOLDOWN seconds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field

from sqlalchemy import delete, insert, select, update

from shoal import jsonio
from shoal.api.ecs.common import cluster_row
from shoal.api.ecs.container_instances import set_state
from shoal.api.ecs.tasks import create_tasks
from shoal.api.operations import Context, dumps
from shoal.domain import health
from shoal.events import action_log
from shoal.events.changes import emit_task_change
from shoal.providers import LaunchRequest, ProvisionerError
from shoal.scheduler.placement import task_definition
from shoal.store.db import update_versioned
from shoal.store.tables import capacity_providers, container_instances as cis, host_repairs, tasks

log = logging.getLogger(__name__)
COOLDOWN = 600.0
RERUN_TAG = "shoal:rerun-of"
DAEMON_GRACE = 10.0  # after the last application task, how long the daemons get to stop
STOP_CODE = "TerminationNotice"
LOST_AGENT_GRACE = 60.0  # a lost agent is repaired after this long: not for a blip of the network


def rate_limit(hosts: int) -> int:
    """How many of a provider's hosts may drain for repair at once (ECS's GPU auto repair rule)."""
    return 1 if hosts < 9 else max(1, math.floor(0.2 * hosts))


def impairment(status: str, doc: dict, now: float) -> str | None:
    """Why a host needs repair, or None."""
    if status == "REGISTRATION_FAILED":
        return doc.get("statusReason") or "registration failed"
    if status != "ACTIVE":
        return None
    hs = doc.get("healthStatus") or {}
    for kind in ("DAEMON", "ACCELERATED_COMPUTE"):
        check = health.check(hs, kind) if hs else {}
        if check.get("status") == "IMPAIRED" and health.counts(check):
            return f"{kind}: {check.get('statusReason') or 'impaired'}"
    lost = health.check(hs, "AGENT_CONNECTIVITY") if hs else {}
    if lost.get("status") == "IMPAIRED" and now - lost.get("lastStatusChange", now) >= LOST_AGENT_GRACE:
        return f"AGENT_CONNECTIVITY: {lost.get('statusReason') or 'agent lost'}"
    return None


@dataclass
class ProviderHosts:
    name: str
    cluster: str
    instance_type: str | None
    hosts: list = field(default_factory=list)  # rows: arn, ec2_instance_id, status, doc


class RepairController:
    def __init__(self, capacity):
        self.capacity = capacity  # shoal.control.capacity.CapacityController: the provisioner

    async def reconcile(self, hub) -> None:
        if self.capacity.server_url is None:
            return
        providers, repairs = await hub.store.read(_observe)
        now = time.time()
        for view in providers:
            mine = [r for r in repairs if r.provider == view.name]
            replacements = {r.replacement_host_id for r in mine if r.state == "DRAINING"}
            counted = [h for h in view.hosts if h.ec2_instance_id not in replacements]
            in_flight = sum(r.state == "DRAINING" for r in mine)
            limit = rate_limit(len(counted))
            by_host = {r.host_arn: r for r in mine}
            for host in view.hosts:
                record = by_host.get(host.arn)
                if record is not None and record.state == "DRAINING":
                    await self._advance(hub, view, host, record)
                    continue
                reason = impairment(host.status, jsonio.loads(host.doc), now)
                if reason is None and record is not None and record.state == "WAITING":
                    await hub.write(lambda ctx, h=host: _recovered(ctx, h))
                if reason is None or host.ec2_instance_id in replacements:
                    continue
                if record is not None and record.state == "DONE" and now - record.started_at < COOLDOWN:
                    continue  # flapping: not repaired twice within the cool-down
                if in_flight >= limit:
                    await hub.write(lambda ctx, h=host: _wait(ctx, view, h, reason, limit))
                    continue
                in_flight += 1
                await self._start(hub, view, host, reason)

    async def _start(self, hub, view: ProviderHosts, host, reason: str) -> None:
        if await hub.write(lambda ctx: _start(ctx, view, host, reason)):
            await self._launch(hub, view, host)

    async def _advance(self, hub, view: ProviderHosts, host, record) -> None:
        failed = next((h for h in view.hosts if h.ec2_instance_id == record.replacement_host_id
                       and h.status == "REGISTRATION_FAILED"), None)
        if failed is not None:  # the replacement never got ready: it goes, and another comes
            await asyncio.to_thread(self.capacity.provisioner.terminate, failed.ec2_instance_id)
            await hub.write(lambda ctx: _replacement_failed(ctx, host.arn, failed.arn))
            record = None
        if record is None or record.replacement_host_id is None:  # (or the launch failed last time)
            await self._launch(hub, view, host)
            return
        lost = not jsonio.loads(host.doc).get("agentConnected")
        if not await hub.write(lambda ctx: _move_tasks(ctx, host.arn, record, lost=lost,
                                                       wait_for_replacement=host.status != "REGISTRATION_FAILED")):
            return
        await asyncio.to_thread(self.capacity.provisioner.terminate, host.ec2_instance_id)
        await hub.write(lambda ctx: _finish(ctx, host.arn, record))

    async def _launch(self, hub, view: ProviderHosts, host) -> None:
        """Start before stop: a host of the same instance type joins the provider."""
        if view.instance_type is None:
            return
        request = LaunchRequest(view.instance_type, 1, view.cluster, view.name, self.capacity.server_url,
                                self.capacity.join_token)
        try:
            [replacement] = await asyncio.to_thread(self.capacity.provisioner.launch, request)
        except ProvisionerError as err:  # the host drains anyway; the launch is tried again next pass
            log.error("could not launch a replacement for %s: %s", host.ec2_instance_id, err)
            return
        self.capacity.expect(replacement.host_id, view.name)
        await hub.write(lambda ctx: _replacement_launched(ctx, host.arn, replacement.host_id))


# --- observe ---------------------------------------------------------------------------------------

def _observe(conn) -> tuple[list[ProviderHosts], list]:
    from shoal.control.capacity import instance_type_of

    views = []
    for row in conn.execute(select(capacity_providers).where(capacity_providers.c.status == "ACTIVE",
                                                             capacity_providers.c.kind == "MANAGED_INSTANCES")):
        doc = jsonio.loads(row.doc)
        repair = (doc.get("managedInstancesProvider", {}).get("autoRepairConfiguration") or {})
        if repair.get("actionsStatus", "ENABLED") == "DISABLED":
            continue
        view = ProviderHosts(row.name, row.cluster_name, instance_type_of(doc))
        view.hosts = conn.execute(select(cis.c.arn, cis.c.ec2_instance_id, cis.c.status, cis.c.doc, cis.c.cluster_name)
                                  .where(cis.c.capacity_provider_name == row.name,
                                         cis.c.status != "INACTIVE")).all()
        views.append(view)
    return views, conn.execute(select(host_repairs)).all()


# --- act (each a unit of work) ------------------------------------------------------------------------

def _log(ctx: Context, cluster, event_name: str, level: str, detail: dict, daemon: str | None = None) -> None:
    action_log.record(ctx, cluster=cluster.name, level=level, resource_arn=cluster.arn,
                      source_id=detail.get("containerInstanceArn", cluster.arn), event_name=event_name,
                      detail=detail, daemon=daemon)


def _daemon_of(ctx: Context, host_arn: str, reason: str) -> str | None:
    """The daemon whose failure impaired the host, when a daemon did: its latest task there."""
    if not reason.startswith("DAEMON"):
        return None
    return ctx.conn.execute(select(tasks.c.daemon_name).where(tasks.c.container_instance_arn == host_arn,
                                                              tasks.c.daemon_name.is_not(None))
                            .order_by(tasks.c.created_at.desc()).limit(1)).scalar_one_or_none()


def _wait(ctx: Context, view: ProviderHosts, host, reason: str, limit: int) -> None:
    row = ctx.conn.execute(select(host_repairs).where(host_repairs.c.host_arn == host.arn)).first()
    if row is not None and row.state == "WAITING":
        return  # said once per wait
    values = dict(cluster_name=host.cluster_name, provider=view.name, host_id=host.ec2_instance_id, reason=reason,
                  state="WAITING", started_at=ctx.now, replacement_host_id=None, reruns="{}")
    if row is None:
        ctx.conn.execute(insert(host_repairs).values(host_arn=host.arn, **values))
    else:
        ctx.conn.execute(update(host_repairs).where(host_repairs.c.host_arn == host.arn).values(**values))
    _log(ctx, cluster_row(ctx, host.cluster_name), "REPAIR_WAITING", "WARN",
         {"containerInstanceArn": host.arn, "statusReason": reason,
          "reason": f"at most {limit} host(s) of capacity provider {view.name} may drain for repair at once"})


def _recovered(ctx: Context, host) -> None:
    """A host that waited on the rate limit recovered by itself: no repair."""
    ctx.conn.execute(delete(host_repairs).where(host_repairs.c.host_arn == host.arn, host_repairs.c.state == "WAITING"))
    _log(ctx, cluster_row(ctx, host.cluster_name), "REPAIR_CANCELLED", "INFO",
         {"containerInstanceArn": host.arn, "reason": "the host recovered while it waited for the rate limit"})


def _start(ctx: Context, view: ProviderHosts, host, reason: str) -> bool:
    row = ctx.conn.execute(select(cis).where(cis.c.arn == host.arn).with_for_update()).first()
    if row is None or row.version is None or impairment(row.status, jsonio.loads(row.doc), ctx.now) is None:
        return False  # recovered, or gone, meanwhile
    cluster = cluster_row(ctx, row.cluster_name)
    if row.status == "ACTIVE":
        set_state(ctx, cluster, row, "DRAINING")
    values = dict(cluster_name=row.cluster_name, provider=view.name, host_id=row.ec2_instance_id, reason=reason,
                  state="DRAINING", started_at=ctx.now, replacement_host_id=None, reruns="{}")
    if ctx.conn.execute(update(host_repairs).where(host_repairs.c.host_arn == row.arn).values(**values)).rowcount == 0:
        ctx.conn.execute(insert(host_repairs).values(host_arn=row.arn, **values))
    daemon = _daemon_of(ctx, row.arn, reason)
    _log(ctx, cluster, "HOST_REPAIR_STARTED", "WARN", {"containerInstanceArn": row.arn, "statusReason": reason,
                                                      "daemon": daemon}, daemon=daemon)
    return True


def _replacement_launched(ctx: Context, host_arn: str, host_id: str) -> None:
    ctx.conn.execute(update(host_repairs).where(host_repairs.c.host_arn == host_arn)
                     .values(replacement_host_id=host_id))
    row = ctx.conn.execute(select(host_repairs.c.cluster_name).where(host_repairs.c.host_arn == host_arn)).first()
    _log(ctx, cluster_row(ctx, row.cluster_name), "HOST_REPLACEMENT_LAUNCHED", "INFO",
         {"containerInstanceArn": host_arn, "replacementHostId": host_id})


def _replacement_failed(ctx: Context, host_arn: str, replacement_arn: str) -> None:
    from shoal.control.capacity import retire_host

    retire_host(ctx, replacement_arn, vanished=True)
    ctx.conn.execute(update(host_repairs).where(host_repairs.c.host_arn == host_arn).values(replacement_host_id=None))
    row = ctx.conn.execute(select(host_repairs.c.cluster_name).where(host_repairs.c.host_arn == host_arn)).first()
    _log(ctx, cluster_row(ctx, row.cluster_name), "HOST_REPLACEMENT_FAILED", "WARN",
         {"containerInstanceArn": host_arn, "replacementContainerInstanceArn": replacement_arn})


def _replacement_active(ctx: Context, record) -> str | None:
    if record.replacement_host_id is None:
        return None
    return ctx.conn.execute(select(cis.c.arn).where(cis.c.ec2_instance_id == record.replacement_host_id,
                                                    cis.c.status == "ACTIVE")).scalar_one_or_none()


def _move_tasks(ctx: Context, host_arn: str, record, *, wait_for_replacement: bool = True, lost: bool = False) -> bool:
    """Re-run the host's standalone tasks once elsewhere, stop each original once its copy runs;
    True when the host can go: no application task left on it, its daemons stopped (or given
    DAEMON_GRACE), its replacement ACTIVE (a host that never got ACTIVE need not wait for it).
    A host whose agent is lost stops nothing: it goes once the copies exist and the replacement
    is ACTIVE, and its tasks are marked STOPPED as it is deregistered."""
    replacement = _replacement_active(ctx, record)
    reruns: dict[str, str] = jsonio.loads(record.reruns or "{}")
    live = ctx.conn.execute(select(tasks).where(tasks.c.container_instance_arn == host_arn,
                                                tasks.c.last_status != "STOPPED")).all()
    apps = [t for t in live if t.daemon_name is None]
    changed = False
    for row in apps:
        if row.service_name is not None or row.desired_status == "STOPPED":
            continue  # services move their own tasks; a stop is under way
        copy = reruns.get(row.arn)
        if copy is None:
            reruns[row.arn] = _rerun(ctx, row)
            changed = True
        elif ctx.conn.execute(select(tasks.c.last_status).where(tasks.c.arn == copy)).scalar_one_or_none() in (
                "RUNNING", "STOPPED", None):
            _stop(ctx, row, f"Host {record.host_id} is being replaced; task re-run as {copy.rsplit('/', 1)[-1]}")
    if changed:
        ctx.conn.execute(update(host_repairs).where(host_repairs.c.host_arn == host_arn)
                         .values(reruns=dumps(reruns)))
    if replacement is None and wait_for_replacement:
        return False
    if lost:
        return True
    if apps:
        return False
    daemons_left = [t for t in live if t.daemon_name is not None]
    if daemons_left:
        last_app_stop = max((jsonio.loads(d).get("stoppedAt") or 0 for d in ctx.conn.execute(
            select(tasks.c.doc).where(tasks.c.container_instance_arn == host_arn, tasks.c.daemon_name.is_(None))
        ).scalars()), default=record.started_at)
        return ctx.now - last_app_stop > DAEMON_GRACE
    return True


def _rerun(ctx: Context, row) -> str:
    """A copy of a standalone task, placed on healthy capacity (it waits if there is none yet)."""
    doc = jsonio.loads(row.doc)
    cluster = cluster_row(ctx, row.cluster_name, lock="share")
    td = task_definition(ctx, doc["taskDefinitionArn"])
    placement = jsonio.loads(row.placement or "{}")
    placement.setdefault("placementConstraints", [])
    placement.setdefault("placementStrategy", [])
    placement.setdefault("capacityProviderStrategy", [])
    req = {"overrides": {k: v for k, v in doc.get("overrides", {}).items() if k == "containerOverrides"},
           "group": doc.get("group"), "startedBy": doc.get("startedBy"),
           "tags": [t for t in doc.get("tags", []) if t["key"] != RERUN_TAG] + [{"key": RERUN_TAG, "value": row.arn}]}
    [copy] = create_tasks(ctx, req, cluster, td, 1, launch_type=row.launch_type, placement=placement,
                          last_status="PROVISIONING" if placement["capacityProviderStrategy"] else "PENDING")
    action_log.record(ctx, cluster=cluster.name, level="INFO", resource_arn=cluster.arn, source_id=row.arn,
                      event_name="TASK_RERUN", detail={"taskArn": row.arn, "rerunTaskArn": copy["taskArn"],
                                                       "containerInstanceArn": row.container_instance_arn})
    return copy["taskArn"]


def _stop(ctx: Context, row, reason: str) -> None:
    doc = jsonio.loads(row.doc)
    doc.update(desiredStatus="STOPPED", stopCode=STOP_CODE, stoppedReason=reason, stoppingAt=ctx.now,
               version=doc["version"] + 1)
    update_versioned(ctx.conn, tasks, {"arn": row.arn}, row.version, desired_status="STOPPED", doc=dumps(doc))
    ctx.tell_agent(row.container_instance_arn, row.arn)
    emit_task_change(ctx, doc)


def _finish(ctx: Context, host_arn: str, record) -> None:
    from shoal.control.capacity import retire_host

    retire_host(ctx, host_arn, vanished=True)
    replacement = _replacement_active(ctx, record)
    ctx.conn.execute(update(host_repairs).where(host_repairs.c.host_arn == host_arn)
                     .values(state="DONE", done_at=ctx.now))
    daemon = _daemon_of(ctx, host_arn, record.reason)
    _log(ctx, cluster_row(ctx, record.cluster_name), "HOST_REPAIR_COMPLETED", "INFO",
         {"containerInstanceArn": host_arn, "replacementContainerInstanceArn": replacement,
          "durationSeconds": round(ctx.now - record.started_at, 3), "statusReason": record.reason,
          "daemon": daemon}, daemon=daemon)
