"""Service deployments: how a deployment starts and ends, and ListServiceDeployments,
DescribeServiceDeployments.

A service keeps its deployments in two shapes. `Service.deployments[]` (the Deployment shape:
PRIMARY, then ACTIVE ones still scaling down; rolloutState IN_PROGRESS → COMPLETED | FAILED)
lives in the service's document. Each deployment that an API call started also has a
ServiceDeployment row (IN_PROGRESS → SUCCESSFUL, or STOPPED when superseded, failed or
deleted; ROLLBACK_IN_PROGRESS → ROLLBACK_SUCCESSFUL | ROLLBACK_FAILED when the circuit breaker
rolls it back). A rollback is a new Deployment that reports to the ServiceDeployment it rolls
back, as ECS shows it. Deployment `ecs-svc/<n>` has service revision and service deployment `<n>`.
"""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import func, insert, select

from shoal.api.ecs.common import cluster_row, failure, page
from shoal.api.operations import Context, dumps, ecs
from shoal.domain import arns
from shoal.domain import services as domain
from shoal.domain.errors import ApiError, InvalidParameter
from shoal.domain.tasks import PENDING_STATES
from shoal.events import services as events
from shoal.store.db import update_versioned
from shoal.store.tables import service_deployments, services, tasks

MAX_DESCRIBE = 20
ENDED = ("SUCCESSFUL", "STOPPED", "ROLLBACK_SUCCESSFUL", "ROLLBACK_FAILED")


def service_not_found(ref: str) -> ApiError:
    return ApiError(f"Service not found: '{ref}'.", "ServiceNotFoundException")


def _launch(deployment: dict) -> dict:
    keys = ("launchType", "capacityProviderStrategy", "networkConfiguration")
    return {k: deployment[k] for k in keys if k in deployment}


def start(ctx: Context, svc: dict, state: dict, *, task_definition: str, reason: str,
          rollback_of: str | None = None) -> dict:
    """Start a new PRIMARY deployment of `svc` (changed in place, as is `state`) with the service's
    launch settings; the previous PRIMARY becomes ACTIVE and is scaled down by the scheduler.
    `rollback_of`: the service deployment this deployment rolls back (no new row of its own)."""
    dep_id = domain.deployment_id()
    cluster, name = svc["clusterArn"].rsplit("/", 1)[-1], svc["serviceName"]
    deployment = {"id": dep_id, "status": "PRIMARY", "taskDefinition": task_definition,
                  "desiredCount": svc["desiredCount"], "pendingCount": 0, "runningCount": 0, "failedTasks": 0,
                  "createdAt": ctx.now, "updatedAt": ctx.now, **_launch(svc),
                  "rolloutState": "IN_PROGRESS", "rolloutStateReason": f"ECS deployment {dep_id} in progress."}
    sources = [d for d in svc.get("deployments", [])]
    for d in sources:
        if d["status"] == "PRIMARY":
            d.update(status="ACTIVE", updatedAt=ctx.now)
            superseded = state["deployments"].get(d["id"], {}).get("serviceDeployment")
            if rollback_of is None and superseded:
                finish(ctx, superseded, "STOPPED", f"Superseded by deployment {dep_id}.", only_running=True)
    svc["deployments"] = [deployment, *sources]
    svc["taskDefinition"] = task_definition
    if rollback_of is None:
        sd_arn = ctx.arns.service_deployment(cluster, name, dep_id)
        doc = {
            "serviceDeploymentArn": sd_arn, "serviceArn": svc["serviceArn"], "clusterArn": svc["clusterArn"],
            "createdAt": ctx.now, "startedAt": ctx.now, "updatedAt": ctx.now,
            "sourceServiceRevisions": [{"arn": ctx.arns.service_revision(cluster, name, d["id"])} for d in sources],
            "targetServiceRevision": {"arn": ctx.arns.service_revision(cluster, name, dep_id)},
            "status": "IN_PROGRESS", "deploymentConfiguration": svc["deploymentConfiguration"],
            "deploymentCircuitBreaker": _breaker(svc, 0),
        }
        ctx.conn.execute(insert(service_deployments).values(
            arn=sd_arn, service_arn=svc["serviceArn"], cluster_name=cluster, status="IN_PROGRESS",
            created_at=ctx.now, version=1, doc=dumps(doc)))
    else:
        sd_arn = rollback_of
    state["deployments"][dep_id] = {"serviceDeployment": sd_arn, "rollback": rollback_of is not None}
    svc["currentServiceDeployment"] = sd_arn
    state["steady"] = False
    events.deployment_change(ctx, svc, dep_id, "SERVICE_DEPLOYMENT_IN_PROGRESS", reason)
    return deployment


