"""The action log over REST (SigV4-signed like the API):

  GET /v1/action-logs?cluster=C[&daemon=D][&since=T][&after=ID][&limit=N]
      → {"entries": [...], "next": ID | null}

Entries come oldest first (shoal.events.action_log). `since` is an ISO 8601 time or epoch
seconds; `next`, when not null, is the `after` that gets the following page.
"""

from __future__ import annotations

from sqlalchemy import select
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shoal.domain import arns
from shoal.domain.errors import ApiError, ClusterNotFound, InvalidParameter
from shoal.events import action_log
from shoal.store.db import Store
from shoal.store.tables import clusters


def action_log_routes(store: Store, authenticate) -> list[Route]:
    async def list_entries(request: Request) -> JSONResponse:
        try:
            authenticate(request.method, request.url.path, request.url.query,
                         {k.lower(): v for k, v in request.headers.items()}, b"")
            ref, params = _params(request.query_params)
            entries, next_id = await store.read(lambda conn: _page(conn, ref, **params))
        except ApiError as err:
            return JSONResponse({"__type": err.code, "message": err.message}, err.status)
        return JSONResponse({"entries": entries, "next": next_id})

    return [Route("/v1/action-logs", list_entries, methods=["GET"])]


def _params(query) -> tuple[str, dict]:
    ref = query.get("cluster")
    if not ref:
        raise InvalidParameter("Invalid parameter 'cluster': required (a cluster name or ARN).")
    params: dict = {"cluster": arns.short_name(ref, "cluster", "cluster")}
    if query.get("daemon") is not None:
        daemon = arns.short_name(query["daemon"], "daemon", "daemon")
        if not 1 <= len(daemon) <= 255:
            raise InvalidParameter("Invalid parameter 'daemon': a daemon name or ARN.")
        params["daemon"] = daemon
    if query.get("since") is not None:
        try:
            params["since"] = action_log.parse_time(query["since"])
        except ValueError:
            raise InvalidParameter("Invalid parameter 'since': an ISO 8601 time or epoch seconds.") from None
    params["after_id"] = _integer(query, "after", 0, 2 ** 63 - 1)
    params["limit"] = _integer(query, "limit", 1, action_log.MAX_PAGE) or action_log.DEFAULT_PAGE
    return ref, params


def _integer(query, name: str, low: int, high: int) -> int | None:
    if query.get(name) is None:
        return None
    try:
        value = int(query[name])
        if not low <= value <= high:
            raise ValueError
    except ValueError:
        raise InvalidParameter(f"Invalid parameter '{name}': an integer from {low} to {high}.") from None
    return value


def _page(conn, ref: str, cluster: str, **params):
    # A deleted (INACTIVE) cluster keeps its row, and its log stays readable.
    if conn.execute(select(clusters.c.name).where(clusters.c.name == cluster)).first() is None:
        raise ClusterNotFound(f"Cluster not found: '{ref}'.")
    return action_log.page(conn, cluster, **params)
