"""Managed daemons: CreateDaemon, UpdateDaemon, DeleteDaemon, DescribeDaemon, ListDaemons,
DescribeDaemonRevisions, DescribeDaemonDeployments, ListDaemonDeployments.

These calls only record what is wanted. CreateDaemon and UpdateDaemon write a new immutable
revision (task definition, `critical`, tag and exec settings), and every Create/Update/Delete
starts a PENDING deployment that supersedes (STOPs) the daemon's unfinished one. The daemon
reconciler does the work on hosts: it advances deployments with `set_deployment_status` (and
`update_deployment` for their breaker and alarms) and, once a deleted daemon has no task left,
forgets it with `remove`.

Daemon tasks are ordinary rows of `tasks` (startedBy the daemon's ARN, group "daemon:<name>",
`daemon_name` set); DescribeDaemon counts hosts from them (`host_counts`).
"""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import delete, func, insert, select

from shoal.api import idempotency
from shoal.api.ecs.common import DEFAULT_CLUSTER, check_name, check_tags, cluster_row, failure, page
from shoal.api.ecs.daemon_task_definitions import resolve as resolve_task_definition, settle
from shoal.api.operations import Context, dumps, ecs
from shoal.domain import arns
from shoal.domain import daemons as domain
from shoal.domain.errors import ApiError, InvalidParameter
from shoal.events import daemons as events
from shoal.store.db import update_versioned
from shoal.store.tables import (
    capacity_providers, container_instances as cis, daemon_capacity_providers as daemon_cps,
    daemon_deployments as deployments, daemon_revisions as revisions, daemons, tasks,
)

MAX_DESCRIBE = 20


def daemon_not_found(ref: str) -> ApiError:
    return ApiError(f"Daemon not found: '{ref}'.", "DaemonNotFoundException")


# --- lookups -----------------------------------------------------------------------------------


def _locate(ref: str, field: str) -> tuple[str, str]:
    """(cluster, daemon name) of a daemon ARN; a bare name is a daemon of the default cluster."""
    if not arns.is_arn(ref):
        return DEFAULT_CLUSTER, ref
    arn = arns.parse(ref, field)
    parts = arn.path.split("/")
    if arn.resource_type != "daemon" or len(parts) != 2 or not all(parts):
        raise InvalidParameter(f"Invalid parameter '{field}': '{ref}' is not a daemon ARN "
                               "(…:daemon/<cluster>/<name>).")
    return parts[0], parts[1]


def daemon_row(ctx: Context, ref: str, field: str = "daemonArn", *, for_update: bool = False):
    cluster, name = _locate(ref, field)
    stmt = select(daemons).where(daemons.c.cluster_name == cluster, daemons.c.name == name)
    row = ctx.conn.execute(stmt.with_for_update() if for_update else stmt).first()
    if row is None:
        raise daemon_not_found(ref)
    return row


def _active_daemon(ctx: Context, ref: str):
    """The daemon's row, locked, for UpdateDaemon and DeleteDaemon: it must be ACTIVE."""
    row = daemon_row(ctx, ref, for_update=True)
    if row.status != "ACTIVE":
        raise ApiError(f"Daemon '{row.name}' is {row.status}, not ACTIVE.", "DaemonNotActiveException")
    return row


def _cluster(ctx: Context, ref: str | None):
    name = arns.short_name(ref, "cluster", "clusterArn") if ref else None
    return cluster_row(ctx, name, lock="share")


def _providers(ctx: Context, cluster, refs: list[str], field: str = "capacityProviderArns") -> list[str]:
    """Names of the capacity providers a daemon runs on: each exists and is the cluster's. Managed
    and self-managed providers alike (ECS allows managed ones only)."""
    if not refs:
        raise InvalidParameter(f"Invalid parameter '{field}': name at least one capacity provider.")
    names = [arns.short_name(ref, "capacity-provider", f"{field}[{i}]") for i, ref in enumerate(refs)]
    status = dict(ctx.conn.execute(select(capacity_providers.c.name, capacity_providers.c.status)
                                   .where(capacity_providers.c.name.in_(names))).all())
    attached = set(json.loads(cluster.doc)["capacityProviders"])
    for i, (ref, name) in enumerate(zip(refs, names)):
        if name in names[:i]:
            raise InvalidParameter(f"Invalid parameter '{field}[{i}]': capacity provider '{name}' is named twice.")
        if status.get(name, "INACTIVE") == "INACTIVE":
            raise InvalidParameter(f"Invalid parameter '{field}[{i}]': capacity provider '{ref}' does not exist.")
        if name not in attached:
            raise InvalidParameter(f"Invalid parameter '{field}[{i}]': capacity provider '{name}' is not associated "
                                   f"with cluster '{cluster.name}'.")
    return names


