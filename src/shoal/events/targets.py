"""Rule targets: what a target `Arn` means in shoal, and how one delivery to it is made.

Target kinds, one scheme each (the `Arn` of a PutTargets entry; at most 1600 characters, the
limit of botocore's `TargetArn`, which has no pattern):

    webhook+https://host[:port]/path[?query]   POST to that URL (webhook+http:// also works)
    command:/abs/path/to/executable             run it, the payload on stdin
    file:/abs/path/events.jsonl                 append one JSON line
    queue:<name>                                put on a shoal durable queue (1-80 of A-Za-z0-9_-)

Why these and not `arn:shoal:events:...:webhook/<name>?url=...`: a target has no life of its own
in shoal (nothing creates or deletes it), so there is no resource to name, and the Arn can simply
*be* the address. Each scheme reads as what it does, survives copy and paste from a README, and
needs no lookup table. The `webhook+` prefix keeps a plain `https://` string from being read as a
target by accident and leaves room for other transports. A command is a single absolute path,
with no arguments and no shell: there is nothing to quote or inject; wrap arguments in a script.
Paths must be absolute because the server's working directory is nobody's business. A webhook
URL may not carry `user:password@`: Arns are returned by ListTargetsByRule, and requests are
authenticated by the signature below instead.

Delivery (`deliver`) makes one attempt and raises `DeliveryError(retryable=...)` on failure; the
caller owns retries (RetryPolicy), backoff and dead-lettering.

* webhook: `POST` with `Content-Type: application/json` and
      X-Shoal-Event-Id:  the event id (receivers deduplicate on it: delivery is at-least-once)
      X-Shoal-Timestamp: Unix seconds when the request was signed
      X-Shoal-Signature: sha256=<hex HMAC-SHA256(secret, f"{timestamp}.".encode() + body)>
  Receivers check it with `verify_signature`, which also rejects timestamps more than five
  minutes from their clock, so a captured request cannot be replayed later. 2xx is success.
  408, 429, 5xx, timeouts and connection errors are retryable (a `Retry-After` in seconds comes
  back as `DeliveryError.retry_after`); any other status (3xx, 4xx) is not: repeating the same
  request will not change the answer. Redirects are followed only if the caller's client does.
* command: the executable runs with the payload on stdin, cwd `/`, a new session (its own
  process group), and an environment of only the allow-listed variables plus `SHOAL_EVENT_ID`,
  so the server's credentials never leak into hooks. On timeout the whole process group is
  killed. A non-zero exit is retryable and the error carries the last 2 KiB of stderr. An
  executable that is missing, not executable or not a valid program is not retryable.
* file: one line per delivery, appended with O_APPEND in a single write and fsynced before
  success is reported. A payload that is JSON is minified onto one line; anything else is
  written as a JSON string. A new file is created with mode 0600 (events can carry task
  overrides). A missing directory is not created (it is a configuration error and not
  retryable); a full disk is retryable.
* queue: `await queue_put(name, payload, event_id)`, a durable store the caller provides.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import hmac
import json
import os
import re
import signal
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Literal
from urllib.parse import urlsplit

import httpx

MAX_ARN_LEN = 1600  # botocore events model: TargetArn max 1600
STDERR_TAIL = 2048
SIGNATURE_MAX_AGE_S = 300.0
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_\-]{1,80}")
_SCHEMES = ("webhook+https://…, webhook+http://…, command:/abs/path, file:/abs/path, "
            "queue:<name>")

TargetKind = Literal["webhook", "command", "file", "queue"]
QueuePut = Callable[[str, bytes, str], Awaitable[None]]


@dataclass(frozen=True)
class TargetSpec:
    """A parsed target Arn. `address` is the URL (webhook), absolute path (command, file), or
    queue name (queue)."""

    kind: TargetKind
    address: str

    @property
    def arn(self) -> str:
        if self.kind == "webhook":
            return f"webhook+{self.address}"
        return f"{self.kind}:{self.address}"

    def __str__(self) -> str:
        return self.arn


class DeliveryError(Exception):
    """One delivery attempt failed. `retryable` says whether trying again could succeed;
    `retry_after` is the receiver's Retry-After in seconds, when it sent one."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


