"""Managed daemons on their hosts (issue #5; ecs-semantics §1): the daemon scheduler.

For every daemon of a cluster and every host of the daemon's capacity providers, exactly one task
of the daemon runs on the host. The scheduler follows the controller pattern: it observes the
daemons, their hosts, their tasks and what it recorded per (daemon, host) in `daemon_hosts`,
diffs, acts, and every step is idempotent, so a second run, or a run on another server, changes
nothing. Per (daemon, host):

- no live task: start one, placed on that host (resources reserved like any task's). A task that
  cannot be created there (not enough CPU or memory) is a TASK_CREATION_FAILED start failure;
- the task stopped on its own: a failure; TASK_FAILED_TO_RUN if it never reached RUNNING. The
  next start waits an exponential backoff (1 s, 2 s, … 30 s): this is the "agent keeps restarting
  the daemon" of the issue, done by the scheduler so that real and simulated agents behave alike;
- RUNNING (and HEALTHY, when it has a health check): the failure episode is over;
- RUNNING but UNHEALTHY: the task is stopped, and a new one started as above.

Each failure episode of a (daemon, host) emits one "ECS Daemon Service Action"
DAEMON_TASK_START_IMPAIRED (when the failure is a start failure) and writes action-log entries.

Hosts. A REGISTERING host of a provider with daemons becomes ACTIVE only once its agent reports
the container runtime OK, every critical daemon is RUNNING (and HEALTHY if checked), and every
non-critical daemon is RUNNING or has failed a start. A critical daemon that is not running
after `start_timeout` keeps the host out for good: REGISTRATION_FAILED with a statusReason that
names the daemon. On an ACTIVE host, the DAEMON health check shows any daemon that is not
running; a critical one makes it IMPAIRED and the host stops taking new application tasks
(`_blocked`, read by placement) until the daemon runs again; a non-critical one is shown but does
not count toward the overall status, and the host stays in service. A DRAINING host keeps its
daemons until its last application task has stopped; then they are stopped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy import delete, func, insert, select, update

from shoal import jsonio
from shoal.api.ecs.common import cluster_row
from shoal.api.ecs.container_instances import emit_instance_change
from shoal.api.operations import Context, dumps
from shoal.control import daemon_deployments, daemon_health
from shoal.control.daemon_deployments import OnHost
from shoal.domain import arns
from shoal.domain import daemons as domain
from shoal.domain import tasks as task_domain
from shoal.events import action_log
from shoal.events.changes import emit_task_change
from shoal.events.daemons import DAEMON_SERVICE_ACTION
from shoal.events.envelope import iso
from shoal.scheduler.placement import Placer, task_definition
from shoal.store.db import update_versioned
from shoal.store.tables import (container_instances as cis, daemon_capacity_providers as daemon_cps, daemon_hosts,
                                daemon_revisions, daemons, tasks)

log = logging.getLogger(__name__)
START_TIMEOUT = 300.0  # daemonStartTimeout: see docs/decisions.md
BACKOFF_BASE, BACKOFF_MAX = 1.0, 30.0
# A daemon task that stops within START_GRACE seconds of starting failed to start (an essential
# container that exits at once); one without a health check lets a new host in once it has been
# RUNNING for SETTLE seconds. See docs/decisions.md.
START_GRACE, SETTLE = 10.0, 1.0
RESYNC = 5.0  # every cluster with daemons is looked at this often even if nothing announced a change
STOP_CODE = "ServiceSchedulerInitiated"  # the stop code ECS's schedulers use
LIVE_HOST_STATUSES = ("REGISTERING", "ACTIVE", "DRAINING")


def backoff(failures: int) -> float:
    return min(BACKOFF_BASE * 2 ** max(failures - 1, 0), BACKOFF_MAX)


@dataclass
class DaemonView:
    arn: str
    name: str
    cluster_name: str
    status: str
    critical: bool
    task_definition: dict  # the daemon task definition of the current revision
    revision_arn: str
    providers: set[str]


class DaemonScheduler:
    """Runs `reconcile` for clusters with daemons: those marked dirty by a commit, and all of them
    every RESYNC seconds (changes made by another server, backoffs that have run out)."""

    def __init__(self, start_timeout: float = START_TIMEOUT):
        self.start_timeout = start_timeout
        self._dirty: set[str] = set()
        self._due: dict[str, float] = {}  # cluster -> when it must be looked at again
        self._listed = float("-inf")
        self._known: set[str] = set()  # clusters that have daemons, as last listed

    def mark(self, clusters) -> None:
        self._dirty |= set(clusters)

    def next_due(self) -> float | None:
        return min(self._due.values(), default=None)

    async def run_once(self, hub) -> None:
        now = time.monotonic()
        # Clusters with daemons, listed again every RESYNC seconds, or sooner when a cluster
        # without any known daemon is marked (a CreateDaemon): most commits concern others.
        if now - self._listed >= RESYNC or (self._dirty - self._known and now - self._listed >= 1.0):
            resync = now - self._listed >= RESYNC
            self._listed = now
            self._known = await hub.store.read(_clusters_with_daemons)
            if resync:
                self._dirty |= self._known
            self._dirty &= self._known  # checked: clusters without daemons have nothing to do
        self._dirty |= {c for c, at in self._due.items() if at <= now}
        work, self._dirty = self._dirty & self._known, self._dirty - self._known
        for cluster in work:
            self._due.pop(cluster, None)
            wait = await hub.write(lambda ctx, c=cluster: reconcile(ctx, c, self.start_timeout))
            if wait is not None:
                self._due[cluster] = time.monotonic() + wait


def _clusters_with_daemons(conn) -> set[str]:
    return set(conn.execute(select(daemons.c.cluster_name).distinct()).scalars())


# --- observe ---------------------------------------------------------------------------------------

def _daemons(ctx: Context, cluster: str) -> list[DaemonView]:
    rows = ctx.conn.execute(select(daemons).where(daemons.c.cluster_name == cluster)).all()
    if not rows:
        return []
    revisions = {r.arn: jsonio.loads(r.doc) for r in ctx.conn.execute(
        select(daemon_revisions.c.arn, daemon_revisions.c.doc).where(daemon_revisions.c.arn.in_([r.revision_arn for r in rows])))}
    providers: dict[str, set[str]] = {}
    for arn, provider in ctx.conn.execute(select(daemon_cps.c.daemon_arn, daemon_cps.c.capacity_provider_name)
                                          .where(daemon_cps.c.daemon_arn.in_([r.arn for r in rows]))):
        providers.setdefault(arn, set()).add(provider)
    out = []
    for row in rows:
        revision = revisions[row.revision_arn]
        td = task_definition(ctx, row.task_definition_arn)
        out.append(DaemonView(row.arn, row.name, row.cluster_name, row.status, revision.get("critical", True), td,
                              row.revision_arn, providers.get(row.arn, set())))
    return out


def _start_task(ctx: Context, cluster, daemon: DaemonView, host_arn: str) -> tuple[dict | None, str | None]:
    """Create the daemon's task on the host; (its document, None), or (None, why it does not fit)."""
    td = daemon.task_definition
    task_id = arns.new_id()
    task_arn = ctx.arns.task(cluster.name, task_id)
    doc = task_domain.new_task(
        task_arn=task_arn, cluster_arn=cluster.arn, task_definition={**td, "taskDefinitionArn": td["daemonTaskDefinitionArn"]},
        container_arns=[ctx.arns.container(cluster.name, task_id, arns.new_id()) for _ in td["containerDefinitions"]],
        overrides={}, last_status="PENDING", launch_type=None, group=domain.group(daemon.name),
        started_by=daemon.arn[-128:], tags=[], now=ctx.now, container_instance_arn=host_arn)
    placer = Placer(ctx, cluster.name)
    reason = placer.place(doc, "{}", only=host_arn, any_status=True)
    if reason is not None:
        return None, reason
    ctx.conn.execute(insert(tasks).values(
        arn=task_arn, id=task_id, cluster_name=cluster.name, last_status=doc["lastStatus"], desired_status="RUNNING",
        family=td["family"], started_by=doc.get("startedBy"), service_name=None, launch_type=None,
        container_instance_arn=host_arn, created_at=ctx.now, version=1, doc=dumps(doc), placement="{}",
        daemon_name=daemon.name))
    placer.flush()
    emit_task_change(ctx, doc)
    return doc, None