def _breaker(svc: dict, failures: int, status: str | None = None) -> dict:
    config = svc["deploymentConfiguration"].get("deploymentCircuitBreaker") or {}
    if not config.get("enable"):
        return {"status": "DISABLED", "failureCount": failures, "threshold": 0}
    return {"status": status or "MONITORING", "failureCount": failures,
            "threshold": domain.breaker_threshold(svc["desiredCount"], config)}


def update(ctx: Context, sd_arn: str, **changes) -> dict | None:
    """Change a service deployment row's document (and status column)."""
    row = ctx.conn.execute(select(service_deployments).where(service_deployments.c.arn == sd_arn)
                           .with_for_update()).first()
    if row is None:
        return None
    doc = json.loads(row.doc)
    before = dict(doc)
    doc.update(changes)
    if doc != before:
        doc["updatedAt"] = ctx.now
        update_versioned(ctx.conn, service_deployments, {"arn": sd_arn}, row.version, status=doc["status"],
                         doc=dumps(doc))
    return doc


def finish(ctx: Context, sd_arn: str, status: str, reason: str, *, only_running: bool = False) -> None:
    """End a service deployment: SUCCESSFUL, STOPPED, ROLLBACK_SUCCESSFUL or ROLLBACK_FAILED."""
    row = ctx.conn.execute(select(service_deployments.c.status).where(service_deployments.c.arn == sd_arn)).first()
    if row is None or row.status in ENDED or (only_running and row.status not in ("IN_PROGRESS",
                                                                                  "ROLLBACK_IN_PROGRESS")):
        return
    times = {"finishedAt": ctx.now} if status in ("SUCCESSFUL", "ROLLBACK_SUCCESSFUL") else {"stoppedAt": ctx.now}
    update(ctx, sd_arn, status=status, statusReason=reason, **times)


def record_failures(ctx: Context, svc: dict, sd_arn: str, failures: int, status: str | None = None) -> None:
    update(ctx, sd_arn, deploymentCircuitBreaker=_breaker(svc, failures, status))


# --- reading ---------------------------------------------------------------------------------


