"""CreateService, UpdateService, DeleteService, DescribeServices, ListServices (REPLICA services).

These calls record what is wanted and start deployments; the service scheduler
(shoal.control.services) runs right after their commit and does the work: starting, replacing
and stopping tasks. Managed daemons (one task per host) are their own API, so DAEMON services
are refused.
"""

from __future__ import annotations

import json

from sqlalchemy import delete, false, insert, select

from shoal.api import idempotency
from shoal.api.ecs import service_deployments as deployments
from shoal.api.ecs.common import check_name, check_tags, cluster_row, failure, page, without_tags
from shoal.api.ecs.task_definitions import resolve as resolve_task_definition
from shoal.api.ecs.tasks import check_placement, launch_settings
from shoal.api.operations import Context, dumps, ecs
from shoal.domain import arns
from shoal.domain import services as domain
from shoal.domain.errors import ApiError, InvalidParameter
from shoal.events import services as events
from shoal.store.db import update_versioned
from shoal.store.tables import service_deployments, services

MAX_DESCRIBE = 10
MAX_NAME = 255 - len("service:")
# Features of the Service shape that shoal has nothing behind: refused rather than ignored.
UNSUPPORTED = ("loadBalancers", "serviceRegistries", "vpcLatticeConfigurations", "volumeConfigurations",
               "gatewayConnectors")


def not_active(svc_name: str, status: str) -> ApiError:
    return ApiError(f"Service '{svc_name}' is {status}, not ACTIVE.", "ServiceNotActiveException")


def service_row(ctx: Context, cluster, ref: str, field: str = "service", *, for_update: bool = False):
    name = arns.short_name(ref, "service", field)
    stmt = select(services).where(services.c.cluster_name == cluster.name, services.c.name == name)
    return ctx.conn.execute(stmt.with_for_update() if for_update else stmt).first()


def _check_unsupported(req: dict) -> None:
    for key in UNSUPPORTED:
        if req.get(key):
            raise InvalidParameter(f"Invalid parameter '{key}': shoal does not support {key} for services.")
    if (req.get("serviceConnectConfiguration") or {}).get("enabled"):
        raise InvalidParameter("Invalid parameter 'serviceConnectConfiguration.enabled': shoal does not support "
                               "Service Connect.")
    controller = (req.get("deploymentController") or {}).get("type", "ECS")
    if controller != "ECS":
        raise InvalidParameter(f"Invalid parameter 'deploymentController.type': shoal runs the ECS (rolling "
                               f"update) deployment controller, not {controller}.")


def _check_grace(req: dict) -> None:
    grace = req.get("healthCheckGracePeriodSeconds")
    if grace is not None and not 0 <= grace <= 2147483647:
        raise InvalidParameter("Invalid parameter 'healthCheckGracePeriodSeconds': must be between 0 and "
                               "2147483647.")


def _placement(td: dict, constraints: list, strategy: list) -> tuple[list, list]:
    """Validate a service's placement (the task definition's constraints count towards the limit)."""
    check_placement(td, {"placementConstraints": constraints, "placementStrategy": strategy})
    return constraints, strategy


def _launch(ctx: Context, req: dict, cluster) -> dict:
    launch_type, strategy = launch_settings(ctx, req, cluster)
    return {"capacityProviderStrategy": strategy} if strategy else {"launchType": launch_type}


