"""Chaos orders over REST (SigV4-signed like the API); see shoal.control.chaos.

  POST /v1/chaos        {"cluster", "host", "action": "mps" | "xid" | "daemon", "mode", "gpu",
                         "xid", "daemon", "kill", "really"}  → {"order": {...}} (status PENDING)
  GET  /v1/chaos/<id>   → {"order": {...}}: PENDING until the host's agent reports DONE or FAILED
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shoal import jsonio
from shoal.control import chaos
from shoal.domain.errors import ApiError, InvalidParameter


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse({"__type": err.code, "message": err.message}, err.status)


def chaos_routes(hub, authenticate) -> list[Route]:
    def authorised(request: Request, body: bytes) -> None:
        authenticate(request.method, request.url.path, request.url.query,
                     {k.lower(): v for k, v in request.headers.items()}, body)

    async def create(request: Request) -> JSONResponse:
        raw = await request.body()
        try:
            authorised(request, raw)
            try:
                body = jsonio.loads(raw or b"{}")
            except ValueError:
                body = None
            if not isinstance(body, dict):
                raise InvalidParameter("Invalid request body: expected a JSON object (a chaos order).")
            order = await hub.write(lambda ctx: chaos.request(ctx, body))
        except ApiError as err:
            return _error(err)
        return JSONResponse({"order": order})

    async def get(request: Request) -> JSONResponse:
        try:
            authorised(request, b"")
            order = await hub.store.read(lambda conn: chaos.describe(conn, request.path_params["order_id"]))
        except ApiError as err:
            return _error(err)
        return JSONResponse({"order": order})

    return [Route("/v1/chaos", create, methods=["POST"]),
            Route("/v1/chaos/{order_id}", get, methods=["GET"])]