def task_counts(ctx: Context, cluster: str, names: list[str]) -> dict[tuple[str, str], dict[str, int]]:
    """{(service, deployment id): {"running": n, "pending": n, "wanted": n}} for tasks that have not stopped."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    if not names:
        return counts
    rows = ctx.conn.execute(
        select(tasks.c.service_name, tasks.c.started_by, tasks.c.last_status, tasks.c.desired_status, func.count())
        .where(tasks.c.cluster_name == cluster, tasks.c.service_name.in_(names), tasks.c.last_status != "STOPPED")
        .group_by(tasks.c.service_name, tasks.c.started_by, tasks.c.last_status, tasks.c.desired_status))
    for name, started_by, last, desired, n in rows:
        c = counts.setdefault((name, started_by), {"running": 0, "pending": 0, "wanted": 0})
        if last == "RUNNING":
            c["running"] += n
        elif last in PENDING_STATES:
            c["pending"] += n
        if desired == "RUNNING":
            c["wanted"] += n
    return counts


def with_counts(doc: dict, counts: dict) -> dict:
    """A Service document as DescribeServices returns it: task counts as they are now."""
    name = doc["serviceName"]
    running = pending = 0
    revisions = []
    for d in doc.get("deployments", []):
        c = counts.get((name, d["id"]), {})
        d["runningCount"], d["pendingCount"] = c.get("running", 0), c.get("pending", 0)
        if d["status"] != "PRIMARY":
            d["desiredCount"] = c.get("wanted", 0)
        running, pending = running + d["runningCount"], pending + d["pendingCount"]
        revisions.append({"arn": _revision_arn(doc, d["id"]), "requestedTaskCount": d["desiredCount"],
                          "runningTaskCount": d["runningCount"], "pendingTaskCount": d["pendingCount"]})
    doc.update(runningCount=running, pendingCount=pending)
    if doc["status"] != "INACTIVE":
        doc["currentServiceRevisions"] = revisions
    return doc


def _revision_arn(svc: dict, deployment_id: str) -> str:
    prefix = svc["serviceArn"].replace(":service/", ":service-revision/", 1)
    return f"{prefix}/{deployment_id.rsplit('/', 1)[-1]}"


def _service(ctx: Context, cluster, ref: str, field: str):
    name = arns.short_name(ref, "service", field)
    row = ctx.conn.execute(select(services).where(services.c.cluster_name == cluster.name,
                                                  services.c.name == name)).first()
    if row is None:
        raise service_not_found(ref)
    return row


def _epoch(value, field: str) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise InvalidParameter(f"Invalid parameter '{field}': expected a timestamp.")


@ecs.op("ListServiceDeployments", write=False)
def list_service_deployments(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    row = _service(ctx, cluster, req["service"], "service")
    stmt = select(service_deployments.c.doc).where(service_deployments.c.service_arn == row.arn,
                                                   service_deployments.c.created_at >= row.created_at)
    if req.get("status"):
        stmt = stmt.where(service_deployments.c.status.in_(req["status"]))
    created = req.get("createdAt") or {}
    if created.get("after") is not None:
        stmt = stmt.where(service_deployments.c.created_at >= _epoch(created["after"], "createdAt.after"))
    if created.get("before") is not None:
        stmt = stmt.where(service_deployments.c.created_at <= _epoch(created["before"], "createdAt.before"))
    docs = [json.loads(d) for d in ctx.conn.execute(stmt.order_by(service_deployments.c.created_at.desc(),
                                                                  service_deployments.c.arn)).scalars()]
    chunk, token = page(docs, req, default_max=20)
    keys = ("serviceDeploymentArn", "serviceArn", "clusterArn", "startedAt", "createdAt", "finishedAt", "status",
            "statusReason")
    briefs = [{**{k: d[k] for k in keys if k in d}, "targetServiceRevisionArn": d["targetServiceRevision"]["arn"]}
              for d in chunk]
    return {"serviceDeployments": briefs, **({"nextToken": token} if token else {})}


@ecs.op("DescribeServiceDeployments", write=False)
def describe_service_deployments(ctx: Context, req: dict) -> dict:
    refs = req["serviceDeploymentArns"]
    if len(refs) > MAX_DESCRIBE:
        raise InvalidParameter(f"Invalid parameter 'serviceDeploymentArns': at most {MAX_DESCRIBE} per call.")
    for i, ref in enumerate(refs):
        if arns.parse(ref, f"serviceDeploymentArns[{i}]").resource_type != "service-deployment":
            raise InvalidParameter(f"Invalid parameter 'serviceDeploymentArns[{i}]': '{ref}' is not a service "
                                   "deployment ARN.")
    rows = {r.arn: json.loads(r.doc) for r in ctx.conn.execute(
        select(service_deployments).where(service_deployments.c.arn.in_(refs)))}
    found, failures = [], []
    svc_docs: dict[str, tuple[dict, dict]] = {}
    for ref in refs:
        doc = rows.get(ref)
        if doc is None:
            failures.append(failure(ref, "MISSING"))
            continue
        if doc["serviceArn"] not in svc_docs:
            svc_row = ctx.conn.execute(select(services).where(services.c.arn == doc["serviceArn"])).first()
            svc = json.loads(svc_row.doc) if svc_row else {"deployments": []}
            cluster_name = doc["clusterArn"].rsplit("/", 1)[-1]
            svc_docs[doc["serviceArn"]] = (svc, task_counts(ctx, cluster_name, [svc_row.name]) if svc_row else {})
        svc, counts = svc_docs[doc["serviceArn"]]
        for rev in [doc["targetServiceRevision"], *doc.get("sourceServiceRevisions", [])]:
            dep_id = "ecs-svc/" + rev["arn"].rsplit("/", 1)[-1]
            dep = next((d for d in svc.get("deployments", []) if d["id"] == dep_id), None)
            c = counts.get((svc.get("serviceName"), dep_id), {})
            rev.update(requestedTaskCount=(dep["desiredCount"] if dep and dep["status"] == "PRIMARY"
                                           else c.get("wanted", 0)),
                       runningTaskCount=c.get("running", 0), pendingTaskCount=c.get("pending", 0))
        found.append(doc)
    return {"serviceDeployments": found, "failures": failures}
