"""RunTask, StartTask, StopTask, DescribeTasks, ListTasks.

Until a host agent exists (a later layer), new tasks wait for capacity: PROVISIONING when a
capacity provider strategy brings them, PENDING otherwise. Each change writes its
"ECS Task State Change" event in the same transaction.
"""

from __future__ import annotations

import functools
import json

from sqlalchemy import bindparam, insert, select

from shoal.api import idempotency
from shoal.api.ecs import capacity_providers as cps
from shoal.api.ecs.common import check_tags, cluster_row, failure, listing, merge_tags, without_tags
from shoal.api.ecs.container_instances import instance_row
from shoal.api.ecs.task_definitions import resolve as resolve_task_definition
from shoal.api.operations import Context, dumps, ecs
from shoal.domain import arns, query
from shoal.domain import tasks as domain
from shoal.domain.errors import InvalidParameter
from shoal.events.changes import emit_task_change, emit_task_changes
from shoal.store.db import update_versioned
from shoal.scheduler.placement import Placer, release, set_pending_reason
from shoal.store.prepared import Prepared
from shoal.store.tables import container_instances, tasks

# Built once: RunTask and DescribeTasks are the hottest calls (see shoal.store.prepared).
INSERT_TASK = Prepared(insert(tasks))


@functools.cache
def _tasks_by_id(count: int) -> Prepared:
    """SELECT … WHERE id IN (:id0, …): one prepared statement per list length (at most 100)."""
    ids = [bindparam(f"id{i}") for i in range(count)]
    return Prepared(select(tasks.c.id, tasks.c.doc).where(tasks.c.cluster_name == bindparam("cluster"),
                                                          tasks.c.id.in_(ids)))


MAX_CONSTRAINTS = 10
MAX_STRATEGIES = 5
SUPPORTED_LAUNCH_TYPES = ("EC2", "EXTERNAL", "MANAGED_INSTANCES")


def check_placement(td: dict, req: dict) -> dict:
    constraints = [*td.get("placementConstraints", []), *req.get("placementConstraints", [])]
    if len(constraints) > MAX_CONSTRAINTS:
        raise InvalidParameter(f"Invalid parameter 'placementConstraints': at most {MAX_CONSTRAINTS} constraints "
                               f"per task, task definition included; got {len(constraints)}.")
    for i, pc in enumerate(req.get("placementConstraints", [])):
        kind, expr = pc.get("type"), pc.get("expression")
        if kind == "memberOf":
            if not expr:
                raise InvalidParameter(f"Missing required parameter 'placementConstraints[{i}].expression' "
                                       "for memberOf.")
            query.parse(expr, f"placementConstraints[{i}].expression")
        elif kind == "distinctInstance" and expr:
            raise InvalidParameter(f"Invalid parameter 'placementConstraints[{i}].expression': distinctInstance "
                                   "takes no expression.")
        elif kind is None:
            raise InvalidParameter(f"Missing required parameter 'placementConstraints[{i}].type'.")
    strategies = req.get("placementStrategy", [])
    if len(strategies) > MAX_STRATEGIES:
        raise InvalidParameter(f"Invalid parameter 'placementStrategy': at most {MAX_STRATEGIES} strategies.")
    for i, ps in enumerate(strategies):
        kind, field = ps.get("type"), ps.get("field")
        if kind == "binpack" and (field or "").lower() not in ("cpu", "memory"):
            raise InvalidParameter(f"Invalid parameter 'placementStrategy[{i}].field': binpack takes cpu or memory.")
        if kind == "spread" and not field:
            raise InvalidParameter(f"Missing required parameter 'placementStrategy[{i}].field' for spread.")
    return {"placementConstraints": constraints, "placementStrategy": strategies}


def launch_settings(ctx: Context, req: dict, cluster) -> tuple[str | None, list[dict]]:
    """The launch type or capacity provider strategy the tasks are placed with."""
    launch_type, strategy = req.get("launchType"), req.get("capacityProviderStrategy")
    if launch_type and strategy:
        raise InvalidParameter("Invalid parameter: 'launchType' and 'capacityProviderStrategy' are mutually exclusive.")
    if launch_type and launch_type not in SUPPORTED_LAUNCH_TYPES:
        raise InvalidParameter(f"Invalid parameter 'launchType': shoal runs {', '.join(SUPPORTED_LAUNCH_TYPES)} "
                               f"tasks, not {launch_type}.")
    cdoc = json.loads(cluster.doc)
    if strategy:
        cps.check_strategy(strategy, cdoc["capacityProviders"], "capacityProviderStrategy")
    elif not launch_type:
        strategy = cdoc["defaultCapacityProviderStrategy"]
        launch_type = None if strategy else "EC2"
    return launch_type, strategy or []