def parse_target(arn: str) -> TargetSpec:
    """Parse a target Arn (see the module docstring); ValueError says what is wrong."""
    if not isinstance(arn, str) or not arn:
        raise ValueError("a target Arn is required")
    if len(arn) > MAX_ARN_LEN:
        raise ValueError(f"a target Arn is at most {MAX_ARN_LEN} characters, got {len(arn)}")
    if "\x00" in arn or any(c in arn for c in "\r\n"):
        raise ValueError("a target Arn may not contain NUL or line breaks")
    if arn.startswith("webhook+"):
        return TargetSpec("webhook", _check_url(arn[len("webhook+"):]))
    kind, sep, rest = arn.partition(":")
    if sep and kind in ("command", "file"):
        return TargetSpec(kind, _check_path(kind, rest))  # type: ignore[arg-type]
    if sep and kind == "queue":
        if not _QUEUE_NAME.fullmatch(rest):
            raise ValueError(f"queue name {rest!r} must be 1 to 80 characters of A-Z, a-z, 0-9, "
                             f"'_', '-'")
        return TargetSpec("queue", rest)
    if arn.startswith("arn:"):
        raise ValueError(f"{_short(arn)} is an AWS-style ARN; shoal delivers to {_SCHEMES}")
    if arn.startswith(("http://", "https://")):
        raise ValueError(f"{_short(arn)}: write a webhook target as webhook+{arn[:80]}")
    raise ValueError(f"unknown target kind in {_short(arn)}; use one of {_SCHEMES}")


