"""Daemon deployments (issue #5 point 9; ecs-semantics §1.5–1.6), advanced by the daemon
scheduler after each pass over a cluster's hosts.

- CreateDaemon's deployment starts the daemon in place: PENDING while its providers have no
  host, IN_PROGRESS while it starts, SUCCESSFUL once it runs on every ACTIVE host.
- DeleteDaemon's: IN_PROGRESS while the daemon's tasks stop, SUCCESSFUL when the last has; the
  daemon is then forgotten.
- UpdateDaemon's rolls the new revision through the hosts in batches of `drainPercent` of them:
  on managed capacity each host of a batch is drained and replaced (through the repair
  workflow, sharing its rate limit); on self-managed capacity the daemon's task is restarted in
  place with the new revision. Then `bakeTimeInMinutes`, then SUCCESSFUL. Start failures of the
  new revision count toward the circuit breaker; the breaker, or an alarm that goes into ALARM
  after the deployment started (during the rollout or the bake), stops it: STOP_REQUESTED →
  ROLLBACK_IN_PROGRESS, the previous revision rolled back the same way → ROLLBACK_SUCCESSFUL, or
  ROLLBACK_FAILED if the rollback keeps failing too.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, insert, select, update

from shoal import jsonio
from shoal.api.ecs import daemons as daemons_api
from shoal.api.ecs.container_instances import set_state
from shoal.api.operations import Context
from shoal.control import alarms
from shoal.control.repair import rate_limit
from shoal.domain import daemons as domain
from shoal.events import action_log
from shoal.store.tables import capacity_providers, daemon_deployments, daemon_revisions, daemons, host_repairs

DEPLOYMENT_REASON = "daemon deployment"


@dataclass
class OnHost:
    """A daemon on one host, as the scheduler's pass left it."""

    host: object          # the host row: arn, status, capacity_provider_name, ec2_instance_id, …
    revision: str | None  # the revision of the daemon's task there, if any
    ok: bool              # that task runs as it should, and has for START_GRACE (or is HEALTHY)
    task: object | None   # the live task row, if any


def advance(ctx: Context, cluster, daemon, on_hosts: list[OnHost], failures: int, stop) -> None:
    """Move the daemon's latest deployment as far as it can go now. `failures`: start failures of
    the daemon seen in this pass; `stop(ctx, task_row, reason)` stops a daemon task."""
    row = ctx.conn.execute(select(daemons.c.deployment_arn, daemons.c.revision_arn).where(
        daemons.c.arn == daemon.arn)).first()
    deployment = row and ctx.conn.execute(select(daemon_deployments).where(
        daemon_deployments.c.arn == row.deployment_arn)).first()
    if deployment is None or deployment.status in domain.ENDED:
        return
    doc = jsonio.loads(deployment.doc)
    arn, status = deployment.arn, deployment.status
    in_scope = [o for o in on_hosts if o.host.status in ("REGISTERING", "ACTIVE", "DRAINING")]
    active = [o for o in in_scope if o.host.status != "DRAINING"]  # (a joining host counts: it must update too)
    if daemon.status == "DELETE_IN_PROGRESS":
        if status == domain.PENDING:
            daemons_api.set_deployment_status(ctx, arn, domain.IN_PROGRESS)
        if not any(o.task is not None for o in on_hosts) and not _tasks_left(ctx, daemon):
            daemons_api.set_deployment_status(ctx, arn, domain.SUCCESSFUL, "The daemon is off every host.")
            daemons_api.remove(ctx, daemon.arn)
        return
    if status == domain.PENDING:
        if not active:
            return  # ECS: a deployment with no host to go to may stay PENDING
        daemons_api.set_deployment_status(ctx, arn, domain.IN_PROGRESS)
        status = domain.IN_PROGRESS
    sources = doc.get("sourceDaemonRevisions") or []
    if not sources:  # CreateDaemon: in place, no batches
        if active and all(o.ok for o in active):
            daemons_api.set_deployment_status(ctx, arn, domain.SUCCESSFUL, "The daemon runs on every host.")
        return
    if _stopped_by_monitors(ctx, cluster, daemon, deployment, doc, failures, status):
        return
    want = row.revision_arn  # the target, or after a rollback started, the source again
    stale = [o for o in active if o.revision != want]
    if not stale and all(o.ok for o in active):
        _finish(ctx, deployment, doc, status)
        return
    _roll(ctx, cluster, daemon, doc, in_scope, stale, want, stop)