def _task_definition(ctx: Context, ref: str):
    """The ACTIVE daemon task definition a daemon is to run, locked: a DeleteDaemonTaskDefinition
    of it waits, then sees the daemon that uses it (and leaves it DELETE_IN_PROGRESS)."""
    return resolve_task_definition(ctx, ref, "daemonTaskDefinitionArn", active_only=True, for_update=True)


def provider_names(ctx: Context, daemon_arn: str) -> list[str]:
    return list(ctx.conn.execute(select(daemon_cps.c.capacity_provider_name)
                                 .where(daemon_cps.c.daemon_arn == daemon_arn)
                                 .order_by(daemon_cps.c.capacity_provider_name)).scalars())


# --- counting hosts ------------------------------------------------------------------------------


def host_counts(ctx: Context, cluster: str, daemon: str, providers: list[str]) -> dict[str, dict[tuple, int]]:
    """Per capacity provider, the hosts (ACTIVE or DRAINING) of the cluster counted by
    (status, whether a RUNNING task of the daemon is on them): {provider: {("ACTIVE", True): n, …}}."""
    counts: dict[str, dict[tuple, int]] = {p: {} for p in providers}
    if not providers:
        return counts
    running = (select(tasks.c.container_instance_arn)
               .where(tasks.c.cluster_name == cluster, tasks.c.daemon_name == daemon, tasks.c.last_status == "RUNNING")
               .distinct().subquery())
    has = running.c.container_instance_arn.is_not(None)
    rows = ctx.conn.execute(
        select(cis.c.capacity_provider_name, cis.c.status, has, func.count())
        .select_from(cis.outerjoin(running, running.c.container_instance_arn == cis.c.arn))
        .where(cis.c.cluster_name == cluster, cis.c.capacity_provider_name.in_(providers),
               cis.c.status.in_(("ACTIVE", "DRAINING")))
        .group_by(cis.c.capacity_provider_name, cis.c.status, has))
    for provider, status, with_daemon, n in rows:
        counts[provider][(status, bool(with_daemon))] = n
    return counts


def _instance_counts(ctx: Context, provider: str, counts: dict[tuple, int]) -> dict:
    return domain.instance_counts(ctx.arns.capacity_provider(provider), counts)


def _with_live_counts(ctx: Context, cluster: str, daemon_arn: str, doc: dict) -> dict:
    """The deployment with its target revision's counts as they are now. Tasks do not record
    their daemon revision, so these are the daemon's hosts, whichever revision they run."""
    target = doc.get("targetDaemonRevision")
    if not target:
        return doc
    names = [cp["arn"].rsplit("/", 1)[-1] for cp in target["capacityProviders"]]
    counts = host_counts(ctx, cluster, daemon_arn.rsplit("/", 1)[-1], names)
    detail = domain.revision_detail(target["arn"], [_instance_counts(ctx, p, counts[p]) for p in names])
    return {**doc, "targetDaemonRevision": detail}


# --- revisions and deployments -------------------------------------------------------------------


def _new_revision(ctx: Context, cluster, daemon_arn: str, name: str, td_row, settings: dict) -> str:
    arn = ctx.arns.daemon_revision(cluster.name, name, arns.new_id())
    doc = domain.revision_doc(arn=arn, cluster_arn=cluster.arn, daemon_arn=daemon_arn,
                              task_definition=json.loads(td_row.doc), settings_=settings, now=ctx.now)
    ctx.conn.execute(insert(revisions).values(arn=arn, daemon_arn=daemon_arn, cluster_name=cluster.name,
                                              created_at=ctx.now, doc=dumps(doc)))
    return arn


