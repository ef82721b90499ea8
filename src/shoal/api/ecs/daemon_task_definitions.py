"""Daemon task definitions: RegisterDaemonTaskDefinition, DescribeDaemonTaskDefinition,
ListDaemonTaskDefinitions, DeleteDaemonTaskDefinition.

Families and revisions like ordinary task definitions, in their own ARN space
(`daemon-task-definition/<family>:<revision>`). A deleted revision is DELETE_IN_PROGRESS while a
daemon still runs it, and DELETED once none does; either way it stays describable (the
`daemon_task_definition_deleted` waiter expects DELETED from DescribeDaemonTaskDefinition).
"""

from __future__ import annotations

import json

from sqlalchemy import func, insert, select, update

from shoal.api.ecs.common import check_tags, page
from shoal.api.operations import Context, dumps, ecs
from shoal.api.protocol.validation import service_model
from shoal.domain import arns
from shoal.domain import daemons as domain
from shoal.domain.errors import ClientError, InvalidParameter
from shoal.store.tables import daemon_task_definitions as dtds, daemons

REGISTERED_BY = "shoal"
# What a daemon container may say: the members of botocore's DaemonContainerDefinition. Anything
# else (portMappings, resourceRequirements: no GPUs for daemon tasks) is ignored, as AWS ignores
# unknown members, so that it never reaches a host.
CONTAINER_FIELDS = frozenset(service_model("ecs").shape_for("DaemonContainerDefinition").members)


def _public(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "tags"}


@ecs.op("RegisterDaemonTaskDefinition")
def register_daemon_task_definition(ctx: Context, req: dict) -> dict:
    containers = [{k: v for k, v in c.items() if k in CONTAINER_FIELDS} for c in req["containerDefinitions"]]
    doc = domain.validate_task_definition({**req, "containerDefinitions": containers})
    # Again after validation: the task definition rules add defaults of their own (portMappings).
    doc["containerDefinitions"] = [{k: v for k, v in c.items() if k in CONTAINER_FIELDS}
                                   for c in doc["containerDefinitions"]]
    tags = check_tags(req.get("tags", []))
    family = doc["family"]
    # Revisions are never removed, so the next one is the highest plus one; two registrations
    # racing for it meet at the unique constraint, and the loser's unit of work runs again.
    last = ctx.conn.execute(select(func.max(dtds.c.revision)).where(dtds.c.family == family)).scalar()
    revision = (last or 0) + 1
    arn = ctx.arns.daemon_task_definition(family, revision)
    doc = {"daemonTaskDefinitionArn": arn, **doc, "revision": revision, "registeredAt": ctx.now,
           "registeredBy": REGISTERED_BY}
    ctx.conn.execute(insert(dtds).values(arn=arn, family=family, revision=revision, status="ACTIVE",
                                         registered_at=ctx.now, doc=dumps({**doc, "tags": tags})))
    return {"daemonTaskDefinitionArn": arn}


def resolve(ctx: Context, ref: str, field: str = "daemonTaskDefinition", *, active_only: bool = False,
            for_update: bool = False):
    """`family` (its latest ACTIVE revision), `family:revision`, or a full ARN."""
    family, _, rev = arns.short_name(ref, "daemon-task-definition", field).partition(":")
    if rev and not (rev.isdigit() and len(rev) <= 9):
        raise InvalidParameter(f"Invalid parameter '{field}': revision '{rev}' is not a revision number.")
    stmt = select(dtds).where(dtds.c.family == family)
    if rev:
        stmt = stmt.where(dtds.c.revision == int(rev))
    else:
        stmt = stmt.where(dtds.c.status == "ACTIVE").order_by(dtds.c.revision.desc()).limit(1)
    row = ctx.conn.execute(stmt.with_for_update() if for_update else stmt).first()
    if row is None or (active_only and row.status != "ACTIVE"):
        raise ClientError(f"Invalid parameter '{field}': daemon task definition '{ref}' does not exist"
                          + (" or is not ACTIVE." if active_only else "."))
    return row


