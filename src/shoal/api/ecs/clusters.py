"""CreateCluster, DescribeClusters, ListClusters, DeleteCluster."""

from __future__ import annotations

import json

from sqlalchemy import func, insert, select

from shoal.api.ecs import capacity_providers as cps
from shoal.api.ecs.common import check_name, check_tags, cluster_row, failure, listing
from shoal.api.operations import Context, dumps, ecs
from shoal.domain import arns
from shoal.domain.errors import ApiError, InvalidParameter
from shoal.domain.tasks import PENDING_STATES
from shoal.store.db import update_versioned
from shoal.store.tables import clusters, container_instances, services, tasks

LIVE_INSTANCE_STATES = ("REGISTERING", "ACTIVE", "DRAINING")


@ecs.op("CreateCluster")
def create_cluster(ctx: Context, req: dict) -> dict:
    name = check_name(req.get("clusterName") or "default", "clusterName", "cluster")
    existing = ctx.conn.execute(select(clusters).where(clusters.c.name == name)).first()
    if existing is not None and existing.status == "ACTIVE":
        return {"cluster": _with_counts(ctx, json.loads(existing.doc))}  # ECS: idempotent
    doc = {
        "clusterArn": ctx.arns.cluster(name),
        "clusterName": name,
        "status": "ACTIVE",
        "registeredContainerInstancesCount": 0,
        "runningTasksCount": 0,
        "pendingTasksCount": 0,
        "activeServicesCount": 0,
        "statistics": [],
        "tags": check_tags(req.get("tags", [])),
        "settings": req.get("settings") or [{"name": "containerInsights", "value": "disabled"}],
        "capacityProviders": [],
        "defaultCapacityProviderStrategy": [],
    }
    if req.get("configuration"):
        doc["configuration"] = req["configuration"]
    if req.get("capacityProviders") or req.get("defaultCapacityProviderStrategy"):
        doc.update(cps.cluster_association(ctx, name, req.get("capacityProviders", []),
                                           req.get("defaultCapacityProviderStrategy", [])))
    if existing is None:
        ctx.conn.execute(insert(clusters).values(name=name, arn=doc["clusterArn"], status="ACTIVE",
                                                 version=1, doc=dumps(doc)))
    else:  # re-creating a deleted cluster
        update_versioned(ctx.conn, clusters, {"name": name}, existing.version, status="ACTIVE", doc=dumps(doc))
    return {"cluster": doc}


def _counts(ctx: Context, names: list[str]) -> dict[str, dict[str, int]]:
    counts = {n: {"registeredContainerInstancesCount": 0, "runningTasksCount": 0, "pendingTasksCount": 0,
                  "activeServicesCount": 0} for n in names}
    rows = ctx.conn.execute(
        select(services.c.cluster_name, func.count())
        .where(services.c.cluster_name.in_(names), services.c.status == "ACTIVE")
        .group_by(services.c.cluster_name)
    )
    for cluster, n in rows:
        counts[cluster]["activeServicesCount"] = n
    rows = ctx.conn.execute(
        select(container_instances.c.cluster_name, func.count())
        .where(container_instances.c.cluster_name.in_(names),
               container_instances.c.status.in_(("ACTIVE", "DRAINING")))
        .group_by(container_instances.c.cluster_name)
    )
    for cluster, n in rows:
        counts[cluster]["registeredContainerInstancesCount"] = n
    rows = ctx.conn.execute(
        select(tasks.c.cluster_name, tasks.c.last_status, func.count())
        .where(tasks.c.cluster_name.in_(names), tasks.c.last_status.in_(("RUNNING", *PENDING_STATES)))
        .group_by(tasks.c.cluster_name, tasks.c.last_status)
    )
    for cluster, status, n in rows:
        key = "runningTasksCount" if status == "RUNNING" else "pendingTasksCount"
        counts[cluster][key] += n
    return counts


def _with_counts(ctx: Context, doc: dict) -> dict:
    doc.update(_counts(ctx, [doc["clusterName"]])[doc["clusterName"]])
    return doc


@ecs.op("DescribeClusters", write=False)
def describe_clusters(ctx: Context, req: dict) -> dict:
    refs = req.get("clusters") or ["default"]
    if len(refs) > 100:
        raise InvalidParameter("Invalid parameter 'clusters': at most 100 clusters per call.")
    include = req.get("include") or []
    names = [arns.short_name(r, "cluster", "clusters") for r in refs]
    rows = {r.name: r for r in ctx.conn.execute(select(clusters).where(clusters.c.name.in_(names)))}
    counts = _counts(ctx, [n for n in names if n in rows])
    found, failures = [], []
    for name in names:
        row = rows.get(name)
        if row is None:
            failures.append(failure(ctx.arns.cluster(name), "MISSING"))
            continue
        doc = json.loads(row.doc)
        doc.update(counts[name])
        if "TAGS" not in include:
            doc.pop("tags", None)
        if "STATISTICS" not in include:
            doc["statistics"] = []
        found.append(doc)
    return {"clusters": found, "failures": failures}


@ecs.op("ListClusters", write=False)
def list_clusters(ctx: Context, req: dict) -> dict:
    arns_ = ctx.conn.execute(
        select(clusters.c.arn).where(clusters.c.status == "ACTIVE").order_by(clusters.c.name)
    ).scalars().all()
    return listing("clusterArns", arns_, req)


@ecs.op("DeleteCluster")
def delete_cluster(ctx: Context, req: dict) -> dict:
    row = cluster_row(ctx, req["cluster"], lock="update")
    instances = ctx.conn.execute(
        select(func.count()).where(container_instances.c.cluster_name == row.name,
                                   container_instances.c.status.in_(LIVE_INSTANCE_STATES))
    ).scalar_one()
    if instances:
        raise ApiError("The cluster cannot be deleted while container instances are active or draining.",
                       "ClusterContainsContainerInstancesException")
    live_services = ctx.conn.execute(
        select(func.count()).where(services.c.cluster_name == row.name, services.c.status != "INACTIVE")
    ).scalar_one()
    if live_services:
        raise ApiError("The cluster cannot be deleted while services are active or draining.",
                       "ClusterContainsServicesException")
    live_tasks = ctx.conn.execute(
        select(func.count()).where(tasks.c.cluster_name == row.name, tasks.c.last_status != "STOPPED")
    ).scalar_one()
    if live_tasks:
        raise ApiError("The cluster cannot be deleted while tasks are active.", "ClusterContainsTasksException")
    doc = json.loads(row.doc)
    doc.update(status="INACTIVE", capacityProviders=[], defaultCapacityProviderStrategy=[])
    update_versioned(ctx.conn, clusters, {"name": row.name}, row.version, status="INACTIVE", doc=dumps(doc))
    cps.detach_cluster(ctx, row.name)
    doc.pop("tags", None)
    return {"cluster": doc}
