"""Capacity providers and their association with clusters.

A `managedInstancesProvider` is *managed* capacity: shoal owns the hosts' lifecycle and repairs
them (`autoRepairConfiguration.actionsStatus` defaults to ENABLED). An `autoScalingGroupProvider`
is *self-managed*: hosts join on their own and shoal never launches or terminates them.
"""

from __future__ import annotations

import json

from sqlalchemy import delete, func, insert, select

from shoal.api.ecs.common import check_name, check_tags, cluster_row, failure, page
from shoal.api.operations import Context, dumps, ecs
from shoal.domain import arns
from shoal.domain.errors import ClientError, InvalidParameter, ResourceInUse
from shoal.store.db import update_versioned
from shoal.store.tables import capacity_providers, clusters, container_instances

MANAGED, SELF_MANAGED = "MANAGED_INSTANCES", "EC2_AUTOSCALING"
RESERVED_PREFIXES = ("aws", "ecs", "fargate")


def _managed_section(config: dict) -> dict:
    section = dict(config)
    section.setdefault("propagateTags", "NONE")
    repair = dict(section.get("autoRepairConfiguration") or {})
    repair.setdefault("actionsStatus", "ENABLED")
    section["autoRepairConfiguration"] = repair
    return section


@ecs.op("CreateCapacityProvider")
def create_capacity_provider(ctx: Context, req: dict) -> dict:
    name = check_name(req["name"], "name", "capacity provider")
    if name.lower().startswith(RESERVED_PREFIXES):
        raise InvalidParameter(f"Invalid parameter 'name': a capacity provider name cannot start with "
                               f"{', '.join(RESERVED_PREFIXES)}.")
    asg, managed = req.get("autoScalingGroupProvider"), req.get("managedInstancesProvider")
    if bool(asg) == bool(managed):
        raise InvalidParameter("Exactly one of 'autoScalingGroupProvider' or 'managedInstancesProvider' "
                               "must be specified.")
    cluster = None
    if managed:
        if not req.get("cluster"):
            raise InvalidParameter("Missing required parameter 'cluster': a capacity provider with a "
                                   "managedInstancesProvider belongs to one cluster.")
        cluster = cluster_row(ctx, req["cluster"], lock="update")
    previous = ctx.conn.execute(
        select(capacity_providers.c.status).where(capacity_providers.c.name == name)).first()
    if previous is not None and previous.status != "INACTIVE":
        raise ClientError(f"A capacity provider named '{name}' already exists.")
    if previous is not None:  # the name of a deleted provider may be reused
        ctx.conn.execute(delete(capacity_providers).where(capacity_providers.c.name == name))
    doc = {
        "capacityProviderArn": ctx.arns.capacity_provider(name),
        "name": name,
        "status": "ACTIVE",
        "type": MANAGED if managed else SELF_MANAGED,
        "updateStatus": "CREATE_COMPLETE",
        "tags": check_tags(req.get("tags", [])),
    }
    if managed:
        doc["cluster"] = cluster.name
        doc["managedInstancesProvider"] = _managed_section(managed)
    else:
        doc["autoScalingGroupProvider"] = {"managedTerminationProtection": "DISABLED",
                                           "managedDraining": "ENABLED", **asg}
    ctx.conn.execute(insert(capacity_providers).values(
        name=name, arn=doc["capacityProviderArn"], status="ACTIVE", kind=doc["type"],
        cluster_name=cluster.name if cluster else None, version=1, doc=dumps(doc)))
    if cluster is not None:  # a managed provider is part of its cluster from the start
        cdoc = json.loads(cluster.doc)
        cdoc["capacityProviders"] = [*cdoc["capacityProviders"], name]
        update_versioned(ctx.conn, clusters, {"name": cluster.name}, cluster.version, doc=dumps(cdoc))
    return {"capacityProvider": doc}


