"""Alarms over REST (SigV4-signed like the API); see shoal.control.alarms.

  PUT /v1/alarms/<name>   {"state": "ALARM" | "OK" | "INSUFFICIENT_DATA", "reason": "…"}
                          → {"alarm": {...}}; the first set creates the alarm
  GET /v1/alarms          → {"alarms": [{...}, …]}, by name
  GET /v1/alarms/<name>   → {"alarm": {...}}, or 404 ResourceNotFoundException if never set

An alarm is {"name", "state", "reason", "updatedAt", "enteredAlarmAt"} (ISO 8601 times;
enteredAlarmAt is null until it first goes into ALARM).
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shoal.api.operations import Context
from shoal.control import alarms
from shoal.domain.arns import ArnFactory
from shoal.domain.errors import ApiError, InvalidParameter, NotFound
from shoal.store.db import Store


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse({"__type": err.code, "message": err.message}, err.status)


def alarm_routes(store: Store, arns: ArnFactory, authenticate) -> list[Route]:
    def authorised(request: Request, body: bytes) -> None:
        authenticate(request.method, request.url.path, request.url.query,
                     {k.lower(): v for k, v in request.headers.items()}, body)

    async def put_alarm(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            authorised(request, body)
            name = request.path_params["name"]
            state, reason = _request(body)
            alarms.check(name, state, reason)  # before queueing a write that cannot apply
            doc = await store.write(lambda conn: alarms.set_state(Context(conn, arns), name, state, reason))
        except ApiError as err:
            return _error(err)
        return JSONResponse({"alarm": doc})

    async def list_alarms(request: Request) -> JSONResponse:
        try:
            authorised(request, b"")
            found = await store.read(alarms.describe)
        except ApiError as err:
            return _error(err)
        return JSONResponse({"alarms": found})

    async def get_alarm(request: Request) -> JSONResponse:
        name = request.path_params["name"]
        try:
            authorised(request, b"")
            found = await store.read(lambda conn: alarms.describe(conn, name))
            if not found:
                raise NotFound(f"Alarm not found: '{name[:255]}'.", status=404)
        except ApiError as err:
            return _error(err)
        return JSONResponse({"alarm": found[0]})

    return [Route("/v1/alarms", list_alarms, methods=["GET"]),
            Route("/v1/alarms/{name}", get_alarm, methods=["GET"]),
            Route("/v1/alarms/{name}", put_alarm, methods=["PUT"])]


def _request(body: bytes) -> tuple[str, str]:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise InvalidParameter('Invalid request body: expected a JSON object {"state": …, "reason": …}.')
    unknown = sorted(set(doc) - {"state", "reason"})
    if unknown:
        raise InvalidParameter(f"Invalid parameter '{unknown[0]}': unknown; an alarm takes 'state' and 'reason'.")
    if doc.get("state") is None:
        raise InvalidParameter(f"Invalid parameter 'state': required, one of {', '.join(alarms.STATES)}.")
    reason = doc.get("reason")
    return doc["state"], "" if reason is None else reason