@ecs.op("CreateService")
def create_service(ctx: Context, req: dict) -> dict:
    remembered = idempotency.recall(ctx, "CreateService", req)
    if remembered is not None:
        row = ctx.conn.execute(select(services).where(services.c.arn == remembered["serviceArn"])).first()
        return {"service": _described(ctx, row.cluster_name, [json.loads(row.doc)])[0]}
    cluster = cluster_row(ctx, req.get("cluster"), lock="share")
    name = check_name(req["serviceName"], "serviceName", "service")
    if len(name) > MAX_NAME:
        raise InvalidParameter(f"Invalid serviceName: at most {MAX_NAME} characters, so that its tasks' group "
                               f"'service:<name>' fits in 255.")
    if req.get("schedulingStrategy", "REPLICA") == "DAEMON":
        raise InvalidParameter("Invalid parameter 'schedulingStrategy': shoal runs one task per host with managed "
                               "daemons (CreateDaemon), not DAEMON services.")
    _check_unsupported(req)
    _check_grace(req)
    if not req.get("taskDefinition"):
        raise InvalidParameter("Invalid parameter 'taskDefinition': required for a service with the ECS "
                               "deployment controller.")
    if req.get("desiredCount") is None:
        raise InvalidParameter("Invalid parameter 'desiredCount': required for a REPLICA service.")
    desired = domain.check_desired_count(req["desiredCount"])
    td_row = resolve_task_definition(ctx, req["taskDefinition"], active_only=True)
    td = json.loads(td_row.doc)
    constraints, strategy = _placement(td, req.get("placementConstraints", []), req.get("placementStrategy", []))
    config = domain.deployment_configuration(req.get("deploymentConfiguration"))
    launch = _launch(ctx, req, cluster)
    tags = check_tags(req.get("tags", []))
    arn = ctx.arns.service(cluster.name, name)
    existing = ctx.conn.execute(select(services).where(services.c.arn == arn).with_for_update()).first()
    if existing is not None and existing.status != "INACTIVE":
        raise InvalidParameter(f"Creation of service was not idempotent: service '{name}' already exists in "
                               f"cluster '{cluster.name}' ({existing.status}).")
    svc = {
        "serviceArn": arn, "serviceName": name, "clusterArn": cluster.arn, "loadBalancers": [],
        "serviceRegistries": [], "status": "ACTIVE", "desiredCount": desired, "runningCount": 0, "pendingCount": 0,
        **launch, "taskDefinition": td_row.arn, "deploymentConfiguration": config, "deployments": [],
        "events": [], "createdAt": ctx.now, "placementConstraints": constraints, "placementStrategy": strategy,
        "schedulingStrategy": "REPLICA", "deploymentController": {"type": "ECS"}, "tags": tags,
        "enableECSManagedTags": bool(req.get("enableECSManagedTags")), "propagateTags": req.get("propagateTags", "NONE"),
        "enableExecuteCommand": bool(req.get("enableExecuteCommand")),
    }
    for key in ("networkConfiguration", "healthCheckGracePeriodSeconds", "availabilityZoneRebalancing", "role"):
        if req.get(key) is not None:
            svc["roleArn" if key == "role" else key] = req[key]
    state = {"deployments": {}, "lastCompleted": None, "placementFailure": False, "steady": False}
    if existing is not None:  # the name of an INACTIVE service is free again: its history goes with it
        ctx.conn.execute(delete(service_deployments).where(service_deployments.c.service_arn == arn))
        ctx.conn.execute(delete(services).where(services.c.arn == arn))
    deployments.start(ctx, svc, state, task_definition=td_row.arn,
                      reason=f"ECS deployment for service {name} in progress.")
    ctx.conn.execute(insert(services).values(
        arn=arn, name=name, cluster_name=cluster.name, status="ACTIVE", launch_type=svc.get("launchType"),
        scheduling_strategy="REPLICA", created_at=ctx.now, version=1, doc=dumps(svc), state=dumps(state)))
    ctx.dirty_services.add((cluster.name, name))
    idempotency.remember(ctx, "CreateService", req, {"serviceArn": arn})
    return {"service": _described(ctx, cluster.name, [svc])[0]}


# What tasks are launched with: a change to any of these starts a new deployment.
_DEPLOYED = ("taskDefinition", "launchType", "capacityProviderStrategy", "placementConstraints",
             "placementStrategy", "networkConfiguration")


def _active_service(ctx: Context, cluster, ref: str):
    """The service's row, locked, for UpdateService and DeleteService: it must be ACTIVE."""
    row = service_row(ctx, cluster, ref, for_update=True)
    if row is None:
        raise deployments.service_not_found(ref)
    if row.status != "ACTIVE":
        raise not_active(row.name, row.status)
    return row