def _deploy(ctx: Context, cluster_name: str, cluster_arn: str, daemon_arn: str, *, target: str | None,
            providers: list[str], sources: list[tuple[str, list[str]]], config: dict,
            superseded: str | None) -> dict:
    """Start a PENDING deployment of `target` (None: take the daemon off its hosts) on `providers`,
    from the `sources` revisions (each with its providers), stopping the `superseded` one."""
    name = daemon_arn.rsplit("/", 1)[-1]
    arn = ctx.arns.daemon_deployment(cluster_name, name, arns.new_id())
    if superseded:
        set_deployment_status(ctx, superseded, domain.STOPPED, f"Superseded by daemon deployment {arn}.")
    scope = sorted({*providers, *(p for _, names in sources for p in names)})
    counts = host_counts(ctx, cluster_name, name, scope)

    def detail(revision: str, names: list[str]) -> dict:
        return domain.revision_detail(revision, [_instance_counts(ctx, p, counts[p]) for p in names])

    hosts = sum(sum(counts[p].values()) for p in (providers or scope))
    doc = domain.deployment_doc(arn=arn, cluster_arn=cluster_arn, target=detail(target, providers) if target else None,
                                sources=[detail(r, names) for r, names in sources], config=config, hosts=hosts,
                                now=ctx.now)
    ctx.conn.execute(insert(deployments).values(arn=arn, daemon_arn=daemon_arn, cluster_name=cluster_name,
                                                status=doc["status"], created_at=ctx.now, version=1, doc=dumps(doc)))
    events.deployment_state_change(ctx, doc, daemon_arn)
    return doc


def set_deployment_status(ctx: Context, deployment_arn: str, status: str, reason: str | None = None,
                          **fields) -> dict | None:
    """Move a daemon deployment to `status` and write its "ECS Daemon Deployment State Change" event,
    in the caller's transaction. `fields` sets other DaemonDeployment members with it
    (circuitBreaker, alarms, rollback). A deployment that ends keeps the counts it ended with.

    Returns the new document; None when the deployment does not exist, already has that status,
    or cannot move there (it ended meanwhile): a reconciler that races a newer UpdateDaemon then
    changes nothing. Lock order, as UpdateDaemon and DeleteDaemon take it: the daemon's row
    before its deployments' rows."""
    if "status" in fields:
        raise ValueError("give the status as `status`, not among the fields")
    row = ctx.conn.execute(select(deployments).where(deployments.c.arn == deployment_arn).with_for_update()).first()
    if row is None or not domain.can_transition(row.status, status):
        return None
    doc = domain.transition({**json.loads(row.doc), **fields}, status, ctx.now, reason)
    if status in domain.ENDED:
        doc = _with_live_counts(ctx, row.cluster_name, row.daemon_arn, doc)
    update_versioned(ctx.conn, deployments, {"arn": row.arn}, row.version, status=status, doc=dumps(doc))
    events.deployment_state_change(ctx, doc, row.daemon_arn)
    return doc


def update_deployment(ctx: Context, deployment_arn: str, **fields) -> dict | None:
    """Set DaemonDeployment members other than its status (circuitBreaker's failureCount, the
    alarms' triggeredAlarmNames) on a deployment that has not ended. No event: ECS writes one per
    status change. Returns the new document, or None (unknown or ended deployment)."""
    if "status" in fields:
        raise ValueError("a deployment's status changes through set_deployment_status")
    row = ctx.conn.execute(select(deployments).where(deployments.c.arn == deployment_arn).with_for_update()).first()
    if row is None or row.status in domain.ENDED:
        return None
    doc = {**json.loads(row.doc), **fields}
    update_versioned(ctx.conn, deployments, {"arn": row.arn}, row.version, doc=dumps(doc))
    return doc


