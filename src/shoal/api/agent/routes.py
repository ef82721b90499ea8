"""The agent protocol over HTTP: register, long-poll desired state, report.

  POST /v1/agent/register   Authorization: Bearer <join token>    -> {containerInstanceArn, token}
  GET  /v1/agent/poll?since=<version>&cursor=<n>&wait=<seconds>   Bearer <host token>
                                                      -> {version, status, cursor, full, tasks[, orders]}

`since` is the wake-up token of the previous answer: the poll waits until something changed.
`cursor` is its data position: the answer then carries only the tasks whose desired state
changed since (`full` false); without one, every task on the host that has not stopped.
  POST /v1/agent/report     Bearer <host token>   {updates: [task snapshot, …], health: {…},
                                                   orders: [{orderId, status, result}, …]}

`orders` are `shoal chaos` orders for the host, pending until its agent reports their results
(shoal.control.chaos).

The join token is the cluster-joining secret; registering exchanges it for a credential of the
host's own, which reaches that host's tasks and nothing else. Errors use the AWS JSON error
body, like the ECS API.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from urllib.parse import parse_qsl

from shoal import jsonio
from shoal.api.agent import state
from shoal.api.operations import Context
from shoal.api.protocol.awsjson import error_body
from shoal.domain.errors import ApiError, AuthError, InvalidParameter, ServerError
from shoal.store.db import Store

log = logging.getLogger(__name__)

MAX_WAIT = 60.0
# A long-poll woken by a change answers this many seconds later, with whatever else changed on
# the host meanwhile: a host given tasks by several calls in quick succession (binpack fills one
# host at a time) gets them in one answer, starts them together and reports them in one report,
# rather than one poll and one report per call. Task start latency grows by as much.
COALESCE_S = 0.02
MAX_BODY = 4 * 1024 * 1024


class Call:
    """One agent request, as the handlers read it: lower-case headers, query parameters (the
    last of a repeated one) and the body, read once."""

    __slots__ = ("headers", "query_params", "_receive", "_body")

    def __init__(self, scope, receive):
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.query_params = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        self._receive, self._body = receive, None

    async def body(self) -> bytes:
        if self._body is None:
            body = bytearray()
            while True:  # stop reading past the limit: the request is refused anyway
                message = await self._receive()
                body += message.get("body", b"")
                if len(body) > MAX_BODY or not message.get("more_body"):
                    break
            self._body = bytes(body)
        return self._body


class AgentProtocol:
    def __init__(self, store: Store, arns, join_token: str, hub):
        self.store, self.arns, self.join_token, self.hub = store, arns, join_token, hub
        self.last_seen = hub.last_seen  # host ARN -> monotonic time of its agent's latest request
        # Token hash -> (host ARN, monotonic time a poll's answer found the host in service:
        # credential valid, not INACTIVE, agent marked connected). The mapping never changes (a
        # credential belongs to one host for good). For `trust_s` (half the agent timeout) such
        # an answer spares the next poll of that credential from reading the host before it
        # waits. Each answer reads the host anyway (status and connection), so what the
        # shortcut can miss is only a change no commit of this server announced (another
        # server's), and only until that answer; this server's own sweep marks an agent
        # disconnected only after a whole agent timeout without a poll.
        self._in_service: dict[str, tuple[str, float]] = {}
        self.trust_s = hub.agent_timeout / 2
        self._prune_above = 1000
        self._endpoints = {"register": ("POST", self.register), "poll": ("GET", self.poll),
                           "report": ("POST", self.report)}

    PREFIX = "/v1/agent/"

    async def __call__(self, scope, receive, send) -> None:
        """ASGI entry for every path under PREFIX. Raw ASGI rather than framework routes, as
        for the ECS API: every poll and every report comes through here, and a framework's
        routing and middleware cost as much as a poll's own work."""
        method, handler = self._endpoints.get(scope["path"][len(self.PREFIX):], (None, None))
        if handler is None:
            await _send(send, 404, b"Not Found", b"text/plain; charset=utf-8")
            return
        if scope["method"] != method:
            await _send(send, 405, b"Method Not Allowed", b"text/plain; charset=utf-8", [(b"allow", method.encode())])
            return
        try:
            status, payload = 200, jsonio.dumpb(await handler(Call(scope, receive)))
        except ApiError as err:
            status, payload = err.status, error_body(err)
        except Exception:
            log.exception("internal error in %s", scope["path"])
            status, payload = 500, error_body(ServerError("Internal server error; see the server log."))
        await _send(send, status, payload)

    @staticmethod
    def _bearer(request: Call) -> str:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthError("Missing 'Authorization: Bearer <token>'.", "UnrecognizedClientException")
        return token.strip()

    @staticmethod
    async def _body(request: Call) -> dict:
        raw = await request.body()
        if len(raw) > MAX_BODY:
            raise ApiError(f"The request body exceeds {MAX_BODY} bytes.", "SerializationException")
        try:
            body = jsonio.loads(raw or b"{}")
        except ValueError:
            raise ApiError("The request body is not valid JSON.", "SerializationException") from None
        if not isinstance(body, dict):
            raise ApiError("The request body must be a JSON object.", "SerializationException")
        return body

    async def register(self, request: Call) -> dict:
        if not hmac.compare_digest(self._bearer(request).encode(), self.join_token.encode()):
            raise AuthError("The join token is not valid.", "AccessDeniedException")
        body = await self._body(request)
        token = secrets.token_urlsafe(32)
        result = await self.hub.write(lambda ctx: state.register(ctx, body, token))
        self.last_seen[result["containerInstanceArn"]] = time.monotonic()
        return {**result, "token": token}

    async def poll(self, request: Call) -> dict:
        token = self._bearer(request)
        try:
            wait = min(float(request.query_params.get("wait", "20")), MAX_WAIT)
        except ValueError:
            raise InvalidParameter("Invalid parameter 'wait': seconds, as a number.") from None
        cursor = request.query_params.get("cursor") or None
        if cursor is not None:
            if not cursor.isdigit():
                raise InvalidParameter("Invalid parameter 'cursor': the cursor of an earlier answer, or empty.")
            cursor = int(cursor)
        hashed = state.token_hash(token)
        known = self._in_service.get(hashed)
        shortcut = known is not None and time.monotonic() - known[1] < self.trust_s
        if shortcut:  # an answer within trust_s found the host in service: one read, not two
            host_arn = known[0]
        else:
            host = await self.store.read(
                lambda conn: state.host_for_token(Context(conn, self.arns), token, hashed=hashed))
            host_arn = host.arn
            if not jsonio.loads(host.doc).get("agentConnected"):
                await self.hub.write(lambda ctx: state.connected(ctx, token))
        self.last_seen[host_arn] = time.monotonic()
        since = request.query_params.get("since")
        waits = since == self.hub.signals.token(host_arn)
        if await self.hub.signals.wait(host_arn, since, wait):  # woken by a change: gather what follows it
            await asyncio.sleep(COALESCE_S)
        # Read the token before the state: a change committed in between makes the next poll
        # return at once instead of being missed.
        version = self.hub.signals.token(host_arn)
        desired, connected = await self.store.read(  # reads ordered so that no snapshot is needed: see desired_state
            lambda conn: state.desired_state(Context(conn, self.arns), host_arn, cursor), snapshot=False)
        self.last_seen[host_arn] = time.monotonic()
        if desired["status"] == "INACTIVE":
            self._in_service.pop(hashed, None)
            if shortcut and not waits:  # deregistered before this poll came: refused, as without the shortcut
                raise state.denied_credential()
        elif not connected:  # marked disconnected meanwhile (another server's sweep): connected again
            self._in_service.pop(hashed, None)
            await self.hub.write(lambda ctx: state.connected(ctx, token))
        else:
            self._vouch(hashed, host_arn)
        return {"version": version, **desired}

    def _vouch(self, hashed: str, host_arn: str) -> None:
        now = time.monotonic()
        self._in_service[hashed] = (host_arn, now)
        if len(self._in_service) > self._prune_above:  # hosts that went away: their entries are of no use
            self._in_service = {k: v for k, v in self._in_service.items() if now - v[1] < self.trust_s}
            self._prune_above = 2 * len(self._in_service) + 1000

    async def report(self, request: Call) -> dict:
        token = self._bearer(request)
        body = await self._body(request)
        result = await self.hub.write(lambda ctx: state.report(ctx, token, body))
        self.last_seen[result.pop("host")] = time.monotonic()
        return result


async def _send(send, status: int, payload: bytes, content_type: bytes = b"application/json",
                headers: list[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type), (b"content-length", str(len(payload)).encode()), *headers]})
    await send({"type": "http.response.body", "body": payload})