@ecs.op("RunTask")
def run_task(ctx: Context, req: dict) -> dict:
    remembered = idempotency.recall(ctx, "RunTask", req)
    if remembered is not None:
        return _refresh(ctx, remembered)
    cluster = cluster_row(ctx, req.get("cluster"), lock="share")
    count = req.get("count", 1)
    if not 1 <= count <= 10:
        raise InvalidParameter(f"Invalid parameter 'count': must be between 1 and 10, got {count}.")
    td = json.loads(resolve_task_definition(ctx, req["taskDefinition"], active_only=True).doc)
    launch_type, strategy = launch_settings(ctx, req, cluster)
    placement = {**check_placement(td, req), "capacityProviderStrategy": strategy}
    docs = create_tasks(ctx, req, cluster, td, count, launch_type=launch_type, placement=placement,
                         last_status="PROVISIONING" if strategy else "PENDING")
    # What a retry with the same clientToken gets back: the same tasks, as they are by then.
    idempotency.remember(ctx, "RunTask", req, {"taskArns": [d["taskArn"] for d in docs]})
    return {"tasks": docs, "failures": []}


def _refresh(ctx: Context, remembered: dict) -> dict:
    rows = {r.arn: json.loads(r.doc) for r in ctx.conn.execute(
        select(tasks.c.arn, tasks.c.doc).where(tasks.c.arn.in_(remembered["taskArns"])))}
    return {"tasks": [rows[arn] for arn in remembered["taskArns"]], "failures": []}


def _check_common(req: dict) -> None:
    if len(req.get("startedBy") or "") > 128:
        raise InvalidParameter("Invalid parameter 'startedBy': at most 128 characters.")
    if len(req.get("group") or "") > 255:
        raise InvalidParameter("Invalid parameter 'group': at most 255 characters.")


def create_tasks(ctx: Context, req: dict, cluster, td: dict, count: int, *, launch_type, placement,
                  last_status: str, instance_arns: list[str] | None = None,
                 service_name: str | None = None) -> list[dict]:
    _check_common(req)
    overrides = req.get("overrides") or {}
    domain.check_overrides(td, overrides)
    tags = check_tags(req.get("tags", []))
    if req.get("propagateTags") == "TASK_DEFINITION":
        tags = merge_tags(td.get("tags", []), tags)
    docs, rows = [], []
    placer, placement_json = Placer(ctx, cluster.name), dumps(placement)  # one plan for the batch
    for i in range(count):
        task_id = arns.new_id()
        task_arn = ctx.arns.task(cluster.name, task_id)
        container_arns = [ctx.arns.container(cluster.name, task_id, arns.new_id())
                          for _ in td["containerDefinitions"]]
        instance_arn = instance_arns[i] if instance_arns else None
        doc = domain.new_task(
            task_arn=task_arn, cluster_arn=cluster.arn, task_definition=td, container_arns=container_arns,
            overrides=overrides, last_status=last_status, launch_type=launch_type,
            group=req.get("group"), started_by=req.get("startedBy"), tags=tags, now=ctx.now,
            container_instance_arn=instance_arn,
        )
        # Placed now if a host has room (StartTask: the named host), else it waits, with the reason.
        reason = placer.place(doc, placement_json, only=instance_arn)
        if reason is not None:
            if instance_arn:
                raise InvalidParameter(f"Invalid parameter 'containerInstances[{i}]': the task does not fit on "
                                       f"'{instance_arn}' ({reason}).")
            set_pending_reason(doc, reason)
        rows.append(dict(
            arn=task_arn, id=task_id, cluster_name=cluster.name, last_status=doc["lastStatus"],
            desired_status="RUNNING", family=td["family"], started_by=req.get("startedBy"),
            service_name=service_name, launch_type=launch_type, container_instance_arn=doc.get("containerInstanceArn"),
            created_at=ctx.now, version=1, doc=dumps(doc), placement=placement_json))
        docs.append(doc)
    seqs = placer.flush(unwritten=True)  # the hosts first: each new row carries its host's sequence
    for row in rows:
        row["host_seq"] = seqs.get(row["container_instance_arn"])
    # The rows, then their events, in one statement each (the DBAPI's executemany).
    INSERT_TASK.run_many(ctx.conn, rows)
    emit_task_changes(ctx, docs)
    return docs


def _instance_arns(ctx: Context, cluster, refs: list[str], field: str) -> list[str]:
    out = []
    for i, ref in enumerate(refs):
        row = instance_row(ctx, cluster, ref, f"{field}[{i}]", for_update=True)
        if row is None or row.status == "INACTIVE":
            raise InvalidParameter(f"Invalid parameter '{field}[{i}]': container instance '{ref}' was not found "
                                   f"in cluster '{cluster.name}'.")
        if row.status != "ACTIVE":
            raise InvalidParameter(f"Invalid parameter '{field}[{i}]': container instance '{ref}' is {row.status}, "
                                   "not ACTIVE.")
        out.append(row.arn)
    return out