def remove(ctx: Context, daemon_arn: str) -> bool:
    """Forget a DELETE_IN_PROGRESS daemon whose tasks have all stopped: it is then not found and its
    name is free again. Its revisions and deployments stay describable. False (and nothing
    changed) when the daemon is not being deleted or a task of it has not stopped."""
    row = ctx.conn.execute(select(daemons).where(daemons.c.arn == daemon_arn).with_for_update()).first()
    if row is None or row.status != "DELETE_IN_PROGRESS":
        return False
    live = ctx.conn.execute(select(func.count()).where(
        tasks.c.cluster_name == row.cluster_name, tasks.c.daemon_name == row.name,
        tasks.c.last_status != "STOPPED")).scalar_one()
    if live:
        return False
    ctx.conn.execute(delete(daemon_cps).where(daemon_cps.c.daemon_arn == row.arn))
    ctx.conn.execute(delete(daemons).where(daemons.c.arn == row.arn))
    settle(ctx, [row.task_definition_arn])
    return True


def _set_providers(ctx: Context, daemon_arn: str, names: list[str]) -> None:
    ctx.conn.execute(delete(daemon_cps).where(daemon_cps.c.daemon_arn == daemon_arn))
    ctx.conn.execute(insert(daemon_cps), [{"daemon_arn": daemon_arn, "capacity_provider_name": n} for n in names])


def _answer(row_doc: dict, deployment_arn: str, *, updated: bool) -> dict:
    out = {"daemonArn": row_doc["daemonArn"], "status": row_doc["status"], "createdAt": row_doc["createdAt"]}
    if updated:
        out["updatedAt"] = row_doc["updatedAt"]
    out["deploymentArn"] = deployment_arn
    return out


# --- operations --------------------------------------------------------------------------------


@ecs.op("CreateDaemon")
def create_daemon(ctx: Context, req: dict) -> dict:
    domain.check_client_token(req.get("clientToken"))
    remembered = idempotency.recall(ctx, "CreateDaemon", req)
    if remembered is not None:
        return remembered
    cluster = _cluster(ctx, req.get("clusterArn"))
    name = domain.check_name(check_name(req["daemonName"], "daemonName", "daemon"))
    td = _task_definition(ctx, req["daemonTaskDefinitionArn"])
    providers = _providers(ctx, cluster, req["capacityProviderArns"])
    config = domain.deployment_configuration(req.get("deploymentConfiguration"))
    settings = domain.settings(req)
    tags = check_tags(req.get("tags", []))
    existing = ctx.conn.execute(select(daemons.c.status).where(daemons.c.cluster_name == cluster.name,
                                                               daemons.c.name == name)).first()
    if existing is not None:
        raise InvalidParameter(f"Invalid parameter 'daemonName': daemon '{name}' already exists in cluster "
                               f"'{cluster.name}' ({existing.status}).")
    arn = ctx.arns.daemon(cluster.name, name)
    revision = _new_revision(ctx, cluster, arn, name, td, settings)
    # CreateDaemon starts the daemon in place on the hosts there are (no drain); the deployment
    # has no source revision.
    deployment = _deploy(ctx, cluster.name, cluster.arn, arn, target=revision, providers=providers, sources=[],
                         config=config, superseded=None)
    doc = {"daemonArn": arn, "clusterArn": cluster.arn, "status": "ACTIVE", "createdAt": ctx.now,
           "updatedAt": ctx.now, "deploymentArn": deployment["daemonDeploymentArn"], "tags": tags}
    ctx.conn.execute(insert(daemons).values(
        arn=arn, name=name, cluster_name=cluster.name, status="ACTIVE", task_definition_arn=td.arn,
        revision_arn=revision, deployment_arn=doc["deploymentArn"], created_at=ctx.now, updated_at=ctx.now,
        version=1, doc=dumps(doc)))
    _set_providers(ctx, arn, providers)
    ctx.dirty_daemons.add(cluster.name)  # the daemon scheduler starts it on the hosts there are
    out = _answer(doc, doc["deploymentArn"], updated=False)
    idempotency.remember(ctx, "CreateDaemon", req, out)
    return out


