"""PutAttributes, ListAttributes, DeleteAttributes on container instances."""

from __future__ import annotations

import json
import re

from sqlalchemy import select

from shoal.api.ecs.common import cluster_row, listing
from shoal.api.ecs.container_instances import instance_row
from shoal.api.operations import Context, dumps, ecs
from shoal.domain.errors import ApiError, InvalidParameter
from shoal.store.db import update_versioned
from shoal.store.tables import container_instances as cis

NAME_RE = re.compile(r"^[a-zA-Z0-9_./\\-]{1,128}$")
VALUE_RE = re.compile(r"^[a-zA-Z0-9_.@/\\: -]{1,128}$")
MAX_CUSTOM = 10
BUILTIN_PREFIX = "ecs."


def _targets(ctx: Context, cluster, attributes: list[dict]) -> dict[str, tuple]:
    """Validate every attribute first (nothing is written unless all are valid).

    Returns {instance ARN: (row, [attributes])}, and sets each attribute's resolved `targetArn`."""
    targets = {}
    for i, attr in enumerate(attributes):
        path = f"attributes[{i}]"
        if not NAME_RE.match(attr["name"]):
            raise InvalidParameter(f"Invalid parameter '{path}.name': 1 to 128 letters, numbers, hyphens, "
                                   "underscores, periods and slashes.")
        value = attr.get("value")
        if value is not None and (not VALUE_RE.match(value) or value != value.strip()):
            raise InvalidParameter(f"Invalid parameter '{path}.value': 1 to 128 letters, numbers, hyphens, "
                                   "underscores, periods, at signs, slashes, colons and inner spaces.")
        if attr.get("targetType", "container-instance") != "container-instance":
            raise InvalidParameter(f"Invalid parameter '{path}.targetType': must be container-instance.")
        if not attr.get("targetId"):
            raise InvalidParameter(f"Missing required parameter '{path}.targetId'.")
        row = instance_row(ctx, cluster, attr["targetId"], f"{path}.targetId", for_update=True)
        if row is None or row.status == "INACTIVE":
            raise ApiError(f"Could not find container instance '{attr['targetId']}' in cluster '{cluster.name}'.",
                           "TargetNotFoundException")
        attr["targetArn"] = row.arn
        targets.setdefault(row.arn, (row, []))[1].append(attr)
    return targets


def _wire(attr: dict, arn: str) -> dict:
    out = {"name": attr["name"], "targetType": "container-instance", "targetId": arn}
    if attr.get("value") is not None:
        out["value"] = attr["value"]
    return out


@ecs.op("PutAttributes")
def put_attributes(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    if len(req["attributes"]) > 10:
        raise InvalidParameter("Invalid parameter 'attributes': at most 10 attributes per call.")
    for i, attr in enumerate(req["attributes"]):
        if attr["name"].startswith(BUILTIN_PREFIX):
            raise InvalidParameter(f"Invalid parameter 'attributes[{i}].name': the 'ecs.' prefix is reserved for "
                                   "built-in attributes.")
    for arn, (row, attrs) in _targets(ctx, cluster, req["attributes"]).items():
        doc = json.loads(row.doc)
        current = {a["name"]: a for a in doc["attributes"]}
        for attr in attrs:
            current[attr["name"]] = {"name": attr["name"], **({"value": attr["value"]} if attr.get("value") else {})}
        if sum(not n.startswith(BUILTIN_PREFIX) for n in current) > MAX_CUSTOM:
            raise ApiError(f"A container instance can have at most {MAX_CUSTOM} custom attributes.",
                           "AttributeLimitExceededException")
        doc["attributes"] = list(current.values())
        update_versioned(ctx.conn, cis, {"arn": arn}, row.version, doc=dumps(doc))
    return {"attributes": [_wire(a, a["targetArn"]) for a in req["attributes"]]}


@ecs.op("DeleteAttributes")
def delete_attributes(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    for i, attr in enumerate(req["attributes"]):
        if attr["name"].startswith(BUILTIN_PREFIX):
            raise InvalidParameter(f"Invalid parameter 'attributes[{i}].name': built-in attributes cannot be deleted.")
    for arn, (row, attrs) in _targets(ctx, cluster, req["attributes"]).items():
        doc = json.loads(row.doc)
        names = {a["name"] for a in attrs}
        doc["attributes"] = [a for a in doc["attributes"] if a["name"] not in names]
        update_versioned(ctx.conn, cis, {"arn": arn}, row.version, doc=dumps(doc))
    return {"attributes": [_wire(a, a["targetArn"]) for a in req["attributes"]]}


@ecs.op("ListAttributes", write=False)
def list_attributes(ctx: Context, req: dict) -> dict:
    cluster = cluster_row(ctx, req.get("cluster"))
    name, value = req.get("attributeName"), req.get("attributeValue")
    if value is not None and name is None:
        raise InvalidParameter("Invalid parameter 'attributeValue': requires 'attributeName'.")
    found = []
    for row in ctx.conn.execute(select(cis.c.arn, cis.c.doc).where(cis.c.cluster_name == cluster.name,
                                                                  cis.c.status != "INACTIVE").order_by(cis.c.id)):
        for attr in json.loads(row.doc)["attributes"]:
            if (name is None or attr["name"] == name) and (value is None or attr.get("value") == value):
                found.append(_wire(attr, row.arn))
    return listing("attributes", found, req)
