"""Target kinds against real things: a local HTTP server that checks signatures, real scripts run
as command targets, real files, and the Arn parser's errors."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from shoal.events.targets import (
    DeliveryError, TargetSpec, deliver, json_line, parse_target, sign, verify_signature,
)
from tests.support import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and sh")

SECRET = b"s3cret-key"


def send(arn: str, payload: bytes, *, timeout: float = 5.0, **kwargs) -> None:
    """One delivery, on a fresh event loop and HTTP client."""

    async def go():
        async with httpx.AsyncClient() as http:
            await deliver(parse_target(arn), payload, event_id=kwargs.pop("event_id", "evt-1"),
                          secret=kwargs.pop("secret", SECRET), timeout=timeout, http=http,
                          **kwargs)

    asyncio.run(go())


def failure(arn: str, payload: bytes = b"{}", **kwargs) -> DeliveryError:
    with pytest.raises(DeliveryError) as e:
        send(arn, payload, **kwargs)
    return e.value


# --- parse_target ------------------------------------------------------------------------------

VALID = [
    ("webhook+https://hooks.example.com/shoal?team=gpu", "webhook",
     "https://hooks.example.com/shoal?team=gpu"),
    ("webhook+http://127.0.0.1:8080/e", "webhook", "http://127.0.0.1:8080/e"),
    ("command:/usr/local/bin/on-event", "command", "/usr/local/bin/on-event"),
    ("file:/var/log/shoal/events.jsonl", "file", "/var/log/shoal/events.jsonl"),
    ("queue:ops-alerts_1", "queue", "ops-alerts_1"),
]


@pytest.mark.parametrize("arn,kind,address", VALID)
def test_parse_valid(arn, kind, address):
    spec = parse_target(arn)
    assert spec == TargetSpec(kind, address)
    assert spec.arn == arn


INVALID = [
    ("", "a target Arn is required"),
    ("webhook+https://h/" + "x" * 1600, "at most 1600 characters"),
    ("sqs:queue", "unknown target kind in 'sqs:queue'"),
    ("arn:aws:sqs:us-east-1:123456789012:q", "is an AWS-style ARN"),
    ("https://example.com/hook", "write a webhook target as webhook+https://example.com/hook"),
    ("webhook+ftp://example.com/x", "must start with https:// or http://"),
    ("webhook+https:///path", "has no host"),
    ("webhook+https://user:pw@example.com/x", "may not contain user:password@"),
    ("webhook+https://example.com:99999/x", "is not valid"),
    ("webhook+https://example.com/x#frag", "may not contain a #fragment"),
    ("webhook+https://example.com/a b", "may not contain whitespace"),
    ("command:bin/hook", "command target needs an absolute path"),
    ("command:", "command target needs an absolute path"),
    ("file:events.jsonl", "file target needs an absolute path"),
    ("file:/var/log/", "names a directory"),
    ("queue:", "queue name '' must be 1 to 80 characters"),
    ("queue:has space", "queue name 'has space'"),
    ("queue:" + "q" * 81, "must be 1 to 80 characters"),
    ("file:/tmp/a\nb", "may not contain NUL or line breaks"),
]


@pytest.mark.parametrize("arn,message", INVALID)
def test_parse_invalid(arn, message):
    with pytest.raises(ValueError) as e:
        parse_target(arn)
    assert message in str(e.value)


# --- webhook -----------------------------------------------------------------------------------


class Receiver:
    """A real HTTP server. Paths choose the answer: /ok 200, /fail 500, /bad 400, /busy 429 with
    Retry-After, /slow 200 after `release` is set (or 5 s). Unsigned or badly signed requests
    get 401. Every request is recorded."""

    def __init__(self, secret: bytes):
        self.requests: list[dict] = []
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                ok = verify_signature(secret, self.headers.get("X-Shoal-Timestamp", ""), body,
                                      self.headers.get("X-Shoal-Signature", ""))
                receiver.requests.append({"path": self.path, "headers": dict(self.headers),
                                          "body": body, "verified": ok})
                status, extra = {"/ok": (200, {}), "/fail": (500, {}), "/bad": (400, {}),
                                 "/busy": (429, {"Retry-After": "7"})}.get(self.path, (200, {}))
                if not ok:
                    status = 401
                elif self.path == "/slow":
                    receiver.release.wait(5)
                reply = json.dumps({"status": status}).encode()
                try:
                    self.send_response(status)
                    for k, v in extra.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the /slow case)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver(SECRET)
    yield r
    r.close()


def test_webhook_delivers_signed_json(receiver):
    payload = b'{"detail-type":"ECS Task State Change","detail":{"lastStatus":"RUNNING"}}'
    send(f"webhook+{receiver.url}/ok", payload, event_id="evt-42")
    [req] = receiver.requests
    assert req["verified"] and req["body"] == payload
    headers = {k.lower(): v for k, v in req["headers"].items()}
    assert headers["content-type"] == "application/json"
    assert headers["x-shoal-event-id"] == "evt-42"
    assert abs(int(headers["x-shoal-timestamp"]) - time.time()) < 60
    assert headers["x-shoal-signature"] == sign(SECRET, headers["x-shoal-timestamp"], payload)


def test_webhook_server_error_is_retryable(receiver):
    err = failure(f"webhook+{receiver.url}/fail")
    assert err.retryable and "HTTP 500" in str(err)


def test_webhook_429_is_retryable_with_retry_after(receiver):
    err = failure(f"webhook+{receiver.url}/busy")
    assert err.retryable and err.retry_after == 7.0 and "HTTP 429" in str(err)


def test_webhook_client_error_is_not_retryable(receiver):
    err = failure(f"webhook+{receiver.url}/bad")
    assert not err.retryable and "HTTP 400" in str(err)


def test_webhook_wrong_secret_is_rejected_by_the_receiver(receiver):
    err = failure(f"webhook+{receiver.url}/ok", secret=b"not-the-secret")
    assert not err.retryable and "HTTP 401" in str(err)
    assert receiver.requests[0]["verified"] is False


def test_webhook_timeout_is_retryable(receiver):
    started = time.monotonic()
    err = failure(f"webhook+{receiver.url}/slow", timeout=0.3)
    assert err.retryable and "0.3s" in str(err)
    assert time.monotonic() - started < 3


def test_webhook_connection_refused_is_retryable():
    import socket

    with socket.socket() as s:  # a port that was free a moment ago and has no listener now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = failure(f"webhook+http://127.0.0.1:{port}/x")
    assert err.retryable and "ConnectError" in str(err)


def test_verify_signature():
    ts = str(int(time.time()))
    sig = sign(SECRET, ts, b"{}")
    assert verify_signature(SECRET, ts, b"{}", sig)
    assert verify_signature(SECRET, int(ts), b"{}", sig)
    assert not verify_signature(SECRET, ts, b"{ }", sig)  # body changed
    assert not verify_signature(b"other", ts, b"{}", sig)
    assert not verify_signature(SECRET, str(int(ts) + 1), b"{}", sig)  # timestamp changed
    assert not verify_signature(SECRET, "abc", b"{}", sig)
    old = str(int(time.time()) - 3600)
    old_sig = sign(SECRET, old, b"{}")
    assert not verify_signature(SECRET, old, b"{}", old_sig)  # replay of an old request
    assert verify_signature(SECRET, old, b"{}", old_sig, max_age_s=None)


# --- command -----------------------------------------------------------------------------------


def script(tmp_path: Path, body: str, name: str = "hook.sh") -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return f"command:{path}"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_command_gets_payload_on_stdin_and_only_allowed_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_TEST_SECRET", "hunter2")
    out = tmp_path / "out"
    out.mkdir()
    arn = script(tmp_path, f"cat > {out}/stdin\nenv > {out}/env\npwd > {out}/cwd\n")
    payload = b'{"id":"evt-7","detail":{"x":1}}'
    send(arn, payload, event_id="evt-7")
    assert (out / "stdin").read_bytes() == payload
    env = dict(line.split("=", 1) for line in (out / "env").read_text().splitlines())
    assert env["SHOAL_EVENT_ID"] == "evt-7"
    assert env["PATH"] == os.environ["PATH"]
    assert "SHOAL_TEST_SECRET" not in env
    assert set(env) <= {"PATH", "HOME", "LANG", "SHOAL_EVENT_ID", "PWD", "SHLVL", "_", "OLDPWD"}
    assert (out / "cwd").read_text().strip() == "/"


def test_command_env_allow_list_is_the_callers(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_TEST_SECRET", "hunter2")
    out = tmp_path / "env"
    arn = script(tmp_path, f"/usr/bin/env > {out}\n")
    send(arn, b"{}", env_allow=("SHOAL_TEST_SECRET",))
    env = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert env["SHOAL_TEST_SECRET"] == "hunter2" and "HOME" not in env


def test_command_nonzero_exit_is_retryable_with_stderr(tmp_path):
    err = failure(script(tmp_path, "echo 'disk quota exceeded' >&2\nexit 3\n"))
    assert err.retryable
    assert "exited with status 3" in str(err) and "disk quota exceeded" in str(err)


def test_command_stderr_is_cut_to_its_tail(tmp_path):
    err = failure(script(tmp_path, "i=0\nwhile [ $i -lt 300 ]; do echo \"line $i "
                                   "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\" >&2; i=$((i+1)); done\n"
                                   "echo THE-END >&2\nexit 1\n"))
    message = str(err)
    assert "THE-END" in message and "line 0 " not in message
    assert len(message) < 2048 + 200


def test_command_killed_by_signal(tmp_path):
    err = failure(script(tmp_path, "kill -TERM $$\n"))
    assert err.retryable and "killed by signal 15" in str(err)


def test_command_timeout_kills_the_process_group(tmp_path):
    child, me = tmp_path / "child", tmp_path / "self"
    arn = script(tmp_path, f"sleep 60 &\necho $! > {child}\necho $$ > {me}\nwait\n")
    started = time.monotonic()
    err = failure(arn, timeout=0.5)
    assert err.retryable and "killed after 0.5s timeout" in str(err)
    assert time.monotonic() - started < 5
    pids = [int(wait_for(lambda p=p: p.exists() and p.read_text().strip(), message=str(p)))
            for p in (child, me)]
    wait_for(lambda: not any(alive(p) for p in pids), message="the script and its child to die")


def test_command_background_child_does_not_hold_delivery(tmp_path):
    # The script exits 0 but leaves a child holding stderr: delivery succeeds about 1 s later.
    child = tmp_path / "child"
    arn = script(tmp_path, f"sleep 30 &\necho $! > {child}\nexit 0\n")
    started = time.monotonic()
    try:
        send(arn, b"{}")
        assert time.monotonic() - started < 4
    finally:
        if child.exists():
            try:
                os.kill(int(child.read_text()), 9)
            except ProcessLookupError:
                pass


def test_command_that_cannot_run_is_not_retryable(tmp_path):
    err = failure(f"command:{tmp_path}/missing")
    assert not err.retryable and "cannot run" in str(err)
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\nexit 0\n")
    plain.chmod(0o644)
    err = failure(f"command:{plain}")
    assert not err.retryable and "cannot run" in str(err)


def test_command_that_ignores_stdin_succeeds(tmp_path):
    send(script(tmp_path, "exit 0\n"), b"x" * (1 << 20))  # 1 MiB nobody reads


# --- file --------------------------------------------------------------------------------------


def test_file_appends_one_json_line_per_delivery(tmp_path):
    path = tmp_path / "events.jsonl"
    payloads = [b'{"a":1}', b'{\n  "b": [1, 2],\n  "s": "two  spaces"\n}',
                b"plain text\nwith a newline", '"caf\u00e9"'.encode(), b"\xff\xfe not utf-8"]
    for p in payloads:
        send(f"file:{path}", p)
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == len(payloads) + 1
    values = [json.loads(line) for line in lines[:-1]]
    assert values[0] == {"a": 1}
    assert values[1] == {"b": [1, 2], "s": "two  spaces"}
    assert lines[1] == b'{"b":[1,2],"s":"two  spaces"}'
    assert values[2] == "plain text\nwith a newline"
    assert values[3] == "caf\u00e9"
    assert values[4].endswith(" not utf-8")


def test_file_concurrent_appends_do_not_interleave(tmp_path):
    path = tmp_path / "events.jsonl"

    async def go():
        async with httpx.AsyncClient() as http:
            spec = parse_target(f"file:{path}")
            await asyncio.gather(*(
                deliver(spec, json.dumps({"n": i, "pad": "x" * 5000}).encode(), event_id=str(i),
                        secret=SECRET, timeout=5, http=http) for i in range(50)))

    asyncio.run(go())
    lines = path.read_text().splitlines()
    assert sorted(json.loads(line)["n"] for line in lines) == list(range(50))


def test_file_missing_directory_is_not_retryable_and_not_created(tmp_path):
    err = failure(f"file:{tmp_path}/nope/events.jsonl")
    assert not err.retryable and "No such file or directory" in str(err)
    assert not (tmp_path / "nope").exists()


def test_file_that_is_a_directory_is_not_retryable(tmp_path):
    err = failure(f"file:{tmp_path}")
    assert not err.retryable


def test_json_line():
    assert json_line(b' {"a" : 1} ') == b'{"a":1}\n'
    assert json_line(b"1e3") == b"1e3\n"  # JSON kept as written, only whitespace goes
    assert json_line(b"not json") == b'"not json"\n'


# --- queue -------------------------------------------------------------------------------------


def test_queue_calls_the_store():
    calls = []

    async def put(name, payload, event_id):
        calls.append((name, payload, event_id))

    send("queue:alerts", b'{"x":1}', event_id="evt-9", queue_put=put)
    assert calls == [("alerts", b'{"x":1}', "evt-9")]


def test_queue_without_a_store_is_not_retryable():
    err = failure("queue:alerts")
    assert not err.retryable and "no queue store" in str(err)


def test_queue_store_failure_is_retryable():
    async def put(name, payload, event_id):
        raise OSError("database is locked")

    err = failure("queue:alerts", queue_put=put)
    assert err.retryable and "database is locked" in str(err)