def _stop_task(ctx: Context, row, reason: str) -> None:
    doc = jsonio.loads(row.doc)
    if doc["desiredStatus"] == "STOPPED":
        return
    doc.update(desiredStatus="STOPPED", stopCode=STOP_CODE, stoppedReason=reason, stoppingAt=ctx.now,
               version=doc["version"] + 1)
    update_versioned(ctx.conn, tasks, {"arn": row.arn}, row.version, desired_status="STOPPED", doc=dumps(doc))
    ctx.tell_agent(row.container_instance_arn, row.arn)
    emit_task_change(ctx, doc)


def _start_impaired(ctx: Context, cluster, daemon: DaemonView, host, *, task: dict | None, reason: str) -> None:
    """One "ECS Daemon Service Action" DAEMON_TASK_START_IMPAIRED (and its action-log entry)."""
    detail = {"eventType": "WARNING", "eventName": "DAEMON_TASK_START_IMPAIRED", "clusterArn": cluster.arn,
              "containerInstanceArn": host.arn}
    if task is not None:
        detail["taskArn"] = task["taskArn"]
    detail.update(daemonArn=daemon.arn, daemonRevisionArn=daemon.revision_arn,
                  daemonTaskDefinitionArn=daemon.task_definition["daemonTaskDefinitionArn"],
                  capacityProviderName=host.capacity_provider_name,
                  failureType="TASK_FAILED_TO_RUN" if task is not None else "TASK_CREATION_FAILED",
                  createdAt=iso(ctx.now), reason=reason)
    ctx.emit(DAEMON_SERVICE_ACTION, [task["taskArn"]] if task is not None else [], detail)
    _log(ctx, cluster, daemon, "WARN", "DAEMON_TASK_START_IMPAIRED",
         {"statusReason": reason, "containerInstanceArn": host.arn, "failureType": detail["failureType"],
          **({"taskArn": task["taskArn"]} if task is not None else {})})


