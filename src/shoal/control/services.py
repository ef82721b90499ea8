"""The service scheduler: one reconciler for REPLICA services, in the controller style.

For one service, in one unit of work: observe (the service, its tasks that have not stopped, the
hosts they are on), diff (shoal.domain.services.plan: what the primary deployment lacks, what
must go, within minimumHealthyPercent and maximumPercent), act (start tasks through
`create_tasks`, stop tasks), then move the deployments along (circuit breaker, rollback,
COMPLETED, steady state) and write the events. Everything is recomputed from the store on each
pass, so a pass is idempotent: running it twice, or on two servers at once (the service row is
locked, task rows are versioned), changes nothing more.

It runs right after any commit that changed one of the service's tasks (`Context.dirty_services`,
set by every "ECS Task State Change" of a `service:` group and by health changes), after the
service API calls, when a timer it asked for is due (a task becoming steady, a launch backoff),
and on a slow resync of every live service.

Two things are this server's memory rather than the store's, both on the monotonic clock: when
it first saw each task RUNNING (a task without health checks counts as healthy once it has run
`healthy_after` seconds, as ECS waits 40 s), and launch backoffs. Another server, or a restart,
simply starts counting again: that only delays, never breaks, a decision.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from sqlalchemy import bindparam, select

from shoal import jsonio
from shoal.api.ecs import service_deployments as deployments
from shoal.api.ecs.common import cluster_row
from shoal.api.ecs.tasks import check_placement, create_tasks
from shoal.api.operations import Context, dumps
from shoal.domain import services as domain
from shoal.domain.tasks import PENDING_STATES, stop_unstarted
from shoal.events import services as events
from shoal.events.changes import emit_task_change
from shoal.scheduler.placement import PENDING_REASON, release, task_definition
from shoal.store.db import update_versioned
from shoal.store.prepared import Prepared
from shoal.store.tables import container_instances as cis, services, tasks

log = logging.getLogger(__name__)
HEALTHY_AFTER = 40.0  # ECS: a task without health checks counts as healthy 40 s after RUNNING
RESYNC = 10.0  # every live service is looked at this often even if nothing announced a change
MAX_STARTS = 1000  # tasks started per pass (one unit of work, ~0.3 s); the next pass starts more
RUNS = (*PENDING_STATES, "RUNNING")


@dataclass
class Memory:
    """What this server remembers for one pass (monotonic times; read-only inside the pass, so a
    unit of work that is run again sees the same)."""

    now: float
    running_since: dict[str, float]
    launch_after: dict[str, float]  # deployment id -> no launch before
    healthy_after: float


@dataclass
class Outcome:
    running: set[str] = field(default_factory=set)  # tasks seen RUNNING
    wake_in: float | None = None  # look again after this long (a task becomes steady, a backoff ends)
    failures: tuple[str, int, int] | None = None  # (primary deployment, failures, threshold)
    gone: bool = False  # INACTIVE or deleted: forget it

    def wake(self, seconds: float) -> None:
        self.wake_in = seconds if self.wake_in is None else min(self.wake_in, seconds)


def _has_health_check(td: dict) -> bool:
    return any(c.get("healthCheck") and c.get("essential", True) for c in td["containerDefinitions"])


class Observed:
    """One task of the service that has not stopped: its row's columns, its host's status, and
    its document, read and parsed only when a step needs it (a service may have thousands)."""

    __slots__ = ("ctx", "row", "host_status", "_doc")

    def __init__(self, ctx: Context, row, host_status: str | None):
        self.ctx, self.row, self.host_status, self._doc = ctx, row, host_status, None

    @property
    def doc(self) -> dict:
        if self._doc is None:
            text = self.ctx.conn.execute(select(tasks.c.doc).where(tasks.c.arn == self.row.arn)).scalar_one()
            self._doc = jsonio.loads(text)
        return self._doc


# Each pass reads every task of the service (thousands): see shoal.store.prepared.
_SERVICE_TASKS = Prepared(select(tasks.c.arn, tasks.c.version, tasks.c.last_status, tasks.c.desired_status,
                                 tasks.c.started_by, tasks.c.created_at, tasks.c.container_instance_arn,
                                 tasks.c.placement)
                          .where(tasks.c.cluster_name == bindparam("cluster"), tasks.c.service_name == bindparam("name"),
                                 tasks.c.last_status != "STOPPED"))
# The cluster's hosts that are not ACTIVE: few, so one small read instead of one per task's host.
_HOSTS_NOT_ACTIVE = Prepared(select(cis.c.arn, cis.c.status).where(cis.c.cluster_name == bindparam("cluster"),
                                                                   cis.c.status != "ACTIVE"))


def _observe(ctx: Context, cluster: str, name: str) -> list[Observed]:
    """The service's tasks that have not stopped, each with its host's status; tasks on
    deregistered hosts are left out: nothing manages them any more (ECS orphans them)."""
    rows = _SERVICE_TASKS.all(ctx.conn, {"cluster": cluster, "name": name})
    not_active = {r.arn: r.status for r in _HOSTS_NOT_ACTIVE.all(ctx.conn, {"cluster": cluster})}
    out = []
    for row in rows:
        host = row.container_instance_arn
        host_status = not_active.get(host, "ACTIVE") if host else None
        if host_status != "INACTIVE":
            out.append(Observed(ctx, row, host_status))
    return out


def _agent_connected(ctx: Context, host_arn: str | None) -> bool:
    row = ctx.conn.execute(select(cis.c.doc).where(cis.c.arn == host_arn)).first() if host_arn else None
    return bool(row and jsonio.loads(row.doc).get("agentConnected"))


def _view(ctx: Context, task: Observed, svc: dict, health_checked: dict[str, bool], memory: Memory,
          outcome: Outcome) -> domain.TaskView:
    row = task.row
    wanted = row.desired_status == "RUNNING"
    healthy = unhealthy = False
    if row.last_status == "RUNNING":
        outcome.running.add(row.arn)
        ran = memory.now - memory.running_since.get(row.arn, memory.now)
        checked = health_checked.get(row.started_by)
        if checked is None:  # a deployment no longer listed: ask its task definition
            checked = _has_health_check(task_definition(ctx, task.doc["taskDefinitionArn"]))
        if checked:
            health = task.doc.get("healthStatus")
            healthy = health == "HEALTHY"
            grace = svc.get("healthCheckGracePeriodSeconds") or 0
            if health == "UNHEALTHY":
                unhealthy = ran >= grace
                if not unhealthy:
                    outcome.wake(grace - ran)
        else:
            healthy = ran >= memory.healthy_after
            if wanted and not healthy:
                outcome.wake(memory.healthy_after - ran)
    return domain.TaskView(arn=row.arn, deployment=row.started_by or "", wanted=wanted,
                           healthy=wanted and healthy, unhealthy=wanted and unhealthy,
                           draining=task.host_status == "DRAINING", created_at=row.created_at or 0.0)


def _failures(ctx: Context, cluster: str, name: str, deployment_id: str, healthy_after: float) -> int:
    rows = ctx.conn.execute(select(tasks.c.doc).where(
        tasks.c.cluster_name == cluster, tasks.c.service_name == name, tasks.c.started_by == deployment_id,
        tasks.c.last_status == "STOPPED")).scalars()
    count = 0
    for text in rows:
        doc = jsonio.loads(text)
        td = task_definition(ctx, doc["taskDefinitionArn"])
        count += domain.is_failure(doc, _has_health_check(td), healthy_after)
    return count


def reconcile(ctx: Context, cluster: str, name: str, memory: Memory) -> Outcome:
    """One pass over one service (see the module's docstring)."""
    row = ctx.conn.execute(select(services).where(services.c.cluster_name == cluster, services.c.name == name)
                           .with_for_update()).first()
    outcome = Outcome()
    if row is None or row.status == "INACTIVE":
        outcome.gone = True
        return outcome
    svc, state = jsonio.loads(row.doc), jsonio.loads(row.state)
    doc_before, state_before = dumps(svc), dumps(state)
    observed = _observe(ctx, cluster, name)
    health_checked = {d["id"]: _has_health_check(task_definition(ctx, d["taskDefinition"]))
                      for d in svc["deployments"]}
    views = [_view(ctx, task, svc, health_checked, memory, outcome) for task in observed]
    desired = svc["desiredCount"] if svc["status"] == "ACTIVE" else 0
    primary = svc["deployments"][0]
    if svc["status"] == "ACTIVE" and primary["rolloutState"] == "IN_PROGRESS":
        primary = _breaker(ctx, svc, state, primary, memory, outcome)
    holding = memory.now < memory.launch_after.get(primary["id"], 0.0)
    if holding:
        outcome.wake(memory.launch_after[primary["id"]] - memory.now)
    failed = primary["rolloutState"] == "FAILED"
    plan = domain.plan(desired, svc["deploymentConfiguration"], primary["id"], views,
                       may_start=svc["status"] == "ACTIVE" and not failed and not holding,
                       scale_down_old=not failed)
    by_arn = {task.row.arn: task for task in observed}
    stopped = [_stop(ctx, by_arn[arn], reason) for arn, reason in plan.stop]
    started = _start(ctx, svc, primary, observed, min(plan.start, MAX_STARTS))
    if stopped:
        events.note(ctx, svc, f"has stopped {len(stopped)} running tasks: "
                              + " ".join(f"(task {a.rsplit('/', 1)[-1]})" for a in stopped) + ".")
    if started:
        events.note(ctx, svc, f"has started {len(started)} tasks: "
                              + " ".join(f"(task {d['taskArn'].rsplit('/', 1)[-1]})" for d in started) + ".")
    waiting = [t for t in observed if t.row.arn not in stopped and _unplaced(t.row)]
    _placement_episode(ctx, svc, state, lambda: [t.doc for t in waiting[:100]] + started,
                       bool(waiting) or any(_waits(d) for d in started))
    if svc["status"] == "ACTIVE" and primary["rolloutState"] == "IN_PROGRESS" \
            and domain.complete(desired, primary["id"], views):
        _completed(ctx, svc, state, primary)
    present = {v.deployment for v in views}
    svc["deployments"] = [d for d in svc["deployments"] if d["status"] == "PRIMARY" or d["id"] in present]
    state["deployments"] = {k: v for k, v in state["deployments"].items()
                            if k in {d["id"] for d in svc["deployments"]}}
    _steady(ctx, svc, state, primary, desired, views, changed=bool(stopped or started))
    status = svc["status"]
    if status == "DRAINING" and not any(t.row.last_status in RUNS for t in observed):
        status = svc["status"] = "INACTIVE"  # every task is stopping or stopped (ECS)
    if dumps(svc) != doc_before or dumps(state) != state_before:
        update_versioned(ctx.conn, services, {"arn": row.arn}, row.version, status=status, doc=dumps(svc),
                         state=dumps(state))
    if started and len(started) < plan.start:
        outcome.wake(0.0)
    return outcome


def _breaker(ctx: Context, svc: dict, state: dict, primary: dict, memory: Memory, outcome: Outcome) -> dict:
    """Count the primary deployment's failures; at the threshold the deployment FAILS, and rolls
    back to the last COMPLETED deployment if asked. Returns the primary deployment after it."""
    cluster, name = svc["clusterArn"].rsplit("/", 1)[-1], svc["serviceName"]
    breaker = svc["deploymentConfiguration"].get("deploymentCircuitBreaker") or {}
    threshold = domain.breaker_threshold(svc["desiredCount"], breaker)
    failures = _failures(ctx, cluster, name, primary["id"], memory.healthy_after)
    outcome.failures = (primary["id"], failures, threshold)
    mine = state["deployments"].setdefault(primary["id"], {})
    sd_arn = mine.get("serviceDeployment")
    if failures != primary.get("failedTasks", 0):
        primary.update(failedTasks=failures, updatedAt=ctx.now)
        if sd_arn and not mine.get("rollback"):
            deployments.record_failures(ctx, svc, sd_arn, failures)
    if failures < threshold:
        return primary
    if not breaker.get("enable"):
        if not mine.get("impaired"):  # once per deployment
            mine["impaired"] = True
            events.service_action(ctx, svc, "SERVICE_TASK_START_IMPAIRED")
            events.note(ctx, svc, "is unable to consistently start tasks successfully.")
        return primary
    reason = "ECS deployment circuit breaker: tasks failed to start."
    primary.update(rolloutState="FAILED", rolloutStateReason=reason, updatedAt=ctx.now)
    events.deployment_change(ctx, svc, primary["id"], "SERVICE_DEPLOYMENT_FAILED", reason)
    events.note(ctx, svc, f"(deployment {primary['id']}) deployment failed: tasks failed to start.")
    last = state.get("lastCompleted")
    if mine.get("rollback"):  # a rollback that fails is not rolled back again
        if sd_arn:
            deployments.finish(ctx, sd_arn, "ROLLBACK_FAILED", reason)
        return primary
    if sd_arn:
        deployments.record_failures(ctx, svc, sd_arn, failures, "TRIGGERED")
    if not (breaker.get("rollback") and last):
        if sd_arn:
            deployments.finish(ctx, sd_arn, "STOPPED", reason)
        return primary
    for key in ("launchType", "capacityProviderStrategy", "networkConfiguration", "placementConstraints",
                "placementStrategy"):
        svc.pop(key, None)
        if key in last:
            svc[key] = last[key]
    new = deployments.start(ctx, svc, state, task_definition=last["taskDefinition"], rollback_of=sd_arn,
                            reason=f"ECS deployment circuit breaker: rolling back to deploymentId {last['id']}.")
    if sd_arn:
        deployments.update(ctx, sd_arn, status="ROLLBACK_IN_PROGRESS", statusReason=reason, rollback={
            "reason": reason, "startedAt": ctx.now,
            "serviceRevisionArn": ctx.arns.service_revision(cluster, name, new["id"])})
    events.note(ctx, svc, f"(deployment {primary['id']}) rolling back to deployment {last['id']}.")
    return new


def _completed(ctx: Context, svc: dict, state: dict, primary: dict) -> None:
    reason = f"ECS deployment {primary['id']} completed."
    primary.update(rolloutState="COMPLETED", rolloutStateReason=reason, updatedAt=ctx.now)
    events.deployment_change(ctx, svc, primary["id"], "SERVICE_DEPLOYMENT_COMPLETED", reason)
    events.note(ctx, svc, f"(deployment {primary['id']}) deployment completed.")
    mine = state["deployments"].get(primary["id"], {})
    sd_arn = mine.get("serviceDeployment")
    if sd_arn:
        if mine.get("rollback"):
            deployments.finish(ctx, sd_arn, "ROLLBACK_SUCCESSFUL", f"Rolled back to {primary['taskDefinition']}.")
        else:
            deployments.finish(ctx, sd_arn, "SUCCESSFUL", reason)
            if (svc["deploymentConfiguration"].get("deploymentCircuitBreaker") or {}).get("enable"):
                deployments.record_failures(ctx, svc, sd_arn, primary.get("failedTasks", 0), "MONITORING_COMPLETE")
    state["lastCompleted"] = {"id": primary["id"], "taskDefinition": primary["taskDefinition"],
                              **{k: svc[k] for k in ("launchType", "capacityProviderStrategy", "networkConfiguration",
                                                     "placementConstraints", "placementStrategy") if k in svc}}


def _steady(ctx: Context, svc: dict, state: dict, primary: dict, desired: int, views, *, changed: bool) -> None:
    """SERVICE_STEADY_STATE once per episode: when the service settles, not on every pass."""
    now_steady = (svc["status"] == "ACTIVE" and not changed and len(svc["deployments"]) == 1
                  and primary["rolloutState"] == "COMPLETED" and domain.steady(desired, primary["id"], views))
    if now_steady and not state.get("steady"):
        events.service_action(ctx, svc, "SERVICE_STEADY_STATE")
        events.note(ctx, svc, "has reached a steady state.")
    state["steady"] = now_steady


def _unplaced(row) -> bool:
    return row.desired_status == "RUNNING" and not row.container_instance_arn and row.last_status == "PENDING"


def _waits(doc: dict) -> bool:
    return doc["desiredStatus"] == "RUNNING" and not doc.get("containerInstanceArn") and doc["lastStatus"] == "PENDING"


def _placement_episode(ctx: Context, svc: dict, state: dict, docs, any_waiting: bool) -> None:
    """SERVICE_TASK_PLACEMENT_FAILURE once per episode: from the first task that found no host
    until none of the service's tasks waits for one. Tasks that wait for a capacity provider to
    launch a host (PROVISIONING) are not a failure. `docs()` gives the waiting tasks' documents
    (some of them: enough for the reasons), read only when an episode starts."""
    if not any_waiting:
        state["placementFailure"] = False
        return
    if state.get("placementFailure"):
        return
    state["placementFailure"] = True
    waiting = [d for d in docs() if _waits(d)]
    reasons = sorted({a["value"] for d in waiting for a in d.get("attributes", []) if a["name"] == PENDING_REASON})
    events.service_action(ctx, svc, "SERVICE_TASK_PLACEMENT_FAILURE", reasons=reasons)
    events.note(ctx, svc, "was unable to place a task because no container instance met all of its requirements. "
                          f"Reason: {'; '.join(reasons) or 'unknown'}.")


def _stop(ctx: Context, task: Observed, reason: str) -> str:
    """Stop one task as the scheduler: at once if no agent has it, else through its agent."""
    row, doc = task.row, task.doc
    if doc["lastStatus"] in ("PROVISIONING", "PENDING") and not _agent_connected(ctx, row.container_instance_arn):
        doc = stop_unstarted(doc, reason, "ServiceSchedulerInitiated", ctx.now)
        release(ctx, doc.get("containerInstanceArn"), doc["taskArn"])
    else:
        doc.update(desiredStatus="STOPPED", stopCode="ServiceSchedulerInitiated", stoppedReason=reason,
                   stoppingAt=ctx.now, version=doc["version"] + 1)
    update_versioned(ctx.conn, tasks, {"arn": row.arn}, row.version, last_status=doc["lastStatus"],
                     desired_status=doc["desiredStatus"], doc=dumps(doc))
    if doc.get("containerInstanceArn"):  # also a task stopped unstarted: its agent may come back
        ctx.tell_agent(doc["containerInstanceArn"], row.arn)
    emit_task_change(ctx, doc)
    return row.arn


def _start(ctx: Context, svc: dict, primary: dict, observed, count: int) -> list[dict]:
    """Start `count` tasks of the primary deployment (group service:<name>, startedBy its id)."""
    if count <= 0:
        return []
    cluster = cluster_row(ctx, svc["clusterArn"].rsplit("/", 1)[-1], lock="share")
    td = task_definition(ctx, primary["taskDefinition"])
    placement = check_placement(td, {"placementConstraints": svc.get("placementConstraints", []),
                                     "placementStrategy": svc.get("placementStrategy")
                                     or domain.DEFAULT_PLACEMENT_STRATEGY})
    req = {"group": f"service:{svc['serviceName']}", "startedBy": primary["id"], "tags": [],
           "propagateTags": svc.get("propagateTags")}
    if svc.get("propagateTags") == "SERVICE":
        req["tags"] = svc.get("tags", [])
    strategy = primary.get("capacityProviderStrategy") or []
    if not strategy:
        return create_tasks(ctx, req, cluster, td, count, launch_type=primary.get("launchType", "EC2"),
                            placement={**placement, "capacityProviderStrategy": []}, last_status="PENDING",
                            service_name=svc["serviceName"])
    # Spread over the strategy's providers by base and weight, one task at a time.
    counts: dict[str, int] = {}
    for task in observed:
        row = task.row
        if row.desired_status == "RUNNING":
            provider = task.doc.get("capacityProviderName") or next(
                iter(s["capacityProvider"] for s in jsonio.loads(row.placement or "{}").get("capacityProviderStrategy",
                                                                                           [])), None)
            if provider:
                counts[provider] = counts.get(provider, 0) + 1
    out = []
    for _ in range(count):
        provider = domain.next_provider(strategy, counts)
        counts[provider] = counts.get(provider, 0) + 1
        out += create_tasks(ctx, req, cluster, td, 1, launch_type=None, last_status="PROVISIONING",
                            placement={**placement, "capacityProviderStrategy": [
                                {"capacityProvider": provider, "weight": 1}]},
                            service_name=svc["serviceName"])
    return out


def _live_services(conn) -> set[tuple[str, str]]:
    return {(r.cluster_name, r.name) for r in conn.execute(
        select(services.c.cluster_name, services.c.name).where(services.c.status != "INACTIVE"))}


class ServiceScheduler:
    """The hub's side of the reconciler: which services to look at, and this server's memory."""

    def __init__(self, healthy_after: float = HEALTHY_AFTER, resync: float = RESYNC):
        self.healthy_after, self.resync = healthy_after, resync
        self.dirty: set[tuple[str, str]] = set()
        self.due: dict[tuple[str, str], float] = {}  # monotonic time to look again
        self.running: dict[tuple[str, str], dict[str, float]] = {}
        self.backoff: dict[str, tuple[int, float]] = {}  # deployment -> (failures seen, no launch before)
        self.errors: dict[tuple[str, str], int] = {}  # passes in a row that raised
        self._last_resync = time.monotonic()

    def mark(self, keys) -> None:
        self.dirty |= set(keys)

    def next_due(self) -> float | None:
        return min(self.due.values(), default=None)

    async def run_once(self, hub) -> None:
        now = time.monotonic()
        for key, at in list(self.due.items()):
            if at <= now:
                self.dirty.add(key)
                del self.due[key]
        if now - self._last_resync >= self.resync:
            self._last_resync = now
            self.dirty |= await hub.store.read(_live_services)
        batch, self.dirty = self.dirty, set()
        for key in sorted(batch):
            memory = Memory(time.monotonic(), dict(self.running.get(key, {})),
                            {d: t for d, (_, t) in self.backoff.items()}, self.healthy_after)
            try:
                outcome = await hub.write(lambda ctx, key=key, memory=memory: reconcile(ctx, *key, memory))
            except Exception:  # one service's trouble must not hold up the others
                errors = self.errors[key] = self.errors.get(key, 0) + 1
                log.exception("service %s/%s: reconcile failed (%d in a row); trying again", *key, errors)
                self.due[key] = time.monotonic() + min(2.0 ** errors, 60.0)
                continue
            self.errors.pop(key, None)
            self._remember(key, memory, outcome)

    def _remember(self, key, memory: Memory, outcome: Outcome) -> None:
        if outcome.gone:
            self.running.pop(key, None)
            self.due.pop(key, None)
            return
        seen = self.running.get(key, {})
        self.running[key] = {arn: seen.get(arn, memory.now) for arn in outcome.running}
        if outcome.failures:
            deployment, failures, threshold = outcome.failures
            if failures > self.backoff.get(deployment, (0, 0.0))[0]:
                delay = domain.launch_backoff(failures, threshold)
                self.backoff[deployment] = (failures, time.monotonic() + delay)
                if delay:
                    outcome.wake(delay)
        if outcome.wake_in is not None:
            at = time.monotonic() + max(outcome.wake_in, 0.0) + 0.01
            self.due[key] = min(self.due.get(key, at), at)