@ecs.op("DescribeDaemonTaskDefinition", write=False)
def describe_daemon_task_definition(ctx: Context, req: dict) -> dict:
    return {"daemonTaskDefinition": _public(json.loads(resolve(ctx, req["daemonTaskDefinition"]).doc))}


@ecs.op("ListDaemonTaskDefinitions", write=False)
def list_daemon_task_definitions(ctx: Context, req: dict) -> dict:
    stmt = select(dtds.c.arn, dtds.c.family, dtds.c.status, dtds.c.registered_at, dtds.c.delete_requested_at)
    status = req.get("status", "ACTIVE")
    if status != "ALL":
        stmt = stmt.where(dtds.c.status == status)
    if req.get("family"):
        stmt = stmt.where(dtds.c.family == req["family"])
    if req.get("familyPrefix"):
        stmt = stmt.where(dtds.c.family.startswith(req["familyPrefix"], autoescape=True))
    desc = req.get("sort") == "DESC"
    rows = ctx.conn.execute(stmt.order_by(dtds.c.family.desc() if desc else dtds.c.family,
                                          dtds.c.revision.desc() if desc else dtds.c.revision)).all()
    if req.get("revision") == "LAST_REGISTERED":  # the highest revision of each family that is listed
        latest = {}
        for row in rows:
            if desc:
                latest.setdefault(row.family, row)
            else:
                latest[row.family] = row
        rows = [r for r in rows if latest[r.family] is r]
    summaries = []
    for r in rows:
        summary = {"arn": r.arn, "registeredAt": r.registered_at, "registeredBy": REGISTERED_BY, "status": r.status}
        if r.delete_requested_at is not None:
            summary["deleteRequestedAt"] = r.delete_requested_at
        summaries.append(summary)
    chunk, token = page(summaries, req)
    return {"daemonTaskDefinitions": chunk, **({"nextToken": token} if token else {})}


@ecs.op("DeleteDaemonTaskDefinition")
def delete_daemon_task_definition(ctx: Context, req: dict) -> dict:
    ref = req["daemonTaskDefinition"]
    if ":" not in arns.short_name(ref, "daemon-task-definition", "daemonTaskDefinition"):
        raise InvalidParameter("Invalid parameter 'daemonTaskDefinition': give 'family:revision' or a full ARN.")
    row = resolve(ctx, ref, for_update=True)
    if row.status != "ACTIVE":
        raise ClientError(f"Invalid parameter 'daemonTaskDefinition': daemon task definition '{row.arn}' is "
                          f"{row.status}; only an ACTIVE one can be deleted.")
    doc = json.loads(row.doc)
    doc.update(status="DELETE_IN_PROGRESS", deleteRequestedAt=ctx.now)
    ctx.conn.execute(update(dtds).where(dtds.c.arn == row.arn).values(
        status="DELETE_IN_PROGRESS", delete_requested_at=ctx.now, doc=dumps(doc)))
    settle(ctx, [row.arn])
    return {"daemonTaskDefinitionArn": row.arn}


def settle(ctx: Context, arns_: list[str]) -> None:
    """Mark DELETED each of these DELETE_IN_PROGRESS definitions that no daemon runs any more.
    Called when a definition is deleted and whenever a daemon stops using one (UpdateDaemon to
    another definition, a daemon removed for good)."""
    if not arns_:
        return
    used = set(ctx.conn.execute(select(daemons.c.task_definition_arn).where(
        daemons.c.task_definition_arn.in_(arns_))).scalars())
    for row in ctx.conn.execute(select(dtds).where(dtds.c.arn.in_(arns_), dtds.c.status == "DELETE_IN_PROGRESS")
                                .with_for_update()).all():
        if row.arn in used:
            continue
        doc = json.loads(row.doc)
        doc["status"] = "DELETED"
        ctx.conn.execute(update(dtds).where(dtds.c.arn == row.arn).values(status="DELETED", doc=dumps(doc)))