def _provider_row(ctx: Context, ref: str, field: str, *, for_update: bool = False):
    name = arns.short_name(ref, "capacity-provider", field)
    stmt = select(capacity_providers).where(capacity_providers.c.name == name)
    row = ctx.conn.execute(stmt.with_for_update() if for_update else stmt).first()
    if row is None or row.status == "INACTIVE":
        raise ClientError(f"The specified capacity provider '{ref}' does not exist.")
    return row


@ecs.op("DescribeCapacityProviders", write=False)
def describe_capacity_providers(ctx: Context, req: dict) -> dict:
    include_tags = "TAGS" in (req.get("include") or [])
    stmt = select(capacity_providers).order_by(capacity_providers.c.name)
    if req.get("cluster"):
        stmt = stmt.where(capacity_providers.c.cluster_name == cluster_row(ctx, req["cluster"]).name)
    rows = {r.name: r for r in ctx.conn.execute(stmt)}
    found, failures = [], []
    refs = req.get("capacityProviders")
    if refs:
        for ref in refs:
            row = rows.get(arns.short_name(ref, "capacity-provider", "capacityProviders"))
            if row is None:
                failures.append(failure(ref, "MISSING"))
            else:
                found.append(json.loads(row.doc))
        chunk, token = found, None
    else:
        chunk, token = page([json.loads(r.doc) for r in rows.values() if r.status != "INACTIVE"], req, 10, 10)
    if not include_tags:
        chunk = [{k: v for k, v in d.items() if k != "tags"} for d in chunk]
    out = {"capacityProviders": chunk, "failures": failures}
    if token:
        out["nextToken"] = token
    return out


@ecs.op("UpdateCapacityProvider")
def update_capacity_provider(ctx: Context, req: dict) -> dict:
    row = _provider_row(ctx, req["name"], "name", for_update=True)
    doc = json.loads(row.doc)
    asg, managed = req.get("autoScalingGroupProvider"), req.get("managedInstancesProvider")
    if bool(asg) == bool(managed):
        raise InvalidParameter("Exactly one of 'autoScalingGroupProvider' or 'managedInstancesProvider' "
                               "must be specified.")
    if managed and row.kind != MANAGED or asg and row.kind != SELF_MANAGED:
        raise InvalidParameter(f"Capacity provider '{row.name}' is of type {row.kind}; its type cannot change.")
    if managed:
        doc["managedInstancesProvider"] = _managed_section({**doc["managedInstancesProvider"], **managed})
    else:
        doc["autoScalingGroupProvider"] = {**doc["autoScalingGroupProvider"], **asg}
    doc["updateStatus"] = "UPDATE_COMPLETE"
    update_versioned(ctx.conn, capacity_providers, {"name": row.name}, row.version, doc=dumps(doc))
    return {"capacityProvider": {k: v for k, v in doc.items() if k != "tags"}}


@ecs.op("DeleteCapacityProvider")
def delete_capacity_provider(ctx: Context, req: dict) -> dict:
    row = _provider_row(ctx, req["capacityProvider"], "capacityProvider", for_update=True)
    active = ctx.conn.execute(select(clusters).where(clusters.c.status == "ACTIVE").with_for_update()).all()
    for cluster in active:
        strategy = json.loads(cluster.doc)["defaultCapacityProviderStrategy"]
        if any(item["capacityProvider"] == row.name for item in strategy):
            raise ClientError(f"Capacity provider '{row.name}' is in the default strategy of cluster "
                              f"'{cluster.name}'; remove it with PutClusterCapacityProviders first.")
    _check_no_hosts(ctx, row.name)
    doc = json.loads(row.doc)
    doc.update(status="INACTIVE", updateStatus="DELETE_COMPLETE")
    update_versioned(ctx.conn, capacity_providers, {"name": row.name}, row.version, status="INACTIVE",
                     doc=dumps(doc))
    for cluster in active:
        cdoc = json.loads(cluster.doc)
        if row.name in cdoc["capacityProviders"]:
            cdoc["capacityProviders"] = [n for n in cdoc["capacityProviders"] if n != row.name]
            update_versioned(ctx.conn, clusters, {"name": cluster.name}, cluster.version, doc=dumps(cdoc))
    return {"capacityProvider": {k: v for k, v in doc.items() if k != "tags"}}


