"""The AWS JSON 1.1 protocol: `POST /` with `X-Amz-Target: <prefix>.<Operation>`.

One request: authenticate (SigV4), find the operation, parse and validate the body against
botocore's model, run the handler in a store transaction, and answer with the result or with
`{"__type": <error shape>, "message": …}` so that botocore raises the matching exception.
"""

from __future__ import annotations

import json
import logging
import uuid

from starlette.requests import Request
from starlette.responses import Response

from shoal.api.operations import Context, Registry
from shoal.api.protocol import sigv4
from shoal.api.protocol.validation import service_model, validate
from shoal.domain.errors import ApiError, ServerError, UnknownOperation
from shoal.store.db import Store

log = logging.getLogger(__name__)
CONTENT_TYPE = "application/x-amz-json-1.1"


def _respond(status: int, body: dict, request_id: str) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status_code=status, media_type=CONTENT_TYPE,
                    headers={"x-amzn-RequestId": request_id})


def error_response(err: ApiError, request_id: str) -> Response:
    return _respond(err.status, {"__type": err.code, "message": err.message}, request_id)


def _without_nulls(value):
    """A JSON null member means the member is absent, as in AWS; handlers then see one form."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


class AwsJsonEndpoint:
    def __init__(self, store: Store, registries: list[Registry], *, arns, credentials: dict[str, str] | None):
        self.store = store
        self.arns = arns
        self.credentials = credentials  # None: authentication disabled (--insecure-no-auth)
        self.registries = {r.target_prefix: r for r in registries}

    async def handle(self, request: Request) -> Response:
        request_id = str(uuid.uuid4())
        try:
            body = await request.body()
            self.authenticate(request, body)
            return _respond(200, await self._dispatch(request.headers.get("x-amz-target", ""), body), request_id)
        except ApiError as err:
            return error_response(err, request_id)
        except Exception:
            log.exception("internal error in request %s", request_id)
            return error_response(ServerError("Internal server error; see the server log."), request_id)

    def authenticate(self, request: Request, body: bytes) -> None:
        if self.credentials is not None:
            sigv4.verify(request.method, request.url.path, request.url.query,
                         {k.lower(): v for k, v in request.headers.items()}, body, self.credentials)

    async def _dispatch(self, target: str, body: bytes) -> dict:
        prefix, _, name = target.partition(".")
        registry = self.registries.get(prefix)
        operation = registry.operations.get(name) if registry else None
        if operation is None:
            raise UnknownOperation(f"Unknown operation '{target}'.", code="UnknownOperationException")
        try:
            params = _without_nulls(json.loads(body)) if body.strip() else {}
        except (ValueError, RecursionError):
            raise ApiError("The request body is not valid JSON.", "SerializationException") from None
        validate(service_model(registry.service).operation_model(name), params)

        def unit_of_work(conn):
            return operation.handler(Context(conn, self.arns), params)

        if operation.write:
            return await self.store.write(unit_of_work)
        return await self.store.read(unit_of_work)
