"""Container instances (hosts): registration, description, listing, draining, deregistration.

Hosts normally register through the shoal agent; RegisterContainerInstance is the same entry
point the ECS agent uses, and is what a host without a shoal agent can call.
"""

from __future__ import annotations

import json
import secrets

from sqlalchemy import func, insert, select

from shoal.api.ecs.common import check_tags, cluster_row, failure, listing, without_tags
from shoal.api.operations import Context, dumps, ecs
from shoal.domain import arns, health, query
from shoal.domain.errors import InvalidParameter
from shoal.domain.tasks import PENDING_STATES
from shoal.events.envelope import (CONTAINER_INSTANCE_HEALTH_CHANGE, CONTAINER_INSTANCE_STATE_CHANGE, event_detail,
                                   iso)
from shoal.scheduler.placement import host_changed
from shoal.store.db import update_versioned
from shoal.store.tables import container_instances as cis, tasks

HEALTH_CHECKS = health.CHECKS
# Internal fields of a host's document, never shown: `_blocked` is why the host takes no new
# application tasks although ACTIVE (a critical daemon is down: shoal.control.daemons);
# `_impairedGpus` the GPUs whose MPS control daemon its agent reports down (no new MPS shares).
_INTERNAL = ("_blocked", "_impairedGpus")


def emit_instance_change(ctx: Context, cluster, doc: dict) -> None:
    detail = event_detail(doc, drop=("tags", "healthStatus", "gpuDevices", *_INTERNAL))
    detail["clusterArn"] = cluster.arn
    detail["updatedAt"] = iso(ctx.now)
    ctx.emit(CONTAINER_INSTANCE_STATE_CHANGE, [doc["containerInstanceArn"]], detail)


def emit_health_change(ctx: Context, cluster, doc: dict) -> None:
    """"ECS Container Instance Health Change": on every transition of a check or of the overall
    status (ecs-semantics §1.10; the event says `healthChecks` where the API says `details`)."""
    hs = doc["healthStatus"]
    checks = [{k: (iso(v) if k in ("lastStatusChange", "lastUpdated") else v) for k, v in d.items()}
              for d in hs["details"]]
    ctx.emit(CONTAINER_INSTANCE_HEALTH_CHANGE, [doc["containerInstanceArn"]], {
        "clusterArn": cluster.arn, "containerInstanceArn": doc["containerInstanceArn"],
        "capacityProviderName": doc.get("capacityProviderName"), "ec2InstanceId": doc.get("ec2InstanceId"),
        "overallStatus": hs["overallStatus"], "healthChecks": checks, "updatedAt": iso(ctx.now)})


def _resource(name: str, kind: str, value) -> dict:
    key = "integerValue" if kind == "INTEGER" else "stringSetValue"
    return {"name": name, "type": kind, key: value}


def _resources(total: list[dict]) -> list[dict]:
    given = {r["name"]: r for r in total}
    out = [
        _resource("CPU", "INTEGER", given.get("CPU", {}).get("integerValue", 0)),
        _resource("MEMORY", "INTEGER", given.get("MEMORY", {}).get("integerValue", 0)),
        _resource("PORTS", "STRINGSET", given.get("PORTS", {}).get("stringSetValue", [])),
        _resource("PORTS_UDP", "STRINGSET", given.get("PORTS_UDP", {}).get("stringSetValue", [])),
    ]
    if "GPU" in given:
        out.append(_resource("GPU", "STRINGSET", given["GPU"].get("stringSetValue", [])))
    return out


initial_health = health.initial