@ecs.op("UpdateDaemon")
def update_daemon(ctx: Context, req: dict) -> dict:
    row = _active_daemon(ctx, req["daemonArn"])
    cluster = cluster_row(ctx, row.cluster_name, lock="share")
    td = _task_definition(ctx, req["daemonTaskDefinitionArn"])
    providers = _providers(ctx, cluster, req["capacityProviderArns"])
    # No carry-over: what the request leaves out takes its default (critical true, alarms off, …).
    config = domain.deployment_configuration(req.get("deploymentConfiguration"))
    settings = domain.settings(req)
    revision = _new_revision(ctx, cluster, row.arn, row.name, td, settings)
    deployment = _deploy(ctx, cluster.name, cluster.arn, row.arn, target=revision, providers=providers,
                         sources=[(row.revision_arn, provider_names(ctx, row.arn))], config=config,
                         superseded=row.deployment_arn)
    _set_providers(ctx, row.arn, providers)
    doc = json.loads(row.doc)
    doc.update(updatedAt=ctx.now, deploymentArn=deployment["daemonDeploymentArn"])
    update_versioned(ctx.conn, daemons, {"arn": row.arn}, row.version, task_definition_arn=td.arn,
                     revision_arn=revision, deployment_arn=doc["deploymentArn"], updated_at=ctx.now, doc=dumps(doc))
    if row.task_definition_arn != td.arn:
        settle(ctx, [row.task_definition_arn])
    ctx.dirty_daemons.add(cluster.name)
    return _answer(doc, doc["deploymentArn"], updated=True)


@ecs.op("DeleteDaemon")
def delete_daemon(ctx: Context, req: dict) -> dict:
    row = _active_daemon(ctx, req["daemonArn"])
    doc = json.loads(row.doc)
    # The deletion drains hosts as the daemon's latest deployment would have.
    config = json.loads(ctx.conn.execute(select(deployments.c.doc).where(deployments.c.arn == row.deployment_arn))
                        .scalar_one())["deploymentConfiguration"]
    deployment = _deploy(ctx, row.cluster_name, doc["clusterArn"], row.arn, target=None, providers=[],
                         sources=[(row.revision_arn, provider_names(ctx, row.arn))], config=config,
                         superseded=row.deployment_arn)
    doc.update(status="DELETE_IN_PROGRESS", updatedAt=ctx.now, deploymentArn=deployment["daemonDeploymentArn"])
    update_versioned(ctx.conn, daemons, {"arn": row.arn}, row.version, status="DELETE_IN_PROGRESS",
                     deployment_arn=doc["deploymentArn"], updated_at=ctx.now, doc=dumps(doc))
    ctx.dirty_daemons.add(row.cluster_name)  # the daemon scheduler takes it off its hosts
    return _answer(doc, doc["deploymentArn"], updated=True)


@ecs.op("DescribeDaemon", write=False)
def describe_daemon(ctx: Context, req: dict) -> dict:
    row = daemon_row(ctx, req["daemonArn"])
    doc = {k: v for k, v in json.loads(row.doc).items() if k != "tags"}
    names = provider_names(ctx, row.arn)
    counts = host_counts(ctx, row.cluster_name, row.name, names)
    providers = []
    for name in names:
        running, without = domain.daemon_counts(counts[name])
        providers.append({"arn": ctx.arns.capacity_provider(name), "runningCount": running,
                          "withoutDaemonCount": without})
    doc["currentRevisions"] = [{
        "arn": row.revision_arn, "capacityProviders": providers,
        "totalRunningCount": sum(p["runningCount"] for p in providers),
        "totalWithoutDaemonCount": sum(p["withoutDaemonCount"] for p in providers)}]
    return {"daemon": doc}


@ecs.op("ListDaemons", write=False)
def list_daemons(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, arns.short_name(req["clusterArn"], "cluster", "clusterArn")
                          if req.get("clusterArn") else None)
    stmt = select(daemons.c.arn, daemons.c.status, daemons.c.created_at, daemons.c.updated_at).where(
        daemons.c.cluster_name == cluster.name)
    if req.get("capacityProviderArns"):
        names = [arns.short_name(ref, "capacity-provider", f"capacityProviderArns[{i}]")
                 for i, ref in enumerate(req["capacityProviderArns"])]
        stmt = stmt.where(daemons.c.arn.in_(select(daemon_cps.c.daemon_arn)
                                            .where(daemon_cps.c.capacity_provider_name.in_(names))))
    rows = ctx.conn.execute(stmt.order_by(daemons.c.created_at, daemons.c.name)).all()
    summaries = [{"daemonArn": r.arn, "status": r.status, "createdAt": r.created_at, "updatedAt": r.updated_at}
                 for r in rows]
    chunk, token = page(summaries, req)
    return {"daemonSummariesList": chunk, **({"nextToken": token} if token else {})}