def _short(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _check_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as e:
        raise ValueError(f"webhook URL {_short(url)} is not valid: {e}") from None
    if parts.scheme not in ("http", "https") or not url.startswith(parts.scheme + "://"):
        raise ValueError(f"webhook URL {_short(url)} must start with https:// or http://")
    if not parts.hostname:
        raise ValueError(f"webhook URL {_short(url)} has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("webhook URL may not contain user:password@ (Arns are listed back by "
                         "ListTargetsByRule; requests are authenticated by X-Shoal-Signature)")
    if parts.fragment or "#" in url:
        raise ValueError(f"webhook URL {_short(url)} may not contain a #fragment")
    if any(c.isspace() for c in url):
        raise ValueError(f"webhook URL {_short(url)} may not contain whitespace")
    return url


def _check_path(kind: str, path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{kind} target needs an absolute path ({kind}:/path/...), "
                         f"got {_short(path)}")
    if path.endswith("/"):
        raise ValueError(f"{kind} target path {_short(path)} names a directory, not a file")
    return path


# --- signatures --------------------------------------------------------------------------------


def sign(secret: bytes, timestamp: str, payload: bytes) -> str:
    """`sha256=<hex>` of HMAC-SHA256 over `<timestamp>.<payload>`."""
    mac = hmac.new(secret, timestamp.encode() + b"." + payload, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(secret: bytes, timestamp: str | int, payload: bytes, signature: str, *,
                     max_age_s: float | None = SIGNATURE_MAX_AGE_S,
                     now: float | None = None) -> bool:
    """For receivers: True if `signature` (the X-Shoal-Signature header) is the HMAC of this
    timestamp and body, and the timestamp is within `max_age_s` of `now` (None: no age check).
    Compares in constant time."""
    ts = str(timestamp)
    if not ts.isdigit() or not isinstance(signature, str):
        return False
    if max_age_s is not None:
        current = time.time() if now is None else now
        if abs(current - int(ts)) > max_age_s:
            return False
    return hmac.compare_digest(sign(secret, ts, payload), signature)


# --- delivery ----------------------------------------------------------------------------------


async def deliver(spec: TargetSpec, payload: bytes, *, event_id: str, secret: bytes,
                  timeout: float, http: httpx.AsyncClient,
                  env_allow: tuple[str, ...] = ("PATH", "HOME", "LANG"),
                  queue_put: QueuePut | None = None) -> None:
    """Make one delivery attempt of `payload` to `spec`; raise DeliveryError on failure."""
    if spec.kind == "webhook":
        await _post(spec.address, payload, event_id=event_id, secret=secret, timeout=timeout,
                    http=http)
    elif spec.kind == "command":
        await _run(spec.address, payload, event_id=event_id, timeout=timeout, env_allow=env_allow)
    elif spec.kind == "file":
        # No timeout: a thread cannot be cancelled, and a local append either works or fails.
        await asyncio.to_thread(_append, spec.address, payload)
    elif spec.kind == "queue":
        if queue_put is None:
            raise DeliveryError(f"no queue store is configured for {spec.arn}", retryable=False)
        try:
            async with asyncio.timeout(timeout):
                await queue_put(spec.address, payload, event_id)
        except DeliveryError:
            raise
        except TimeoutError:
            raise DeliveryError(f"{spec.arn}: put timed out after {timeout:g}s",
                                retryable=True) from None
        except Exception as e:  # the store's own failure: worth another try
            raise DeliveryError(f"{spec.arn}: {type(e).__name__}: {e}", retryable=True) from e
    else:  # pragma: no cover - TargetSpec is only built by parse_target
        raise DeliveryError(f"unknown target kind {spec.kind!r}", retryable=False)


async def _post(url: str, payload: bytes, *, event_id: str, secret: bytes, timeout: float,
                http: httpx.AsyncClient) -> None:
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "X-Shoal-Event-Id": event_id,
        "X-Shoal-Timestamp": timestamp,
        "X-Shoal-Signature": sign(secret, timestamp, payload),
    }
    try:
        async with asyncio.timeout(timeout):  # a total deadline; httpx's timeouts are per phase
            response = await http.post(url, content=payload, headers=headers, timeout=timeout)
    except TimeoutError:
        raise DeliveryError(f"POST {url}: no response within {timeout:g}s",
                            retryable=True) from None
    except httpx.TimeoutException:
        raise DeliveryError(f"POST {url}: timed out after {timeout:g}s", retryable=True) from None
    except httpx.TransportError as e:  # connection refused or reset, DNS, TLS
        raise DeliveryError(f"POST {url}: {type(e).__name__}: {e}", retryable=True) from None
    except httpx.HTTPError as e:  # too many redirects, an invalid URL: the same next time
        raise DeliveryError(f"POST {url}: {type(e).__name__}: {e}", retryable=False) from None
    status = response.status_code
    if 200 <= status < 300:
        return
    body = response.content[:200].decode("utf-8", "replace")
    retryable = status in (408, 429) or status >= 500
    raise DeliveryError(f"POST {url}: HTTP {status}: {body}", retryable=retryable,
                        retry_after=_retry_after(response.headers.get("Retry-After")))


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delta form only; an HTTP date is ignored)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < float("inf") else None


async def _run(path: str, payload: bytes, *, event_id: str, timeout: float,
               env_allow: tuple[str, ...]) -> None:
    env = {k: os.environ[k] for k in env_allow if k in os.environ}
    env["SHOAL_EVENT_ID"] = event_id
    # stderr goes through a pipe of our own: asyncio's Process.wait() (3.11) also waits for the
    # pipes it manages to close, and a background child of the command may hold stderr open.
    err_r, err_w = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            path, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            stderr=err_w, env=env, cwd="/", start_new_session=True, close_fds=True)
    except OSError as e:
        os.close(err_r)
        # Not there, not executable, not a program: trying again will not help. Anything else
        # (EAGAIN, ENOMEM...) might pass.
        permanent = isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError,
                                   NotADirectoryError)) or e.errno == errno.ENOEXEC
        raise DeliveryError(f"command {path}: cannot run: {e.strerror or e}",
                            retryable=not permanent) from None
    finally:
        os.close(err_w)

    loop = asyncio.get_running_loop()
    stderr = asyncio.StreamReader()
    err_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(stderr), os.fdopen(err_r, "rb", buffering=0))
    tail = bytearray()

    async def feed() -> None:
        try:
            proc.stdin.write(payload)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the command does not read its input: its choice
        finally:
            proc.stdin.close()

    async def drain_stderr() -> None:
        while chunk := await stderr.read(65536):
            tail.extend(chunk)
            del tail[:-STDERR_TAIL]

    reader = asyncio.create_task(drain_stderr())
    try:
        try:
            async with asyncio.timeout(timeout):
                await feed()
                await proc.wait()
        except TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            raise DeliveryError(f"command {path}: killed after {timeout:g}s timeout"
                                f"{_stderr_suffix(tail)}", retryable=True) from None
        except BaseException:
            _kill_group(proc.pid)  # cancelled by the caller: leave nothing behind
            raise
        # A background child may still hold stderr open: wait briefly for EOF, then stop.
        try:
            await asyncio.wait_for(asyncio.shield(reader), timeout=1.0)
        except TimeoutError:
            pass
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        err_transport.close()
    if proc.returncode != 0:
        how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exited with status {proc.returncode}")
        raise DeliveryError(f"command {path}: {how}{_stderr_suffix(tail)}", retryable=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stderr_suffix(tail: bytearray) -> str:
    text = bytes(tail).decode("utf-8", "replace").strip()
    return f"; stderr: {text}" if text else ""


def json_line(payload: bytes) -> bytes:
    """The payload as one JSON line: minified if it is JSON, else as a JSON string."""
    from shoal.events.transform import minify  # transform imports this module

    text = payload.decode("utf-8", "replace")
    try:
        json.loads(text)
    except json.JSONDecodeError:
        line = json.dumps(text, ensure_ascii=False)
    else:
        line = minify(text)
    return line.encode() + b"\n"


_PERMANENT_FILE_ERRORS = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                          errno.EROFS, errno.ELOOP, errno.ENAMETOOLONG)


def _append(path: str, payload: bytes) -> None:
    line = json_line(payload)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise DeliveryError(f"file {path}: {e.strerror}",
                            retryable=e.errno not in _PERMANENT_FILE_ERRORS) from None
    try:
        view = memoryview(line)
        while view:  # one write in practice; loop in case the kernel takes part of it
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError as e:
        raise DeliveryError(f"file {path}: {e.strerror}",
                            retryable=e.errno not in _PERMANENT_FILE_ERRORS) from None
    finally:
        os.close(fd)
