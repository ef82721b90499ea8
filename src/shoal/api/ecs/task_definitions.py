"""Task definitions: revisions per family, deregistration and deletion."""

from __future__ import annotations

import json

from sqlalchemy import bindparam, case, func, insert, select, update

from shoal.api.ecs.common import check_tags, failure, listing
from shoal.api.operations import Context, dumps, ecs
from shoal.domain import arns, task_definitions
from shoal.domain.errors import ClientError, InvalidParameter
from shoal.store.db import StaleWrite
from shoal.store.prepared import Prepared
from shoal.store.tables import task_definition_families, task_definitions as tds


_BY_REVISION = select(tds).where(tds.c.family == bindparam("family"), tds.c.revision == bindparam("revision"))
_LATEST_ACTIVE = (select(tds).where(tds.c.family == bindparam("family"), tds.c.status == "ACTIVE")
                  .order_by(tds.c.revision.desc()).limit(1))
_RESOLVE = {(by_revision, lock): Prepared(stmt.with_for_update() if lock else stmt)
            for by_revision, stmt in ((True, _BY_REVISION), (False, _LATEST_ACTIVE)) for lock in (True, False)}


def _next_revision(ctx: Context, family: str) -> int:
    row = ctx.conn.execute(
        select(task_definition_families.c.last_revision)
        .where(task_definition_families.c.family == family).with_for_update()
    ).first()
    if row is None:
        # A concurrent first registration of the same family hits the primary key and the unit
        # of work is retried, then finds the row.
        ctx.conn.execute(insert(task_definition_families).values(family=family, last_revision=1))
        return 1
    revision = row.last_revision + 1
    done = ctx.conn.execute(
        update(task_definition_families)
        .where(task_definition_families.c.family == family,
               task_definition_families.c.last_revision == row.last_revision)
        .values(last_revision=revision)
    )
    if done.rowcount != 1:
        raise StaleWrite(f"family {family}")
    return revision


@ecs.op("RegisterTaskDefinition")
def register_task_definition(ctx: Context, req: dict) -> dict:
    doc = task_definitions.validate(req)
    tags = check_tags(req.get("tags", []))
    revision = _next_revision(ctx, req["family"])
    arn = ctx.arns.task_definition(req["family"], revision)
    doc.update(taskDefinitionArn=arn, revision=revision, registeredAt=ctx.now, registeredBy="shoal")
    stored = {**doc, "tags": tags}
    ctx.conn.execute(insert(tds).values(arn=arn, family=req["family"], revision=revision, status="ACTIVE",
                                        doc=dumps(stored)))
    return {"taskDefinition": doc, "tags": tags}


def resolve(ctx: Context, ref: str, field: str = "taskDefinition", *, active_only: bool = False,
            for_update: bool = False):
    """`family` (latest ACTIVE revision), `family:revision`, or a full ARN."""
    family, _, rev = arns.short_name(ref, "task-definition", field).partition(":")
    if rev and not (rev.isdigit() and len(rev) <= 9):
        raise InvalidParameter(f"Invalid parameter '{field}': revision '{rev}' is not a revision number.")
    params = {"family": family, "revision": int(rev)} if rev else {"family": family}
    row = _RESOLVE[bool(rev), for_update].first(ctx.conn, params)
    if row is None or row.status == "DELETE_IN_PROGRESS" or (active_only and row.status != "ACTIVE"):
        raise ClientError(f"Unable to describe task definition '{ref}': it does not exist"
                          + (" or is not ACTIVE." if active_only else "."))
    return row


@ecs.op("DescribeTaskDefinition", write=False)
def describe_task_definition(ctx: Context, req: dict) -> dict:
    doc = json.loads(resolve(ctx, req["taskDefinition"]).doc)
    tags = doc.pop("tags", [])
    out = {"taskDefinition": doc}
    if "TAGS" in (req.get("include") or []):
        out["tags"] = tags
    return out


@ecs.op("ListTaskDefinitions", write=False)
def list_task_definitions(ctx: Context, req: dict) -> dict:
    stmt = select(tds.c.arn).where(tds.c.status == req.get("status", "ACTIVE"))
    if req.get("familyPrefix"):
        stmt = stmt.where(tds.c.family == req["familyPrefix"])  # ECS: the full family name
    desc = req.get("sort") == "DESC"
    stmt = stmt.order_by(tds.c.family.desc() if desc else tds.c.family,
                         tds.c.revision.desc() if desc else tds.c.revision)
    return listing("taskDefinitionArns", ctx.conn.execute(stmt).scalars().all(), req)


@ecs.op("ListTaskDefinitionFamilies", write=False)
def list_task_definition_families(ctx: Context, req: dict) -> dict:
    active = func.sum(case((tds.c.status == "ACTIVE", 1), else_=0))
    stmt = select(tds.c.family).where(tds.c.status != "DELETE_IN_PROGRESS").group_by(tds.c.family)
    status = req.get("status", "ACTIVE")
    if status == "ACTIVE":
        stmt = stmt.having(active > 0)
    elif status == "INACTIVE":
        stmt = stmt.having(active == 0)
    if req.get("familyPrefix"):
        stmt = stmt.where(tds.c.family.startswith(req["familyPrefix"], autoescape=True))
    return listing("families", ctx.conn.execute(stmt.order_by(tds.c.family)).scalars().all(), req)


@ecs.op("DeregisterTaskDefinition")
def deregister_task_definition(ctx: Context, req: dict) -> dict:
    ref = req["taskDefinition"]
    if ":" not in arns.short_name(ref, "task-definition", "taskDefinition"):
        raise InvalidParameter("Invalid parameter 'taskDefinition': give 'family:revision' or a full ARN.")
    row = resolve(ctx, ref, for_update=True)
    doc = json.loads(row.doc)
    if row.status == "ACTIVE":
        doc.update(status="INACTIVE", deregisteredAt=ctx.now)
        ctx.conn.execute(update(tds).where(tds.c.arn == row.arn).values(status="INACTIVE", doc=dumps(doc)))
    doc.pop("tags", None)
    return {"taskDefinition": doc}


@ecs.op("DeleteTaskDefinitions")
def delete_task_definitions(ctx: Context, req: dict) -> dict:
    refs = req["taskDefinitions"]
    if not 1 <= len(refs) <= 10:
        raise InvalidParameter("Invalid parameter 'taskDefinitions': give 1 to 10 task definitions.")
    deleted, failures = [], []
    for ref in refs:
        try:
            row = resolve(ctx, ref, for_update=True)
        except ClientError:
            failures.append(failure(ref, "The specified task definition does not exist."))
            continue
        if row.status != "INACTIVE":
            failures.append(failure(row.arn, "The specified task definition is still in ACTIVE status. "
                                             "Deregister the target and try again."))
            continue
        doc = json.loads(row.doc)
        doc.update(status="DELETE_IN_PROGRESS", deleteRequestedAt=ctx.now)
        ctx.conn.execute(update(tds).where(tds.c.arn == row.arn).values(status="DELETE_IN_PROGRESS",
                                                                        doc=dumps(doc)))
        doc.pop("tags", None)
        deleted.append(doc)
    return {"taskDefinitions": deleted, "failures": failures}