def _check_no_hosts(ctx: Context, provider: str, cluster: str | None = None) -> None:
    stmt = select(func.count()).where(container_instances.c.capacity_provider_name == provider,
                                      container_instances.c.status.in_(("REGISTERING", "ACTIVE", "DRAINING")))
    if cluster:
        stmt = stmt.where(container_instances.c.cluster_name == cluster)
    if ctx.conn.execute(stmt).scalar_one():
        raise ResourceInUse(f"Capacity provider '{provider}' still has registered container instances.")


def cluster_association(ctx: Context, cluster: str, refs: list[str], strategy: list[dict]) -> dict:
    """Validate a cluster's capacity providers and default strategy; return them in stored form."""
    names = [arns.short_name(n, "capacity-provider", f"capacityProviders[{i}]") for i, n in enumerate(refs)]
    if len(set(names)) != len(names):
        raise InvalidParameter("Invalid parameter 'capacityProviders': duplicate capacity provider.")
    for i, name in enumerate(names):
        row = _provider_row(ctx, name, f"capacityProviders[{i}]", for_update=True)  # not deleted meanwhile
        if row.cluster_name and row.cluster_name != cluster:
            raise InvalidParameter(f"Capacity provider '{name}' belongs to cluster '{row.cluster_name}'.")
    check_strategy(strategy, names, "defaultCapacityProviderStrategy")
    return {"capacityProviders": names, "defaultCapacityProviderStrategy": [
        {"capacityProvider": s["capacityProvider"], "weight": s.get("weight", 0), "base": s.get("base", 0)}
        for s in strategy]}


def check_strategy(strategy: list[dict], allowed: list[str], field: str) -> None:
    seen = set()
    with_base = 0
    for i, item in enumerate(strategy):
        name = item["capacityProvider"]
        if name not in allowed:
            raise InvalidParameter(f"Invalid parameter '{field}[{i}].capacityProvider': '{name}' is not "
                                   "associated with the cluster.")
        if name in seen:
            raise InvalidParameter(f"Invalid parameter '{field}': capacity provider '{name}' appears twice.")
        seen.add(name)
        with_base += 1 if item.get("base", 0) > 0 else 0
    if with_base > 1:
        raise InvalidParameter(f"Invalid parameter '{field}': only one capacity provider can have a base.")
    if strategy and not any(item.get("weight", 0) > 0 for item in strategy):
        raise InvalidParameter(f"Invalid parameter '{field}': at least one capacity provider needs a weight above 0.")


@ecs.op("PutClusterCapacityProviders")
def put_cluster_capacity_providers(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req["cluster"], lock="update")
    doc = json.loads(cluster.doc)
    association = cluster_association(ctx, cluster.name, req["capacityProviders"],
                                      req["defaultCapacityProviderStrategy"])
    for removed in set(doc["capacityProviders"]) - set(association["capacityProviders"]):
        _check_no_hosts(ctx, removed, cluster.name)
    doc.update(association)
    update_versioned(ctx.conn, clusters, {"name": cluster.name}, cluster.version, doc=dumps(doc))
    return {"cluster": {k: v for k, v in doc.items() if k != "tags"}}


def detach_cluster(ctx: Context, cluster: str) -> None:
    """A deleted cluster takes its managed capacity providers with it."""
    for row in ctx.conn.execute(select(capacity_providers).where(
            capacity_providers.c.cluster_name == cluster, capacity_providers.c.status != "INACTIVE").with_for_update()):
        doc = json.loads(row.doc)
        doc.update(status="INACTIVE", updateStatus="DELETE_COMPLETE")
        update_versioned(ctx.conn, capacity_providers, {"name": row.name}, row.version,
                         status="INACTIVE", doc=dumps(doc))

