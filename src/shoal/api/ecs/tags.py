"""TagResource, UntagResource, ListTagsForResource for every taggable resource."""

from __future__ import annotations

import json

from sqlalchemy import select, update

from shoal.api.ecs.common import check_tags, merge_tags
from shoal.api.operations import Context, dumps, ecs
from shoal.domain import arns
from shoal.domain.errors import InvalidParameter, NotFound
from shoal.store.tables import (
    capacity_providers, clusters, container_instances, daemon_task_definitions, daemons, services, task_definitions,
    tasks,
)

_TABLES = {
    "cluster": clusters,
    "capacity-provider": capacity_providers,
    "task-definition": task_definitions,
    "task": tasks,
    "container-instance": container_instances,
    "service": services,
    "daemon": daemons,
    "daemon-task-definition": daemon_task_definitions,
}


def _row(ctx: Context, resource_arn: str, *, for_update: bool = False):
    arn = arns.parse(resource_arn, "resourceArn")
    table = _TABLES.get(arn.resource_type)
    if table is None:
        raise InvalidParameter(f"Invalid parameter 'resourceArn': resources of type '{arn.resource_type}' "
                               "cannot be tagged.")
    stmt = select(table).where(table.c.arn == resource_arn)
    row = ctx.conn.execute(stmt.with_for_update() if for_update else stmt).first()
    if row is None or getattr(row, "status", None) in ("INACTIVE", "DELETE_IN_PROGRESS", "DELETED"):
        raise NotFound(f"The specified resource could not be found: '{resource_arn}'.")
    return table, row


def _save(ctx: Context, table, row, doc: dict) -> None:
    values = {"doc": dumps(doc)}
    if "version" in table.c:  # writers that check versions must see that the row changed
        values["version"] = table.c.version + 1
    ctx.conn.execute(update(table).where(table.c.arn == row.arn).values(**values))


@ecs.op("TagResource")
def tag_resource(ctx: Context, req: dict) -> dict:
    table, row = _row(ctx, req["resourceArn"], for_update=True)
    doc = json.loads(row.doc)
    doc["tags"] = merge_tags(doc.get("tags", []), check_tags(req["tags"]))
    _save(ctx, table, row, doc)
    return {}


@ecs.op("UntagResource")
def untag_resource(ctx: Context, req: dict) -> dict:
    table, row = _row(ctx, req["resourceArn"], for_update=True)
    doc = json.loads(row.doc)
    doc["tags"] = [t for t in doc.get("tags", []) if t["key"] not in set(req["tagKeys"])]
    _save(ctx, table, row, doc)
    return {}


@ecs.op("ListTagsForResource", write=False)
def list_tags_for_resource(ctx: Context, req: dict) -> dict:
    _, row = _row(ctx, req["resourceArn"])
    return {"tags": json.loads(row.doc).get("tags", [])}