@ecs.op("RegisterContainerInstance")
def register_container_instance(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"), lock="share")
    identity = {}
    if req.get("instanceIdentityDocument"):
        try:
            identity = json.loads(req["instanceIdentityDocument"])
        except ValueError:
            identity = None
        if not isinstance(identity, dict) or not all(isinstance(v, str) for v in identity.values()):
            raise InvalidParameter("Invalid parameter 'instanceIdentityDocument': expected a JSON object of "
                                   "strings (instanceId, instanceType, availabilityZone, architecture).")
    ec2_id = identity.get("instanceId") or "i-" + secrets.token_hex(9)[:17]
    for i, res in enumerate(req.get("totalResources", [])):
        if res.get("name") in ("CPU", "MEMORY") and res.get("integerValue", 0) < 0:
            raise InvalidParameter(f"Invalid parameter 'totalResources[{i}].integerValue': must not be negative.")
    instance_id = arns.new_id()
    arn = ctx.arns.container_instance(cluster.name, instance_id)
    resources = _resources(req.get("totalResources", []))
    attributes = [
        {"name": "ecs.os-type", "value": "linux"},
        {"name": "ecs.cpu-architecture", "value": identity.get("architecture", "x86_64")},
    ]
    if identity.get("instanceType"):
        attributes.append({"name": "ecs.instance-type", "value": identity["instanceType"]})
    if identity.get("availabilityZone"):
        attributes.append({"name": "ecs.availability-zone", "value": identity["availabilityZone"]})
    builtin = {a["name"] for a in attributes}
    attributes += [{"name": a["name"], **({"value": a["value"]} if a.get("value") is not None else {})}
                   for a in req.get("attributes", []) if a["name"] not in builtin]
    gpus = next((r["stringSetValue"] for r in resources if r["name"] == "GPU"), [])
    doc = {
        "containerInstanceArn": arn,
        "ec2InstanceId": ec2_id,
        "version": 1,
        "versionInfo": req.get("versionInfo") or {},
        "remainingResources": resources,
        "registeredResources": resources,
        "status": "ACTIVE",
        "agentConnected": False,
        "runningTasksCount": 0,
        "pendingTasksCount": 0,
        "attributes": attributes,
        "registeredAt": ctx.now,
        "attachments": [],
        "tags": check_tags(req.get("tags", [])),
        "healthStatus": initial_health(ctx.now),
        "gpuDevices": [{"gpuId": g, "sharingMode": "IDLE", "containerCount": 0} for g in gpus],
    }
    ctx.conn.execute(insert(cis).values(arn=arn, id=instance_id, cluster_name=cluster.name, ec2_instance_id=ec2_id,
                                        status="ACTIVE", capacity_provider_name=None, registered_at=ctx.now,
                                        version=1, doc=dumps(doc)))
    emit_instance_change(ctx, cluster, doc)
    return {"containerInstance": without_tags(doc, None)}


def instance_row(ctx: Context, cluster, ref: str, field: str, *, for_update: bool = False):
    """A container instance by id, ARN or ec2InstanceId."""
    ident = arns.short_name(ref, "container-instance", field)
    stmt = select(cis).where(cis.c.cluster_name == cluster.name, (cis.c.id == ident) | (cis.c.ec2_instance_id == ident))
    # One EC2 instance may have registered several times: prefer the exact id, then the live
    # registration, then the latest.
    stmt = stmt.order_by((cis.c.id == ident).desc(), (cis.c.status == "INACTIVE").asc(), cis.c.registered_at.desc())
    return ctx.conn.execute(stmt.with_for_update() if for_update else stmt).first()


def _live_counts(ctx: Context, arns_: list[str]) -> dict[str, dict[str, int]]:
    counts = {a: {"runningTasksCount": 0, "pendingTasksCount": 0} for a in arns_}
    rows = ctx.conn.execute(
        select(tasks.c.container_instance_arn, tasks.c.last_status, func.count())
        .where(tasks.c.container_instance_arn.in_(arns_), tasks.c.last_status.in_((*PENDING_STATES, "RUNNING")))
        .group_by(tasks.c.container_instance_arn, tasks.c.last_status))
    for arn, status, n in rows:
        counts[arn]["runningTasksCount" if status == "RUNNING" else "pendingTasksCount"] += n
    return counts


def _public(doc: dict, include: list[str] | None) -> dict:
    doc = {k: v for k, v in without_tags(doc, include).items() if k not in _INTERNAL}
    if not include or "CONTAINER_INSTANCE_HEALTH" not in include:
        doc.pop("healthStatus", None)
    return doc


@ecs.op("DescribeContainerInstances", write=False)
def describe_container_instances(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    refs = req["containerInstances"]
    if len(refs) > 100:
        raise InvalidParameter("Invalid parameter 'containerInstances': at most 100 per call.")
    found, failures = [], []
    for i, ref in enumerate(refs):
        row = instance_row(ctx, cluster, ref, f"containerInstances[{i}]")
        if row is None:
            failures.append(failure(ref if arns.is_arn(ref) else ctx.arns.container_instance(cluster.name, ref),
                                    "MISSING"))
        else:
            found.append(json.loads(row.doc))
    counts = _live_counts(ctx, [d["containerInstanceArn"] for d in found])
    for doc in found:
        doc.update(counts[doc["containerInstanceArn"]])
    return {"containerInstances": [_public(d, req.get("include")) for d in found], "failures": failures}


def host_view(doc: dict, task_groups: tuple[str, ...], running: int) -> query.Host:
    return query.Host(
        attributes={a["name"]: a.get("value") for a in doc.get("attributes", [])},
        agent_connected=doc.get("agentConnected", False),
        agent_version=(doc.get("versionInfo") or {}).get("agentVersion"),
        ec2_instance_id=doc["ec2InstanceId"],
        registered_at=doc.get("registeredAt"),
        running_tasks_count=running,
        task_groups=task_groups,
    )


@ecs.op("ListContainerInstances", write=False)
def list_container_instances(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    stmt = select(cis.c.arn, cis.c.doc).where(cis.c.cluster_name == cluster.name)
    if req.get("status"):
        stmt = stmt.where(cis.c.status == req["status"])
    else:
        stmt = stmt.where(cis.c.status != "INACTIVE")
    rows = ctx.conn.execute(stmt.order_by(cis.c.registered_at, cis.c.id)).all()
    if req.get("filter"):
        expr = query.parse(req["filter"], "filter")
        groups: dict[str, list[str]] = {}
        running: dict[str, int] = {}
        for arn, doc, status in ctx.conn.execute(
                select(tasks.c.container_instance_arn, tasks.c.doc, tasks.c.last_status)
                .where(tasks.c.cluster_name == cluster.name, tasks.c.desired_status == "RUNNING",
                       tasks.c.container_instance_arn.is_not(None))):
            groups.setdefault(arn, []).append(json.loads(doc)["group"])
            running[arn] = running.get(arn, 0) + (status == "RUNNING")
        rows = [r for r in rows if expr.matches(host_view(json.loads(r.doc), tuple(groups.get(r.arn, ())),
                                                          running.get(r.arn, 0)))]
    return listing("containerInstanceArns", [r.arn for r in rows], req)


@ecs.op("UpdateContainerInstancesState")
def update_container_instances_state(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    status = req["status"]
    if status not in ("ACTIVE", "DRAINING"):
        raise InvalidParameter(f"Invalid parameter 'status': a container instance can be set to ACTIVE or "
                               f"DRAINING, not {status}.")
    refs = req["containerInstances"]
    if len(refs) > 10:
        raise InvalidParameter("Invalid parameter 'containerInstances': at most 10 per call.")
    updated, failures = [], []
    for i, ref in enumerate(refs):
        row = instance_row(ctx, cluster, ref, f"containerInstances[{i}]", for_update=True)
        if row is None or row.status == "INACTIVE":
            failures.append(failure(ref, "MISSING"))
            continue
        doc = json.loads(row.doc)
        if row.status not in ("ACTIVE", "DRAINING"):
            failures.append(failure(row.arn, f"container instance is {row.status}",
                                    "Only ACTIVE and DRAINING instances can change state."))
            continue
        if row.status != status:
            doc = set_state(ctx, cluster, row, status)
        updated.append(_public(doc, None))
    return {"containerInstances": updated, "failures": failures}


def set_state(ctx: Context, cluster, row, status: str) -> dict:
    """Make an ACTIVE host DRAINING (or a DRAINING one ACTIVE again); its row is locked. Returns
    its new document."""
    doc = json.loads(row.doc)
    doc.update(status=status, version=doc["version"] + 1)
    update_versioned(ctx.conn, cis, {"arn": row.arn}, row.version, status=status, doc=dumps(doc))
    emit_instance_change(ctx, cluster, doc)
    ctx.tell_agent(row.arn)
    host_changed(ctx, cluster.name, row.arn)
    ctx.dirty_daemons.add(cluster.name)  # daemons stop last on a drained host
    if status == "DRAINING":
        _reschedule_services(ctx, cluster.name, row.arn)
    else:
        ctx.dirty_clusters.add(cluster.name)  # room again for waiting tasks
    return doc


def _reschedule_services(ctx: Context, cluster_name: str, host_arn: str) -> None:
    """The services with tasks on this host must look again: on a DRAINING host each service
    task is replaced first (a new task placed elsewhere and healthy), then stopped, within the
    service's minimumHealthyPercent and maximumPercent (shoal.control.services); on a
    deregistered host its tasks are replaced at once. Standalone tasks run on until they end, and
    nothing new lands on the host."""
    names = ctx.conn.execute(select(tasks.c.service_name).distinct().where(
        tasks.c.container_instance_arn == host_arn, tasks.c.service_name.is_not(None),
        tasks.c.last_status != "STOPPED")).scalars()
    ctx.dirty_services |= {(cluster_name, name) for name in names}


@ecs.op("DeregisterContainerInstance")
def deregister_container_instance(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    row = instance_row(ctx, cluster, req["containerInstance"], "containerInstance", for_update=True)
    if row is None or row.status == "INACTIVE":
        raise InvalidParameter(f"Invalid parameter 'containerInstance': '{req['containerInstance']}' is not a "
                               f"registered container instance of cluster '{cluster.name}'.")
    live = ctx.conn.execute(select(func.count()).where(tasks.c.container_instance_arn == row.arn,
                                                       tasks.c.last_status != "STOPPED")).scalar_one()
    if live and not req.get("force"):
        raise InvalidParameter(f"The container instance has {live} task(s) that have not stopped; stop them first "
                               "or deregister with force.")
    doc = json.loads(row.doc)
    doc.update(status="INACTIVE", agentConnected=False, version=doc["version"] + 1)
    update_versioned(ctx.conn, cis, {"arn": row.arn}, row.version, status="INACTIVE", doc=dumps(doc))
    emit_instance_change(ctx, cluster, doc)
    ctx.tell_agent(row.arn)  # its agent learns it has left the cluster
    _reschedule_services(ctx, cluster.name, row.arn)
    return {"containerInstance": _public(doc, None)}