@ecs.op("StartTask")
def start_task(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"), lock="share")
    refs = req["containerInstances"]
    if not 1 <= len(refs) <= 10:
        raise InvalidParameter("Invalid parameter 'containerInstances': give 1 to 10 container instances.")
    td = json.loads(resolve_task_definition(ctx, req["taskDefinition"], active_only=True).doc)
    instance_arns = _instance_arns(ctx, cluster, refs, "containerInstances")
    placement = {"placementConstraints": [], "placementStrategy": [], "capacityProviderStrategy": []}
    docs = create_tasks(ctx, req, cluster, td, len(refs), launch_type="EC2", placement=placement,
                         last_status="PENDING", instance_arns=instance_arns)
    return {"tasks": docs, "failures": []}


def _task_row(ctx: Context, cluster, ref: str, field: str, *, for_update: bool = False):
    task_id = arns.short_name(ref, "task", field)
    stmt = select(tasks).where(tasks.c.id == task_id, tasks.c.cluster_name == cluster.name)
    return ctx.conn.execute(stmt.with_for_update() if for_update else stmt).first()


def _agent_will_stop(ctx: Context, doc: dict) -> bool:
    """Whether a connected agent owns this task, so that stopping it is the agent's job."""
    arn = doc.get("containerInstanceArn")
    if not arn:
        return False
    row = ctx.conn.execute(select(container_instances.c.doc).where(container_instances.c.arn == arn)).first()
    return bool(row and json.loads(row.doc).get("agentConnected"))


@ecs.op("StopTask")
def stop_task(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    reason = req.get("reason") or "Task stopped by user"
    if len(reason) > 255:
        raise InvalidParameter("Invalid parameter 'reason': at most 255 characters.")
    row = _task_row(ctx, cluster, req["task"], "task", for_update=True)
    if row is None:
        raise InvalidParameter(f"The referenced task was not found: '{req['task']}'.")
    doc = json.loads(row.doc)
    if doc["desiredStatus"] == "STOPPED":
        return {"task": without_tags(doc, None)}
    if doc["lastStatus"] in ("PROVISIONING", "PENDING") and not _agent_will_stop(ctx, doc):
        doc = domain.stop_unstarted(doc, reason, "UserInitiated", ctx.now)
        release(ctx, doc.get("containerInstanceArn"), doc["taskArn"])
    else:
        doc.update(desiredStatus="STOPPED", stopCode="UserInitiated", stoppedReason=reason, stoppingAt=ctx.now,
                   version=doc["version"] + 1)
    update_versioned(ctx.conn, tasks, {"arn": row.arn}, row.version, last_status=doc["lastStatus"],
                     desired_status=doc["desiredStatus"], doc=dumps(doc))
    if doc.get("containerInstanceArn"):  # also a task stopped unstarted: an agent may hold it
        ctx.tell_agent(doc["containerInstanceArn"], row.arn)
    emit_task_change(ctx, doc)
    return {"task": without_tags(doc, None)}


@ecs.op("DescribeTasks", write=False)
def describe_tasks(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    refs = req["tasks"]
    if len(refs) > 100:
        raise InvalidParameter("Invalid parameter 'tasks': at most 100 tasks per call.")
    ids = [arns.short_name(r, "task", "tasks") for r in refs]
    unique_ids = sorted(set(ids))
    params = {"cluster": cluster.name, **{f"id{i}": task_id for i, task_id in enumerate(unique_ids)}}
    rows = {r.id: r.doc for r in _tasks_by_id(len(unique_ids)).all(ctx.conn, params)} if unique_ids else {}
    include = req.get("include")
    found, failures = [], []
    for ref, task_id in zip(refs, ids):
        if task_id in rows:
            found.append(without_tags(json.loads(rows[task_id]), include))
        else:
            failures.append(failure(ref if arns.is_arn(ref) else ctx.arns.task(cluster.name, ref), "MISSING"))
    return {"tasks": found, "failures": failures}


@ecs.op("ListTasks", write=False)
def list_tasks(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    stmt = select(tasks.c.arn).where(tasks.c.cluster_name == cluster.name,
                                     tasks.c.desired_status == req.get("desiredStatus", "RUNNING"))
    if req.get("containerInstance"):
        ident = arns.short_name(req["containerInstance"], "container-instance", "containerInstance")
        stmt = stmt.where(tasks.c.container_instance_arn == ctx.arns.container_instance(cluster.name, ident))
    if req.get("family"):
        stmt = stmt.where(tasks.c.family == req["family"])
    if req.get("startedBy"):
        stmt = stmt.where(tasks.c.started_by == req["startedBy"])
    if req.get("serviceName"):
        stmt = stmt.where(tasks.c.service_name == arns.short_name(req["serviceName"], "service", "serviceName"))
    if req.get("launchType"):
        stmt = stmt.where(tasks.c.launch_type == req["launchType"])
    if req.get("daemonName"):
        # Daemon tasks come with managed daemons (a later layer); none exist yet.
        stmt = stmt.where(tasks.c.started_by == f"ecs-daemon/{req['daemonName']}")
    stmt = stmt.order_by(tasks.c.created_at, tasks.c.id)
    return listing("taskArns", ctx.conn.execute(stmt).scalars().all(), req)