def _log(ctx: Context, cluster, daemon: DaemonView, level: str, event_name: str, detail: dict) -> None:
    action_log.record(ctx, cluster=cluster.name, level=level, resource_arn=cluster.arn, source_id=daemon.arn,
                      event_name=event_name, detail=detail, daemon=daemon.name)


# --- reconcile -------------------------------------------------------------------------------------

def reconcile(ctx: Context, cluster_name: str, start_timeout: float = START_TIMEOUT) -> float | None:
    """One pass over a cluster's daemons and their hosts. Returns in how many seconds it wants to
    run again (a backoff or a start deadline), or None."""
    views = _daemons(ctx, cluster_name)
    tracked = {(r.daemon_arn, r.host_arn): r for r in ctx.conn.execute(
        select(daemon_hosts).where(daemon_hosts.c.cluster_name == cluster_name))}
    if not views:
        if tracked:
            ctx.conn.execute(delete(daemon_hosts).where(daemon_hosts.c.cluster_name == cluster_name))
        return None
    cluster = cluster_row(ctx, cluster_name)
    providers = set().union(*(d.providers for d in views))
    hosts = ctx.conn.execute(select(cis.c.arn, cis.c.status, cis.c.version, cis.c.capacity_provider_name, cis.c.doc)
                             .where(cis.c.cluster_name == cluster_name, cis.c.status.in_(LIVE_HOST_STATUSES),
                                    cis.c.capacity_provider_name.in_(providers))).all()
    live = {}  # (daemon name, host) -> task row, not STOPPED
    for row in ctx.conn.execute(select(tasks.c.arn, tasks.c.version, tasks.c.daemon_name, tasks.c.container_instance_arn,
                                       tasks.c.doc).where(tasks.c.cluster_name == cluster_name,
                                                          tasks.c.daemon_name.is_not(None),
                                                          tasks.c.last_status != "STOPPED")):
        live[(row.daemon_name, row.container_instance_arn)] = row
    waits: list[float] = []
    observed: dict[str, list[OnHost]] = {d.arn: [] for d in views}  # daemon ARN -> where it is
    fails: dict[str, int] = {}  # daemon ARN -> start failures seen in this pass (the breaker)
    for host in hosts:
        if not jsonio.loads(host.doc).get("agentConnected"):
            continue  # nothing would run a task there (an agent lost, or a host without a shoal agent)
        wait = _reconcile_host(ctx, cluster, host, [d for d in views if host.capacity_provider_name in d.providers],
                               tracked, live, start_timeout, observed, fails)
        if wait is not None:
            waits.append(wait)
    # Forget what is recorded for hosts that left, and remove daemons that are off every host.
    host_arns, daemon_arns = {h.arn for h in hosts}, {d.arn for d in views}
    gone = [key for key in tracked if key[1] not in host_arns or key[0] not in daemon_arns]
    for daemon_arn, host_arn in gone:
        ctx.conn.execute(delete(daemon_hosts).where(daemon_hosts.c.daemon_arn == daemon_arn,
                                                    daemon_hosts.c.host_arn == host_arn))
    for d in views:
        daemon_deployments.advance(ctx, cluster, d, observed[d.arn], fails.get(d.arn, 0), _stop_task)
    return min(waits, default=None)