@ecs.op("UpdateService")
def update_service(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    row = _active_service(ctx, cluster, req["service"])
    _check_unsupported(req)
    _check_grace(req)
    svc, state = json.loads(row.doc), json.loads(row.state)
    before = {k: svc.get(k) for k in _DEPLOYED}
    td_arn = svc["taskDefinition"]
    if req.get("taskDefinition"):
        td_arn = resolve_task_definition(ctx, req["taskDefinition"], active_only=True).arn
    td = json.loads(resolve_task_definition(ctx, td_arn).doc)
    constraints, strategy = _placement(td, req.get("placementConstraints", svc["placementConstraints"]),
                                       req.get("placementStrategy", svc["placementStrategy"]))
    config = domain.deployment_configuration(req.get("deploymentConfiguration"), svc["deploymentConfiguration"])
    desired = svc["desiredCount"]
    if req.get("desiredCount") is not None:
        desired = domain.check_desired_count(req["desiredCount"])
    if "capacityProviderStrategy" in req:
        for key in ("launchType", "capacityProviderStrategy"):
            svc.pop(key, None)
        svc.update(_launch(ctx, {"capacityProviderStrategy": req["capacityProviderStrategy"]} if
                           req["capacityProviderStrategy"] else {}, cluster))
    svc.update(taskDefinition=td_arn, placementConstraints=constraints, placementStrategy=strategy,
               deploymentConfiguration=config)
    for key in ("networkConfiguration", "healthCheckGracePeriodSeconds", "availabilityZoneRebalancing",
                "propagateTags"):
        if req.get(key) is not None:
            svc[key] = req[key]
    for key in ("enableECSManagedTags", "enableExecuteCommand"):
        if req.get(key) is not None:
            svc[key] = bool(req[key])
    if desired != svc["desiredCount"]:
        svc["desiredCount"] = desired
        state["steady"] = False
        events.service_action(ctx, svc, "SERVICE_DESIRED_COUNT_UPDATED", desiredCount=desired)
        for d in svc["deployments"]:
            if d["status"] == "PRIMARY":
                d.update(desiredCount=desired, updatedAt=ctx.now)
    if req.get("forceNewDeployment") or {k: svc.get(k) for k in _DEPLOYED} != before:
        deployments.start(ctx, svc, state, task_definition=td_arn,
                          reason=f"ECS deployment for service {row.name} in progress.")
    update_versioned(ctx.conn, services, {"arn": row.arn}, row.version, launch_type=svc.get("launchType"),
                     doc=dumps(svc), state=dumps(state))
    ctx.dirty_services.add((cluster.name, row.name))
    return {"service": _described(ctx, cluster.name, [svc])[0]}


@ecs.op("DeleteService")
def delete_service(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    row = _active_service(ctx, cluster, req["service"])
    svc, state = json.loads(row.doc), json.loads(row.state)
    if svc["desiredCount"] > 0 and not req.get("force"):
        raise InvalidParameter(f"The service cannot be stopped while it is scaled above 0 (desiredCount "
                               f"{svc['desiredCount']}); update it to 0 first, or delete it with force.")
    # DRAINING: the scheduler stops its tasks, then marks it INACTIVE once none runs.
    svc.update(status="DRAINING", desiredCount=0)
    for d in svc["deployments"]:
        if d["status"] == "PRIMARY":
            d.update(desiredCount=0, updatedAt=ctx.now)
        sd = state["deployments"].get(d["id"], {}).get("serviceDeployment")
        if sd:
            deployments.finish(ctx, sd, "STOPPED", "The service was deleted.")
    update_versioned(ctx.conn, services, {"arn": row.arn}, row.version, status="DRAINING", doc=dumps(svc),
                     state=dumps(state))
    ctx.dirty_services.add((cluster.name, row.name))
    return {"service": _described(ctx, cluster.name, [svc])[0]}


def _described(ctx: Context, cluster_name: str, docs: list[dict], include: list[str] | None = None) -> list[dict]:
    counts = deployments.task_counts(ctx, cluster_name, [d["serviceName"] for d in docs])
    return [without_tags(deployments.with_counts(d, counts), include) for d in docs]


@ecs.op("DescribeServices", write=False)
def describe_services(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    refs = req["services"]
    if not 1 <= len(refs) <= MAX_DESCRIBE:
        raise InvalidParameter(f"Invalid parameter 'services': give 1 to {MAX_DESCRIBE} services per call.")
    names = [arns.short_name(r, "service", f"services[{i}]") for i, r in enumerate(refs)]
    rows = {r.name: json.loads(r.doc) for r in ctx.conn.execute(
        select(services.c.name, services.c.doc).where(services.c.cluster_name == cluster.name,
                                                      services.c.name.in_(names)))}
    found, failures = [], []
    for ref, name in zip(refs, names):
        if name in rows:
            found.append(rows[name])
        else:
            failures.append(failure(ref if arns.is_arn(ref) else ctx.arns.service(cluster.name, ref), "MISSING"))
    return {"services": _described(ctx, cluster.name, found, req.get("include")), "failures": failures}


@ecs.op("ListServices", write=False)
def list_services(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    # DRAINING and INACTIVE services are not listed (ECS); DescribeServices still shows them.
    stmt = select(services.c.arn).where(services.c.cluster_name == cluster.name, services.c.status == "ACTIVE")
    if req.get("launchType"):
        stmt = stmt.where(services.c.launch_type == req["launchType"])
    if req.get("schedulingStrategy"):
        stmt = stmt.where(services.c.scheduling_strategy == req["schedulingStrategy"])
    if req.get("resourceManagementType") == "ECS":
        stmt = stmt.where(false())  # every service here is the customer's
    items = ctx.conn.execute(stmt.order_by(services.c.created_at, services.c.name)).scalars().all()
    chunk, token = page(items, req, default_max=10)
    return {"serviceArns": chunk, **({"nextToken": token} if token else {})}