def _tasks_left(ctx: Context, daemon) -> bool:
    from shoal.store.tables import tasks

    return ctx.conn.execute(select(func.count()).where(tasks.c.cluster_name == daemon.cluster_name,
                                                       tasks.c.daemon_name == daemon.name,
                                                       tasks.c.last_status != "STOPPED")).scalar_one() > 0


def _stopped_by_monitors(ctx: Context, cluster, daemon, deployment, doc: dict, failures: int, status: str) -> bool:
    """The circuit breaker and the alarms. True if the deployment stopped (or its rollback failed)."""
    breaker = dict(doc["circuitBreaker"])
    if status == domain.ROLLBACK_IN_PROGRESS:
        # The breaker keeps what tripped it; the rollback's own failures are counted apart.
        count = deployment.rollback_failures + failures
        if failures:
            ctx.conn.execute(update(daemon_deployments).where(daemon_deployments.c.arn == deployment.arn)
                             .values(rollback_failures=count))
        if count >= breaker["threshold"]:
            daemons_api.set_deployment_status(ctx, deployment.arn, domain.ROLLBACK_FAILED,
                                              "The rollback failed: the previous revision does not start either.")
            _log(ctx, cluster, daemon, "ERROR", "DAEMON_DEPLOYMENT_ROLLBACK_FAILED", {"daemonDeploymentArn": deployment.arn})
            return True
        return False
    if failures and status == domain.IN_PROGRESS:
        breaker["failureCount"] = breaker.get("failureCount", 0) + failures
        daemons_api.update_deployment(ctx, deployment.arn, circuitBreaker=breaker)
    tripped = breaker.get("failureCount", 0) >= breaker["threshold"]
    config = doc["alarms"]
    triggered = alarms.tripped(ctx.conn, config["alarmNames"], doc.get("startedAt") or deployment.created_at) \
        if config.get("status") != "DISABLED" else []
    if not tripped and not triggered:
        return False
    reason = (f"The deployment circuit breaker tripped: {breaker['failureCount']} daemon start failures "
              f"(threshold {breaker['threshold']})." if tripped else f"Alarm(s) in ALARM: {', '.join(triggered)}.")
    fields = {"alarms": {**config, "status": "TRIGGERED", "triggeredAlarmNames": triggered}} if triggered else \
        {"circuitBreaker": {**breaker, "status": "TRIGGERED"}}
    daemons_api.set_deployment_status(ctx, deployment.arn, domain.STOP_REQUESTED, reason, **fields)
    source = doc["sourceDaemonRevisions"][0]
    daemons_api.set_deployment_status(
        ctx, deployment.arn, domain.ROLLBACK_IN_PROGRESS, "Rolling back to the previous revision.",
        rollback={"reason": reason, "startedAt": ctx.now, "rollbackTargetDaemonRevisionArn": source["arn"],
                  "rollbackCapacityProviders": [cp["arn"] for cp in source.get("capacityProviders", [])]})
    _rollback_to_source(ctx, daemon, doc)
    _log(ctx, cluster, daemon, "WARN", "DAEMON_DEPLOYMENT_ROLLBACK_STARTED",
         {"daemonDeploymentArn": deployment.arn, "statusReason": reason})
    return True


def _rollback_to_source(ctx: Context, daemon, doc: dict) -> None:
    """The daemon runs its previous revision again (new tasks get it; hosts roll back in batches)."""
    source = doc["sourceDaemonRevisions"][0]["arn"]
    revision = jsonio.loads(ctx.conn.execute(select(daemon_revisions.c.doc).where(
        daemon_revisions.c.arn == source)).scalar_one())
    ctx.conn.execute(update(daemons).where(daemons.c.arn == daemon.arn).values(
        revision_arn=source, task_definition_arn=revision["daemonTaskDefinitionArn"]))