def _app_tasks(ctx: Context, host_arn: str) -> int:
    return ctx.conn.execute(select(func.count()).where(tasks.c.container_instance_arn == host_arn,
                                                       tasks.c.daemon_name.is_(None),
                                                       tasks.c.last_status != "STOPPED")).scalar_one()


def _reconcile_host(ctx: Context, cluster, host, views: list[DaemonView], tracked: dict, live: dict,
                    start_timeout: float, observed: dict[str, list[OnHost]], fails: dict[str, int]) -> float | None:
    waits: list[float] = []
    draining_done = host.status == "DRAINING" and _app_tasks(ctx, host.arn) == 0
    problems: list[tuple[DaemonView, str]] = []  # daemons not running here, with why
    ready = True  # for a REGISTERING host: every daemon is where activation needs it
    for daemon in views:
        key = (daemon.arn, host.arn)
        record = tracked.get(key)
        if record is None:
            ctx.conn.execute(insert(daemon_hosts).values(daemon_arn=daemon.arn, host_arn=host.arn,
                                                         cluster_name=cluster.name, task_arn=None, failures=0,
                                                         retry_at=0.0, impaired=False, first_start_at=ctx.now,
                                                         revision_arn=None))
            record = ctx.conn.execute(select(daemon_hosts).where(daemon_hosts.c.daemon_arn == daemon.arn,
                                                                 daemon_hosts.c.host_arn == host.arn)).first()
        state = dict(task_arn=record.task_arn, failures=record.failures, retry_at=record.retry_at,
                     impaired=record.impaired, revision_arn=record.revision_arn)
        task = live.get((daemon.name, host.arn))
        ok = False
        if daemon.status != "ACTIVE" or draining_done:
            if task is not None:
                _stop_task(ctx, task, "Daemon deleted" if daemon.status != "ACTIVE" else "Host drained")
            continue
        # A task we started that has stopped since we last looked: a failure (unless someone stopped it).
        if state["task_arn"] and (task is None or task.arn != state["task_arn"]):
            stopped = ctx.conn.execute(select(tasks.c.doc).where(tasks.c.arn == state["task_arn"])).scalar_one_or_none()
            state["task_arn"] = None
            if stopped is not None:
                _stopped(ctx, cluster, daemon, host, jsonio.loads(stopped), state)
        if task is not None:
            doc = jsonio.loads(task.doc)
            state["task_arn"] = task.arn
            checked = any(c.get("healthCheck") for c in daemon.task_definition["containerDefinitions"])
            if doc["lastStatus"] == "RUNNING" and doc.get("healthStatus") == "UNHEALTHY":
                _stop_task(ctx, task, "Task failed container health checks")
                problems.append((daemon, f"Daemon task: {task.arn.rsplit('/', 1)[-1]} is unhealthy"))
                ready = ready and not daemon.critical and state["failures"] > 0
            elif (doc["lastStatus"] == "RUNNING" and host.status == "REGISTERING" and not checked
                  and ctx.now - (doc.get("startedAt") or ctx.now) < SETTLE):
                # Without a health check, RUNNING for a moment is not yet running: a daemon that
                # exits at once must not let its host in.
                problems.append((daemon, f"Daemon task: {task.arn.rsplit('/', 1)[-1]} is starting"))
                ready = False
                waits.append(SETTLE - (ctx.now - (doc.get("startedAt") or ctx.now)) + 0.05)
            elif (doc["lastStatus"] == "RUNNING" and not checked and (state["impaired"] or state["failures"])
                  and ctx.now - (doc.get("startedAt") or ctx.now) < START_GRACE):
                # Restarted after failures: it has to stay up a while before the episode is over.
                problems.append((daemon, f"Daemon task: {task.arn.rsplit('/', 1)[-1]} is restarting"))
                ready = ready and not daemon.critical
                waits.append(START_GRACE - (ctx.now - (doc.get("startedAt") or ctx.now)) + 0.05)
            elif doc["lastStatus"] == "RUNNING" and (not checked or doc.get("healthStatus") == "HEALTHY"):
                if state["impaired"] or state["failures"]:
                    _log(ctx, cluster, daemon, "INFO", "DAEMON_TASK_RUNNING",
                         {"containerInstanceArn": host.arn, "taskArn": task.arn, "afterFailures": state["failures"]})
                state.update(failures=0, impaired=False)
                # A deployment counts it once it has stayed up (a revision that exits at once
                # must reach the circuit breaker, not pass).
                ran = ctx.now - (doc.get("startedAt") or ctx.now)
                ok = checked or ran >= START_GRACE
                if not ok:
                    waits.append(START_GRACE - ran + 0.05)
            else:  # on its way
                problems.append((daemon, f"Daemon task: {task.arn.rsplit('/', 1)[-1]} is not running yet"))
                ready = ready and not daemon.critical and state["failures"] > 0
        elif host.status != "DRAINING":
            if ctx.now >= state["retry_at"]:
                started, why = _start_task(ctx, cluster, daemon, host.arn)
                if started is not None:
                    state.update(task_arn=started["taskArn"], revision_arn=daemon.revision_arn)
                    task = live[(daemon.name, host.arn)] = _task_row(ctx, started["taskArn"])
                    _log(ctx, cluster, daemon, "INFO", "DAEMON_TASK_STARTED" if not state["failures"] else
                         "DAEMON_TASK_RESTARTED", {"containerInstanceArn": host.arn, "taskArn": started["taskArn"],
                                                   "failures": state["failures"]})
                else:
                    reason = f"{why} - Unable to place daemon task on container instance: insufficient " \
                             f"{'memory' if 'MEMORY' in why else 'CPU' if 'CPU' in why else 'resources'}"
                    _failed(ctx, cluster, daemon, host, state, task=None, reason=reason)
            problems.append((daemon, daemon_health.down_reason(ctx, daemon, host.arn)))
            ready = ready and not daemon.critical and state["failures"] > 0
        if state["retry_at"] > ctx.now:
            waits.append(state["retry_at"] - ctx.now)
        if (host.status == "REGISTERING" and daemon.critical and
                ctx.now - record.first_start_at > start_timeout and host_not_running(problems, daemon)):
            _registration_failed(ctx, cluster, host, daemon)
            return None
        if host.status == "REGISTERING" and daemon.critical:
            waits.append(max(record.first_start_at + start_timeout - ctx.now, 0.0) + 0.1)
        if state["failures"] > record.failures:
            fails[daemon.arn] = fails.get(daemon.arn, 0) + state["failures"] - record.failures
        observed[daemon.arn].append(OnHost(host, state["revision_arn"] if task is not None else None, ok, task))
        if state != dict(task_arn=record.task_arn, failures=record.failures, retry_at=record.retry_at,
                         impaired=record.impaired, revision_arn=record.revision_arn):
            ctx.conn.execute(update(daemon_hosts).where(daemon_hosts.c.daemon_arn == daemon.arn,
                                                        daemon_hosts.c.host_arn == host.arn).values(**state))
    daemon_health.settle(ctx, cluster, host, problems, ready)
    return min(waits, default=None)


