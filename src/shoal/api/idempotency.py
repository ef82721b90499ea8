"""clientToken idempotency: the same token with the same request returns the first answer;
the same token with a different request is a conflict."""

from __future__ import annotations

import hashlib
import json

from sqlalchemy import bindparam, insert, select

from shoal.api.operations import Context, dumps
from shoal.domain.errors import Conflict, InvalidParameter
from shoal.store.prepared import Prepared
from shoal.store.tables import idempotency

MAX_TOKEN = 64
# botocore fills clientToken in on every RunTask, so these run on the hot path: prebuilt.
_FIND = Prepared(select(idempotency).where(idempotency.c.scope == bindparam("scope")))
_INSERT = Prepared(insert(idempotency))


def _scope(operation: str, token: str) -> str:
    if len(token) > MAX_TOKEN:
        raise InvalidParameter(f"Invalid parameter 'clientToken': at most {MAX_TOKEN} characters.")
    return f"{operation}:{token}"


def _hash(request: dict) -> str:
    body = {k: v for k, v in request.items() if k != "clientToken"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def recall(ctx: Context, operation: str, request: dict) -> dict | None:
    token = request.get("clientToken")
    if not token:
        return None
    row = _FIND.first(ctx.conn, {"scope": _scope(operation, token)})
    if row is None:
        return None
    if row.request_hash != _hash(request):
        raise Conflict(f"The clientToken '{token}' was already used with different parameters.")
    return json.loads(row.response)


def remember(ctx: Context, operation: str, request: dict, response: dict) -> None:
    token = request.get("clientToken")
    if token:
        _INSERT.run(ctx.conn, {"scope": _scope(operation, token), "request_hash": _hash(request),
                                   "response": dumps(response), "created_at": ctx.now})
