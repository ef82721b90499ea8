"""What a host's daemons mean for the host (shoal.control.daemons runs it after each pass over
the host): its DAEMON health check, whether it takes new application tasks, and a REGISTERING
host's activation. The rules are in docs/decisions.md ("Managed daemons: on the hosts")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select

from shoal import jsonio
from shoal.api.ecs.container_instances import emit_health_change, emit_instance_change
from shoal.api.operations import Context, dumps
from shoal.domain import health
from shoal.scheduler.placement import host_changed
from shoal.store.db import update_versioned
from shoal.store.tables import container_instances as cis, tasks

if TYPE_CHECKING:
    from shoal.control.daemons import DaemonView


def current(ctx: Context, host_arn: str):
    """The host row as it is now in this unit (a daemon task placed on it has moved its version)."""
    return ctx.conn.execute(select(cis.c.arn, cis.c.status, cis.c.version, cis.c.capacity_provider_name, cis.c.doc)
                            .where(cis.c.arn == host_arn).with_for_update()).first()


def down_reason(ctx: Context, daemon: DaemonView, host_arn: str) -> str:
    """The DAEMON check's reason for a daemon with no task on the host: its latest task, if any."""
    latest = ctx.conn.execute(select(tasks.c.id).where(tasks.c.container_instance_arn == host_arn,
                                                       tasks.c.daemon_name == daemon.name)
                              .order_by(tasks.c.created_at.desc()).limit(1)).scalar_one_or_none()
    return f"Daemon task: {latest} is unhealthy" if latest else f"Daemon {daemon.name} has no task on this host"


def settle(ctx: Context, cluster, host, problems: list[tuple[DaemonView, str]], ready: bool) -> None:
    """The host's DAEMON check from its daemons, whether it takes application tasks, and a
    REGISTERING host's activation."""
    host = current(ctx, host.arn)
    doc = jsonio.loads(host.doc)
    hs = doc.get("healthStatus") or health.initial(ctx.now)
    critical = [reason for d, reason in problems if d.critical]
    if critical:
        status, reason = "IMPAIRED", critical[0]
    elif problems:
        status, reason = "IMPAIRED", problems[0][1] + health.NON_CRITICAL_MARK
    else:
        status, reason = "OK", None
    if host.status == "REGISTERING" and status == "IMPAIRED":
        status = "INITIALIZING"  # starting up: not a fault yet
    before_health = jsonio.dumps(hs)
    changed = health.set_check(hs, "DAEMON", status, reason, ctx.now)
    blocked = bool(critical) and host.status == "ACTIVE"
    activate = (host.status == "REGISTERING" and ready and not critical and
                health.check(hs, "CONTAINER_RUNTIME")["status"] == "OK")
    if activate:  # the daemons that had to start have: the host takes application tasks now
        changed |= health.set_check(hs, "DAEMON", "IMPAIRED" if problems else "OK",
                                    reason if problems else None, ctx.now)
    before = doc.get("_blocked")
    if jsonio.dumps(hs) == before_health and blocked == bool(before) and not activate:
        return
    doc["healthStatus"] = hs
    if blocked:
        doc["_blocked"] = critical[0]
    else:
        doc.pop("_blocked", None)
    status_now = "ACTIVE" if activate else host.status
    if activate:
        doc["version"] += 1
    doc["status"] = status_now
    update_versioned(ctx.conn, cis, {"arn": host.arn}, host.version, status=status_now, doc=dumps(doc))
    if changed and host.status != "REGISTERING":
        emit_health_change(ctx, cluster, doc)
    if activate:
        emit_instance_change(ctx, cluster, doc)
        ctx.tell_agent(host.arn)
    if activate or bool(before) != blocked:
        host_changed(ctx, cluster.name, host.arn)  # placement sees it as it now is
    if activate or (before and not blocked):
        ctx.dirty_clusters.add(cluster.name)  # room for waiting tasks