def _finish(ctx: Context, deployment, doc: dict, status: str) -> None:
    """Every host runs the wanted revision: bake, then done."""
    bake = doc["deploymentConfiguration"].get("bakeTimeInMinutes", 0) * 60
    if status == domain.IN_PROGRESS and bake:
        if deployment.bake_started_at is None:
            ctx.conn.execute(update(daemon_deployments).where(daemon_deployments.c.arn == deployment.arn)
                             .values(bake_started_at=ctx.now))
            return
        if ctx.now - deployment.bake_started_at < bake:
            return
    if status == domain.ROLLBACK_IN_PROGRESS:
        daemons_api.set_deployment_status(ctx, deployment.arn, domain.ROLLBACK_SUCCESSFUL,
                                          "Every host runs the previous revision again.")
    else:
        daemons_api.set_deployment_status(ctx, deployment.arn, domain.SUCCESSFUL, "Every host runs the new revision.")


def _roll(ctx: Context, cluster, daemon, doc: dict, in_scope: list[OnHost], stale: list[OnHost], want: str,
          stop) -> None:
    """Start the next hosts, up to a batch of drainPercent of the hosts in flight at once."""
    batch = domain.batch_size(doc["deploymentConfiguration"]["drainPercent"], len(in_scope))
    managed = _managed(ctx, {o.host.capacity_provider_name for o in in_scope})
    draining = {r.host_arn: r for r in ctx.conn.execute(select(host_repairs).where(
        host_repairs.c.cluster_name == cluster.name, host_repairs.c.state == "DRAINING"))}
    # In flight: hosts of this rollout draining, or restarting the daemon in place.
    in_flight = sum(o.host.status == "DRAINING" and o.host.arn in draining for o in in_scope)
    in_flight += sum(o.host.status != "DRAINING" and not o.ok and (o.revision == want or o.task is None)
                     for o in in_scope if o.host.capacity_provider_name not in managed)
    in_flight += sum(o.task is not None and jsonio.loads(o.task.doc)["desiredStatus"] == "STOPPED" for o in stale)
    for o in stale:
        if in_flight >= batch:
            return
        if o.task is not None and jsonio.loads(o.task.doc)["desiredStatus"] == "STOPPED":
            continue  # already on its way
        provider = o.host.capacity_provider_name
        if provider in managed:
            busy = sum(r is None or r.provider == provider for r in draining.values())
            if busy >= rate_limit(_provider_hosts(ctx, provider)):
                return  # repairs and deployments together never exceed the rate limit
            _drain_for_deployment(ctx, cluster, daemon, o.host, provider)
            draining[o.host.arn] = None
        elif o.task is not None:
            stop(ctx, o.task, f"Daemon deployment: restarting with revision {want.rsplit('/', 1)[-1]}")
        in_flight += 1


def _managed(ctx: Context, providers: set[str]) -> set[str]:
    return set(ctx.conn.execute(select(capacity_providers.c.name).where(
        capacity_providers.c.name.in_(providers), capacity_providers.c.kind == "MANAGED_INSTANCES")).scalars())


def _provider_hosts(ctx: Context, provider: str) -> int:
    from shoal.store.tables import container_instances as cis

    return ctx.conn.execute(select(func.count()).where(cis.c.capacity_provider_name == provider,
                                                       cis.c.status != "INACTIVE")).scalar_one()


def _drain_for_deployment(ctx: Context, cluster, daemon, host, provider: str) -> None:
    """Hand the host to the repair workflow: drained, replaced start-before-stop, terminated."""
    from shoal.store.tables import container_instances as cis

    row = ctx.conn.execute(select(cis).where(cis.c.arn == host.arn).with_for_update()).first()
    set_state(ctx, cluster, row, "DRAINING")
    values = dict(cluster_name=cluster.name, provider=provider, host_id=row.ec2_instance_id,
                  reason=f"{DEPLOYMENT_REASON} of daemon {daemon.name}", state="DRAINING", started_at=ctx.now,
                  replacement_host_id=None, reruns="{}")
    if ctx.conn.execute(update(host_repairs).where(host_repairs.c.host_arn == host.arn).values(**values)).rowcount == 0:
        ctx.conn.execute(insert(host_repairs).values(host_arn=host.arn, **values))
    _log(ctx, cluster, daemon, "INFO", "DAEMON_DEPLOYMENT_HOST_DRAINING", {"containerInstanceArn": host.arn})


def _log(ctx: Context, cluster, daemon, level: str, event_name: str, detail: dict) -> None:
    action_log.record(ctx, cluster=cluster.name, level=level, resource_arn=cluster.arn, source_id=daemon.arn,
                      event_name=event_name, detail=detail, daemon=daemon.name)