def _check_refs(refs: list[str], field: str, resource_type: str) -> None:
    if not 1 <= len(refs) <= MAX_DESCRIBE:
        raise InvalidParameter(f"Invalid parameter '{field}': give 1 to {MAX_DESCRIBE} ARNs per call.")
    for i, ref in enumerate(refs):
        if arns.parse(ref, f"{field}[{i}]").resource_type != resource_type:
            raise InvalidParameter(f"Invalid parameter '{field}[{i}]': '{ref}' is not a {resource_type} ARN.")


@ecs.op("DescribeDaemonRevisions", write=False)
def describe_daemon_revisions(ctx: Context, req: dict) -> dict:
    refs = req["daemonRevisionArns"]
    _check_refs(refs, "daemonRevisionArns", "daemon-revision")
    found = {r.arn: json.loads(r.doc) for r in ctx.conn.execute(select(revisions).where(revisions.c.arn.in_(refs)))}
    return {"daemonRevisions": [found[r] for r in refs if r in found],
            "failures": [failure(r, "MISSING") for r in refs if r not in found]}


@ecs.op("DescribeDaemonDeployments", write=False)
def describe_daemon_deployments(ctx: Context, req: dict) -> dict:
    refs = req["daemonDeploymentArns"]
    _check_refs(refs, "daemonDeploymentArns", "daemon-deployment")
    rows = {r.arn: r for r in ctx.conn.execute(select(deployments).where(deployments.c.arn.in_(refs)))}
    found = []
    for ref in refs:
        if ref in rows:
            row = rows[ref]
            doc = json.loads(row.doc)
            # One that is still running shows its hosts as they are now; one that ended, as they were.
            found.append(doc if row.status in domain.ENDED else
                         _with_live_counts(ctx, row.cluster_name, row.daemon_arn, doc))
    return {"daemonDeployments": found, "failures": [failure(r, "MISSING") for r in refs if r not in rows]}


def _epoch(value, field: str) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise InvalidParameter(f"Invalid parameter '{field}': expected a timestamp in epoch seconds.")


# What a DaemonDeploymentSummary takes from the deployment, after its ARN and the daemon's.
_SUMMARY_KEYS = ("clusterArn", "status", "statusReason", "createdAt", "startedAt", "stoppedAt", "finishedAt")


@ecs.op("ListDaemonDeployments", write=False)
def list_daemon_deployments(ctx: Context, req: dict) -> dict:
    row = daemon_row(ctx, req["daemonArn"])
    # Deployments of an earlier daemon of the same name (deleted, then created again) are not its.
    stmt = select(deployments.c.doc).where(deployments.c.daemon_arn == row.arn,
                                           deployments.c.created_at >= row.created_at)
    if req.get("status"):
        stmt = stmt.where(deployments.c.status.in_(req["status"]))
    created = req.get("createdAt") or {}
    if created.get("after") is not None:
        stmt = stmt.where(deployments.c.created_at >= _epoch(created["after"], "createdAt.after"))
    if created.get("before") is not None:
        stmt = stmt.where(deployments.c.created_at <= _epoch(created["before"], "createdAt.before"))
    docs = ctx.conn.execute(stmt.order_by(deployments.c.created_at.desc(), deployments.c.arn)).scalars().all()
    chunk, token = page(docs, req, default_max=20)
    summaries = []
    for doc in map(json.loads, chunk):
        summary = {"daemonDeploymentArn": doc["daemonDeploymentArn"], "daemonArn": row.arn}
        summary.update({k: doc[k] for k in _SUMMARY_KEYS if k in doc})
        if doc.get("targetDaemonRevision"):
            summary["targetDaemonRevisionArn"] = doc["targetDaemonRevision"]["arn"]
        summaries.append(summary)
    return {"daemonDeployments": summaries, **({"nextToken": token} if token else {})}
