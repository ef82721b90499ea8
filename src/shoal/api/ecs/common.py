"""Helpers shared by the ECS operations: lookups, pagination, tags, names."""

from __future__ import annotations

import base64
import json
import re

from sqlalchemy import bindparam, select

from shoal.api.operations import Context
from shoal.domain import arns
from shoal.domain.errors import ClusterNotFound, InvalidParameter
from shoal.store.prepared import Prepared
from shoal.store.tables import clusters

DEFAULT_CLUSTER = "default"
NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,255}$")
_CLUSTER_SELECT = select(clusters).where(clusters.c.name == bindparam("name"))
_CLUSTER = {
    None: Prepared(_CLUSTER_SELECT),
    # Creating something in the cluster: DeleteCluster (which locks for update) must wait, and
    # concurrent RunTasks must not wait for each other.
    "share": Prepared(_CLUSTER_SELECT.with_for_update(key_share=True)),
    "update": Prepared(_CLUSTER_SELECT.with_for_update()),
}


def check_name(value: str, field: str, what: str) -> str:
    if not NAME_RE.match(value):
        raise InvalidParameter(
            f"Invalid {field} '{value[:64]}{'…' if len(value) > 64 else ''}': a {what} name has 1 to 255 "
            "characters: letters, numbers, hyphens and underscores."
        )
    return value


def cluster_row(ctx: Context, ref: str | None, *, lock: str | None = None):
    """The ACTIVE cluster named by `ref` (name or ARN; default cluster when omitted).

    `lock` (PostgreSQL): "share" while creating something in the cluster, "update" to change it."""
    name = arns.short_name(ref, "cluster", "cluster") if ref else DEFAULT_CLUSTER
    row = _CLUSTER[lock].first(ctx.conn, {"name": name})
    if row is None or row.status != "ACTIVE":
        raise ClusterNotFound(f"Cluster not found: '{ref or DEFAULT_CLUSTER}'.")
    return row


def page(items: list, request: dict, default_max: int = 100, limit: int = 100) -> tuple[list, str | None]:
    """Offset pagination with an opaque token."""
    max_results = request.get("maxResults") or default_max
    if not 1 <= max_results <= limit:
        raise InvalidParameter(f"Invalid parameter 'maxResults': must be between 1 and {limit}.")
    start = 0
    token = request.get("nextToken")
    if token:
        try:
            start = json.loads(base64.urlsafe_b64decode(token.encode()))["o"]
            if not isinstance(start, int) or isinstance(start, bool) or start < 0:
                raise ValueError(start)
        except Exception:
            raise InvalidParameter("Invalid parameter 'nextToken': not a token this API issued.") from None
    chunk = items[start:start + max_results]
    more = start + max_results < len(items)
    next_token = base64.urlsafe_b64encode(json.dumps({"o": start + max_results}).encode()).decode() if more else None
    return chunk, next_token


def check_tags(tags: list[dict], field: str = "tags") -> list[dict]:
    keys = set()
    for i, tag in enumerate(tags):
        key, value = tag.get("key"), tag.get("value", "")
        if not key or len(key) > 128:
            raise InvalidParameter(f"Invalid parameter '{field}[{i}].key': a tag key has 1 to 128 characters.")
        if len(value) > 256:
            raise InvalidParameter(f"Invalid parameter '{field}[{i}].value': a tag value has at most 256 characters.")
        if key.lower().startswith("aws:"):
            raise InvalidParameter(f"Invalid parameter '{field}[{i}].key': the 'aws:' prefix is reserved.")
        if key in keys:
            raise InvalidParameter(f"Invalid parameter '{field}[{i}].key': duplicate tag key '{key}'.")
        keys.add(key)
    return [{"key": t["key"], "value": t.get("value", "")} for t in tags]


def merge_tags(existing: list[dict], new: list[dict]) -> list[dict]:
    merged = {t["key"]: t["value"] for t in existing}
    merged.update({t["key"]: t["value"] for t in new})
    if len(merged) > 50:
        raise InvalidParameter("Invalid parameter 'tags': a resource can have at most 50 tags.")
    return [{"key": k, "value": v} for k, v in merged.items()]


def without_tags(doc: dict, include: list[str] | None) -> dict:
    if include and "TAGS" in include:
        return doc
    return {k: v for k, v in doc.items() if k != "tags"}


def listing(key: str, items: list, request: dict) -> dict:
    """A List* response: one page of `items` under `key`, and the token for the next."""
    chunk, token = page(items, request)
    return {key: chunk, **({"nextToken": token} if token else {})}


def failure(arn: str, reason: str, detail: str | None = None) -> dict:
    f = {"arn": arn, "reason": reason}
    if detail:
        f["detail"] = detail
    return f
