"""REST extras beside the AWS protocol: the event log and a health probe."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from shoal.domain.errors import ApiError
from shoal.events import outbox
from shoal.store.db import Store

MAX_PAGE = 1000


def events_endpoint(store: Store, authenticate):
    async def list_events(request: Request) -> JSONResponse:
        """GET /v1/events?after=<cursor>&limit=N: events in commit order, with the cursor to resume from."""
        try:
            authenticate(request.method, request.url.path, request.url.query,
                         {k.lower(): v for k, v in request.headers.items()}, b"")
        except ApiError as err:
            return JSONResponse({"__type": err.code, "message": err.message}, err.status)
        try:
            limit = int(request.query_params.get("limit", "100"))
            if not 1 <= limit <= MAX_PAGE:
                raise ValueError
        except ValueError:
            return JSONResponse({"__type": "InvalidParameterException",
                                 "message": f"Invalid parameter 'limit': an integer from 1 to {MAX_PAGE}."}, 400)
        after = request.query_params.get("after")
        try:
            events, cursor = await store.read(lambda conn: _page(conn, after, limit))
        except ApiError as err:
            return JSONResponse({"__type": err.code, "message": err.message}, err.status)
        return JSONResponse({"events": events, "cursor": cursor})

    return list_events


def _page(conn, after: str | None, limit: int):
    if after and "." not in after:  # an event id: resume right after that event
        after = outbox.cursor_of_event(conn, after)
    return outbox.read(conn, after, limit)


async def healthz(_request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})
