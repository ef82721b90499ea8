"""A minimal HTTP/1.1 client for the agent protocol: one keep-alive connection, one request at a
time, JSON in and out.

Why not httpx: ten thousand simulated hosts each hold a long-poll open, so the emulator holds
ten thousand connections. httpcore's pool walks all of its connections on every request and
every response (and counts idle ones inside that walk), which at this size costs more CPU than
the server spends answering. Here each host owns its poll connection, and a few workers own
theirs for registrations and reports, so a request costs the same whatever the fleet's size.

It speaks only what `shoal server` (uvicorn) answers: responses with a Content-Length, or
ending when the connection closes.
"""

from __future__ import annotations

import asyncio
import ssl as ssllib
from urllib.parse import urlsplit

from shoal import jsonio

MAX_HEADER = 64 * 1024


class HttpError(Exception):
    """The connection failed, or the answer was not HTTP we understand."""


class Endpoint:
    """Where the server is: parsed once, shared by every connection."""

    def __init__(self, url: str):
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssllib.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path
        self.host_header = parts.netloc


class Connection:
    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        e = self.endpoint
        self._reader, self._writer = await asyncio.open_connection(e.host, e.port, ssl=e.ssl, limit=MAX_HEADER)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def request(self, method: str, path: str, token: str, body: dict | None = None,
                      timeout: float = 30.0) -> tuple[int, dict]:
        """Send one request; return (status, decoded JSON body). Raises HttpError."""
        payload = b"" if body is None else jsonio.dumpb(body)  # orjson, as the server: faster for the same text
        head = (f"{method} {self.endpoint.prefix}{path} HTTP/1.1\r\nHost: {self.endpoint.host_header}\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode()
        for attempt in range(2):
            reused = self._writer is not None
            try:
                async with asyncio.timeout(timeout):
                    if not reused:
                        await self._open()
                    self._writer.write(head + payload)
                    status, data = await self._response()
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError) as err:
                self.close()
                # A kept-alive connection may have been closed by the server while idle (uvicorn
                # closes them after 5 s) before it read this request: try once on a fresh one.
                if reused and attempt == 0 and not isinstance(err, TimeoutError):
                    continue
                raise HttpError(f"{method} {path}: {type(err).__name__}: {err}") from None
            try:
                return status, jsonio.loads(data) if data else {}
            except ValueError:
                raise HttpError(f"{method} {path}: answered {status} with a body that is not JSON") from None
        raise AssertionError("unreachable")

    async def _response(self) -> tuple[int, bytes]:
        raw = await self._reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            data = await self._reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            raise ValueError("chunked responses are not supported")
        else:  # the body runs to the end of the connection
            data = await self._reader.read()
            self.close()
            return status, data
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, data