def _task_row(ctx: Context, arn: str):
    return ctx.conn.execute(select(tasks.c.arn, tasks.c.version, tasks.c.daemon_name, tasks.c.container_instance_arn,
                                   tasks.c.doc).where(tasks.c.arn == arn)).first()


def host_not_running(problems: list, daemon: DaemonView) -> bool:
    return any(d.arn == daemon.arn for d, _ in problems)


def _stopped(ctx: Context, cluster, daemon: DaemonView, host, doc: dict, state: dict) -> None:
    """The daemon's task on the host has stopped. Ours to stop (drain, delete) or the user's: not
    a failure. Otherwise it failed: to start if it never ran, else while running."""
    if doc.get("stopCode") in (STOP_CODE, "UserInitiated") and not doc.get("stoppedReason", "").startswith(
            "Task failed container health checks"):
        return
    reason = doc.get("stoppedReason") or "stopped"
    containers = "; ".join(f"{c['name']}: {c.get('reason') or ('exit code ' + str(c['exitCode']) if c.get('exitCode') is not None else '')}"
                           for c in doc.get("containers", []) if c.get("reason") or c.get("exitCode") is not None)
    ran = (doc.get("stoppedAt") or ctx.now) - doc["startedAt"] if doc.get("startedAt") else 0.0
    if ran < START_GRACE or state["failures"]:
        why = f"Task failed to reach RUNNING status: {reason}" + (f" ({containers})" if containers else "")
        _failed(ctx, cluster, daemon, host, state, task=doc, reason=why)
    else:
        state["failures"] += 1
        state["retry_at"] = ctx.now + backoff(state["failures"])
        _log(ctx, cluster, daemon, "WARN" if daemon.critical else "INFO", "DAEMON_TASK_STOPPED",
             {"containerInstanceArn": host.arn, "taskArn": doc["taskArn"], "stopCode": doc.get("stopCode"),
              "statusReason": reason, "containerStoppedReason": containers, "critical": daemon.critical})


