"""Durable queues over REST: what `queue:<name>` targets and dead-letter configs fill, read with
acknowledgements (SigV4-signed like the API).

  GET  /v1/queues/<name>/messages?max=10&visibility=30   receive up to `max` messages; each is
       hidden for `visibility` seconds and comes back unless acknowledged with its receipt
  POST /v1/queues/<name>/ack   {"receipts": ["…", …]}   delete them
"""

from __future__ import annotations

import json
import re
import secrets
import time

from sqlalchemy import delete, select, update
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shoal.domain.errors import ApiError
from shoal.store.db import Store
from shoal.store.tables import queue_messages as messages

NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
MAX_RECEIVE = 100


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse({"__type": err.code, "message": err.message}, err.status)


def _bad(message: str) -> ApiError:
    return ApiError(message, "InvalidParameterException")


def receive(conn, queue: str, limit: int, visibility: float) -> list[dict]:
    now = time.time()
    rows = conn.execute(select(messages).where(messages.c.queue == queue, messages.c.visible_at <= now)
                        .order_by(messages.c.id).limit(limit)).all()
    out = []
    for row in rows:
        receipt = secrets.token_urlsafe(16)
        taken = conn.execute(update(messages).where(messages.c.id == row.id, messages.c.visible_at == row.visible_at)
                             .values(visible_at=now + visibility, receipt=receipt,
                                     receive_count=row.receive_count + 1)).rowcount
        if taken:  # another reader did not get there first
            out.append({"messageId": str(row.id), "eventId": row.event_id, "receipt": receipt,
                        "body": row.body, "attributes": json.loads(row.attributes),
                        "receiveCount": row.receive_count + 1, "sentAt": row.created_at})
    return out


def queue_routes(store: Store, authenticate) -> list[Route]:
    async def authorised(request: Request, body: bytes) -> str:
        authenticate(request.method, request.url.path, request.url.query,
                     {k.lower(): v for k, v in request.headers.items()}, body)
        name = request.path_params["name"]
        if not NAME.match(name):
            raise _bad("Invalid queue name: 1 to 80 letters, digits, '-' or '_'.")
        return name

    async def get_messages(request: Request) -> JSONResponse:
        try:
            queue = await authorised(request, b"")
            try:
                limit = int(request.query_params.get("max", "10"))
                visibility = float(request.query_params.get("visibility", "30"))
                if not 1 <= limit <= MAX_RECEIVE or not 0 <= visibility <= 43200:
                    raise ValueError
            except ValueError:
                raise _bad(f"Invalid parameter: 'max' is 1 to {MAX_RECEIVE}, 'visibility' 0 to 43200 seconds.") \
                    from None
            found = await store.write(lambda conn: receive(conn, queue, limit, visibility))
        except ApiError as err:
            return _error(err)
        return JSONResponse({"messages": found})

    async def ack(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            queue = await authorised(request, body)
            try:
                receipts = json.loads(body)["receipts"]
                if not isinstance(receipts, list) or not all(isinstance(r, str) for r in receipts):
                    raise ValueError
            except (ValueError, KeyError, TypeError):
                raise _bad("Invalid parameter 'receipts': expected {\"receipts\": [receipt, …]}.") from None
            deleted = await store.write(lambda conn: conn.execute(delete(messages).where(
                messages.c.queue == queue, messages.c.receipt.in_(receipts))).rowcount)
        except ApiError as err:
            return _error(err)
        return JSONResponse({"acknowledged": deleted})

    return [Route("/v1/queues/{name}/messages", get_messages, methods=["GET"]),
            Route("/v1/queues/{name}/ack", ack, methods=["POST"])]
