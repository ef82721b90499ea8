"""The AWS JSON 1.1 protocol: `POST /` with `X-Amz-Target: <prefix>.<Operation>`.

One request: authenticate (SigV4), find the operation, parse and validate the body against
botocore's model, run the handler in a store transaction, and answer with the result or with
`{"__type": <error shape>, "message": …}` so that botocore raises the matching exception.
"""

from __future__ import annotations

import json

import logging

from shoal import jsonio
from shoal.api.operations import Registry, run_unit
from shoal.api.protocol import sigv4
from shoal.api.protocol.validation import service_model, validate
from shoal.domain.arns import new_uuid
from shoal.domain.errors import ApiError, ServerError, UnknownOperation
from shoal.store.db import Store

log = logging.getLogger(__name__)
CONTENT_TYPE = "application/x-amz-json-1.1"
MAX_BODY = 4 * 1024 * 1024  # far above any ECS request; a larger body is not read into memory


def error_body(err: ApiError) -> bytes:
    return json.dumps({"__type": err.code, "message": err.message}).encode()


def _without_nulls(value):
    """A JSON null member means the member is absent, as in AWS; handlers then see one form."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


class AwsJsonEndpoint:
    def __init__(self, store: Store, registries: list[Registry], *, arns, credentials: dict[str, str] | None,
                 committed=lambda ctx: None):
        self.store = store
        self.committed = committed  # told about every committed write (wakes agents and placement)
        self.arns = arns
        self.credentials = credentials  # None: authentication disabled (--insecure-no-auth)
        self.registries = {r.target_prefix: r for r in registries}

    async def __call__(self, scope, receive, send) -> None:
        """ASGI entry for `POST /`. Raw ASGI rather than a framework route: this is the hot path,
        and it needs nothing from routing or middleware."""
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_BODY or not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if len(body) > MAX_BODY:
            status, payload = 413, error_body(ApiError(f"The request body exceeds {MAX_BODY} bytes.",
                                                       "SerializationException"))
        else:
            status, payload = await self.handle(scope["method"], scope["path"], scope["query_string"].decode(),
                                                headers, bytes(body))
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", CONTENT_TYPE.encode()), (b"content-length", str(len(payload)).encode()),
            (b"x-amzn-requestid", new_uuid().encode())]})
        await send({"type": "http.response.body", "body": payload})

    async def handle(self, method: str, path: str, query: str, headers: dict[str, str],
                     body: bytes) -> tuple[int, bytes]:
        try:
            self.authenticate(method, path, query, headers, body)
            result = await self._dispatch(headers.get("x-amz-target", ""), body)
            return 200, jsonio.dumpb(result)
        except ApiError as err:
            return err.status, error_body(err)
        except Exception:
            log.exception("internal error in %s", headers.get("x-amz-target"))
            return 500, error_body(ServerError("Internal server error; see the server log."))

    def authenticate(self, method: str, path: str, query: str, headers: dict[str, str], body: bytes) -> None:
        if self.credentials is not None:
            sigv4.verify(method, path, query, headers, body, self.credentials)

    async def _dispatch(self, target: str, body: bytes) -> dict:
        prefix, _, name = target.partition(".")
        registry = self.registries.get(prefix)
        operation = registry.operations.get(name) if registry else None
        if operation is None:
            raise UnknownOperation(f"Unknown operation '{target}'.")
        try:
            params = _without_nulls(jsonio.loads(body)) if body.strip() else {}
        except (ValueError, RecursionError):
            raise ApiError("The request body is not valid JSON.", "SerializationException") from None
        try:
            validate(service_model(registry.service).operation_model(name), params)
        except ApiError as err:  # each service names a rejected request its own way
            raise ApiError(err.message, registry.invalid_input) from None

        def unit_of_work(conn):
            return run_unit(conn, self.arns, lambda ctx: operation.handler(ctx, params))

        if operation.write:
            result, ctx = await self.store.write(unit_of_work)
            self.committed(ctx)
            return result
        return (await self.store.read(unit_of_work))[0]