def _failed(ctx: Context, cluster, daemon: DaemonView, host, state: dict, *, task: dict | None, reason: str) -> None:
    """A start failure: once per episode the START_IMPAIRED event; always a backoff."""
    state["failures"] += 1
    state["retry_at"] = ctx.now + backoff(state["failures"])
    if not state["impaired"]:
        state["impaired"] = True
        _start_impaired(ctx, cluster, daemon, host, task=task, reason=reason)
    else:
        _log(ctx, cluster, daemon, "INFO", "DAEMON_TASK_START_RETRY",
             {"containerInstanceArn": host.arn, "statusReason": reason, "failures": state["failures"],
              "nextAttemptInSeconds": round(backoff(state["failures"]), 1)})


def _registration_failed(ctx: Context, cluster, host, daemon: DaemonView) -> None:
    host = daemon_health.current(ctx, host.arn)
    doc = jsonio.loads(host.doc)
    reason = (f"Critical daemon {daemon.name} did not start within the daemon start timeout "
              f"({daemon.task_definition['daemonTaskDefinitionArn']})")
    doc.update(status="REGISTRATION_FAILED", statusReason=reason, version=doc["version"] + 1)
    doc.pop("_blocked", None)
    update_versioned(ctx.conn, cis, {"arn": host.arn}, host.version, status="REGISTRATION_FAILED", doc=dumps(doc))
    emit_instance_change(ctx, cluster, doc)
    _log(ctx, cluster, daemon, "ERROR", "CONTAINER_INSTANCE_REGISTRATION_FAILED",
         {"containerInstanceArn": host.arn, "statusReason": reason})
    for row in ctx.conn.execute(select(tasks.c.arn, tasks.c.version, tasks.c.container_instance_arn, tasks.c.doc)
                                .where(tasks.c.container_instance_arn == host.arn, tasks.c.last_status != "STOPPED")):
        _stop_task(ctx, row, "Container instance registration failed")
    ctx.tell_agent(host.arn)
