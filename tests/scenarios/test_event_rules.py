"""Stories: EventBridge rules deliver events to real receivers, through real server processes.

1. A webhook gets every acknowledged matching event at least once, although the server is
   killed with SIGKILL in the middle of a burst of PutEvents and restarted on the same data
   directory; it gets nothing that did not match, and every request carries a valid signature.
   Both backends (SQLite, PostgreSQL).
2. A webhook that answers 500 is retried with growing backoff, then the event lands in the
   rule's dead-letter queue, which is read and acknowledged over the queue REST API.
3. A command target runs a remediation script with the event on its stdin: the event of a
   task that a user stopped (RunTask with no host leaves the task PENDING; StopTask stops it).
4. An InputTransformer shapes what a file target receives, and a disabled rule delivers
   nothing.
5. One target's trouble is nobody else's: a webhook slow to answer does not delay another
   rule's, and events queued behind one that waits for a retry wait without the server spinning.

The receivers are the test's own: an HTTP server in a thread, a shell script, a file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shoal.events.targets import verify_signature
from tests.support import ServerProcess, database_url_for, wait_for

IMPAIRED = "DAEMON_TASK_START_IMPAIRED"
# Shoal's own daemon events come with a later issue: here a user source publishes events of
# their shape, with PutEvents, and the rule selects them as it would select shoal's.
DAEMON_PATTERN = {"source": ["custom.fleet"], "detail-type": ["ECS Daemon Service Action"],
                  "detail": {"eventName": [IMPAIRED]}}


# -- receivers and REST helpers -------------------------------------------------------------------
class Receiver:
    """An HTTP webhook receiver in a thread: checks each request's signature against the server's
    secret, records what arrived and when, and answers `status`."""

    def __init__(self, secret_file: Path, status: int = 200):
        self.secret_file, self.status = secret_file, status
        self.delay = 0.0  # seconds to wait before answering
        self.started = 0  # requests received, complete or not yet answered
        self.lock = threading.Lock()
        self.arrivals: list[tuple[float, str, dict]] = []  # (monotonic time, X-Shoal-Event-Id, body)
        self.bad: list[str] = []  # what was wrong with requests that did not verify
        self.truncated = 0  # requests cut short by the sender's death
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                if len(body) < length:  # the sender died mid-request (kill -9): no delivery
                    receiver.truncated += 1
                    self.close_connection = True
                    return
                with receiver.lock:
                    receiver.started += 1
                time.sleep(receiver.delay)
                receiver.record(self.headers, body)
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def arn(self) -> str:
        return f"webhook+http://127.0.0.1:{self.httpd.server_address[1]}/hook"

    def record(self, headers, body: bytes) -> None:
        at = time.monotonic()
        secret = self.secret_file.read_text().strip().encode()
        ts, sig, event_id = (headers.get(h) for h in ("X-Shoal-Timestamp", "X-Shoal-Signature", "X-Shoal-Event-Id"))
        # The documented scheme, computed here independently, and the helper receivers are given.
        expected = "sha256=" + hmac.new(secret, f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
        problems = []
        if not (sig and hmac.compare_digest(expected, sig) and verify_signature(secret, ts, body, sig)):
            problems.append(f"bad signature on {event_id}")
        try:
            event = json.loads(body)
        except ValueError:
            event = {}
            problems.append(f"body of {event_id} is not JSON")
        if event.get("id") != event_id:
            problems.append(f"X-Shoal-Event-Id {event_id} is not the body's id {event.get('id')}")
        if headers.get("Content-Type") != "application/json":
            problems.append(f"Content-Type {headers.get('Content-Type')}")
        with self.lock:
            self.bad += problems
            self.arrivals.append((at, event_id, event))

    def snapshot(self) -> list[tuple[float, str, dict]]:
        with self.lock:
            return list(self.arrivals)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def signed_post(server: ServerProcess, path: str, doc: dict) -> httpx.Response:
    """A SigV4-signed POST with a JSON body, signed as ServerProcess.get signs a GET."""
    body = json.dumps(doc).encode()
    url = server.endpoint + path
    request = AWSRequest(method="POST", url=url, data=body, headers={"Content-Type": "application/json"})
    creds = Credentials(server.credentials["accessKeyId"], server.credentials["secretAccessKey"])
    SigV4Auth(creds, "ecs", "local").add_auth(request)
    return httpx.post(url, content=body, headers=dict(request.headers.items()), timeout=30)


def receive(server: ServerProcess, queue: str, visibility: float = 30) -> list[dict]:
    resp = server.get(f"/v1/queues/{queue}/messages", {"max": 10, "visibility": visibility})
    assert resp.status_code == 200, resp.text
    return resp.json()["messages"]


def put_rule(events, name: str, pattern: dict, target: dict, state: str = "ENABLED") -> str:
    arn = events.put_rule(Name=name, EventPattern=json.dumps(pattern), State=state)["RuleArn"]
    assert events.put_targets(Rule=name, Targets=[target])["FailedEntryCount"] == 0
    return arn


@pytest.fixture
def receivers():
    made: list[Receiver] = []
    yield lambda *a, **k: made.append(Receiver(*a, **k)) or made[-1]
    for r in made:
        r.close()


# -- 1. at least once across kill -9 ----------------------------------------------------------------
def daemon_entry(seq: int) -> dict:
    """Even seq: a DAEMON_TASK_START_IMPAIRED action (matches); odd: another action (does not)."""
    name = IMPAIRED if seq % 2 == 0 else "DAEMON_TASK_START_RECOVERED"
    daemon = f"arn:aws:ecs:local:000000000000:daemon/fleet/d{seq % 3}"
    return {"Source": "custom.fleet", "DetailType": "ECS Daemon Service Action", "Resources": [daemon],
            "Detail": json.dumps({"eventName": name, "seq": seq, "daemonArn": daemon})}


def test_webhook_gets_every_acknowledged_event_across_kill_9(backend, tmp_path, receivers):
    """A rule on DAEMON_TASK_START_IMPAIRED-shaped events (published by PutEvents from the user
    source custom.fleet, since shoal's own daemon events come later) with a webhook target. 300
    entries in batches of 10, half matching; the server is killed with SIGKILL mid-burst and
    restarted on the same data directory and port, and the burst goes on. Every matching entry
    of a PutEvents call that answered reaches the webhook at least once (a delivery in flight at
    the kill is sent again when its lease runs out); entries of the call the kill interrupted
    may or may not; nothing else arrives, and first arrivals keep each daemon's order."""
    data_dir = tmp_path / "data"
    db_url = database_url_for(backend)
    server = ServerProcess(data_dir, db_url).start()
    hook = receivers(data_dir / "webhook-secret")
    acked: dict[int, str] = {}  # seq -> EventId, for matching entries of calls that answered
    unknown: set[int] = set()  # seqs of the calls that failed: the kill may have cut them either way
    lock, restarted, stop = threading.Lock(), threading.Event(), threading.Event()
    try:
        events = server.client("events")
        put_rule(events, "impaired", DAEMON_PATTERN, {"Id": "hook", "Arn": hook.arn})

        def burst():
            for first in range(0, 300, 10):
                if stop.is_set():
                    return
                entries = [daemon_entry(s) for s in range(first, first + 10)]
                try:
                    resp = events.put_events(Entries=entries)
                except Exception:  # the server died under this call, or was already dead
                    with lock:
                        unknown.update(range(first, first + 10))
                    restarted.wait(60)
                    continue
                assert resp["FailedEntryCount"] == 0, resp
                with lock:
                    for seq, result in zip(range(first, first + 10), resp["Entries"]):
                        if seq % 2 == 0:
                            acked[seq] = result["EventId"]

        sender = threading.Thread(target=burst, daemon=True)
        sender.start()
        wait_for(lambda: len(acked) >= 50 and hook.snapshot(), timeout=20, interval=0.001,
                 message="the first 10 batches acknowledged and deliveries under way")
        server.kill()
        before_restart = len(hook.snapshot())
        again = ServerProcess(data_dir, db_url)
        again.port = server.port  # same endpoint: the sender's client keeps working after the restart
        server = again.start()
        restarted.set()
        sender.join(60)
        assert not sender.is_alive()
        assert unknown, "the kill landed between two calls (no call failed): the burst went on without it"
        assert len(acked) + len(unknown) // 2 == 150

        def all_arrived():
            got = {event_id for _, event_id, _ in hook.snapshot()}
            return set(acked.values()) <= got
        wait_for(all_arrived, timeout=40, interval=0.05,
                 message="every acknowledged matching event at the webhook (a delivery interrupted by the "
                         "kill waits for its lease)")
        time.sleep(0.3)  # anything still on its way
        arrivals = hook.snapshot()

        assert hook.bad == [], hook.bad[:5]
        assert 0 < before_restart < len(arrivals), "deliveries happened both before the kill and after"
        ids_by_seq: dict[int, set[str]] = {}
        for _, event_id, event in arrivals:
            detail = event["detail"]
            assert event["source"] == "custom.fleet" and detail["eventName"] == IMPAIRED, event
            seq = detail["seq"]
            assert seq in acked or seq in unknown, f"seq {seq} was never sent"
            if seq in acked:
                assert event_id == acked[seq]
            ids_by_seq.setdefault(seq, set()).add(event_id)
        assert all(len(ids) == 1 for ids in ids_by_seq.values()), "one entry, one event id"
        # Order per (target, resource): each daemon's events first arrive in the order they were put.
        first_seen: dict[str, list[int]] = {}
        seen: set[str] = set()
        for _, event_id, event in arrivals:
            if event_id not in seen:
                seen.add(event_id)
                first_seen.setdefault(event["resources"][0], []).append(event["detail"]["seq"])
        for daemon, seqs in first_seen.items():
            assert seqs == sorted(seqs), f"{daemon}: {seqs}"
    finally:
        stop.set()
        server.stop()


# -- 2..4 share one server per backend ---------------------------------------------------------------
def test_failing_webhook_is_retried_with_backoff_then_dead_lettered(server, receivers, unique):
    events = server.client("events")
    hook = receivers(server.data_dir / "webhook-secret", status=500)
    kind = unique("failing")
    rule_arn = put_rule(events, kind, {"source": ["custom.app"], "detail-type": [kind]}, {
        "Id": "hook", "Arn": hook.arn, "RetryPolicy": {"MaximumRetryAttempts": 2},
        "DeadLetterConfig": {"Arn": "queue:dlq"}})
    [entry] = events.put_events(Entries=[{"Source": "custom.app", "DetailType": kind,
                                          "Detail": json.dumps({"n": 1})}])["Entries"]
    event_id = entry["EventId"]

    # 1 attempt + 2 retries (backoff 0.25-0.5 s, then 0.5-1 s), then the dead-letter queue.
    messages = wait_for(lambda: [m for m in receive(server, "dlq", visibility=2) if m["eventId"] == event_id],
                        timeout=10, interval=0.1, message="the event in the dead-letter queue")
    attempts = [at for at, eid, _ in hook.snapshot() if eid == event_id]
    assert len(attempts) == 3, attempts
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    assert gaps[0] >= 0.2 and gaps[1] > gaps[0], gaps
    assert hook.bad == []

    [message] = messages
    assert json.loads(message["body"])["id"] == event_id
    assert json.loads(message["body"])["detail"] == {"n": 1}
    attributes = message["attributes"]
    assert attributes["ERROR_CODE"] == "RETRIES_EXHAUSTED" and attributes["ATTEMPTS"] == 3
    assert "HTTP 500" in attributes["ERROR_MESSAGE"]
    assert attributes["RULE_ARN"] == rule_arn and attributes["TARGET_ARN"] == hook.arn
    # Received, it is hidden for the visibility timeout; acknowledged, it is gone.
    assert [m for m in receive(server, "dlq") if m["eventId"] == event_id] == []
    resp = signed_post(server, "/v1/queues/dlq/ack", {"receipts": [message["receipt"]]})
    assert resp.status_code == 200 and resp.json() == {"acknowledged": 1}, resp.text
    time.sleep(2.2)  # past the visibility timeout: only an unacknowledged message would be back
    assert [m for m in receive(server, "dlq", visibility=0) if m["eventId"] == event_id] == []
    assert len([1 for _, eid, _ in hook.snapshot() if eid == event_id]) == 3, "no attempt after the DLQ"


def test_command_target_runs_remediation_with_the_stopped_task_event(server, ecs, tmp_path, unique):
    events = server.client("events")
    out = tmp_path / "remediation"
    out.mkdir()
    script = tmp_path / "remediate.sh"
    script.write_text(f'#!/bin/sh\ncat > "{out}/$SHOAL_EVENT_ID.json"\n')
    script.chmod(0o755)
    cluster = ecs.create_cluster(clusterName=unique("remed"))["cluster"]
    put_rule(events, unique("stopped"), {
        "source": ["shoal.ecs"], "detail-type": ["ECS Task State Change"],
        "detail": {"clusterArn": [cluster["clusterArn"]], "lastStatus": ["STOPPED"],
                   "stopCode": ["UserInitiated"]}}, {"Id": "remediate", "Arn": f"command:{script}"})
    family = ecs.register_task_definition(family=unique("app"), containerDefinitions=[
        {"name": "c", "image": "busybox", "memory": 64}])["taskDefinition"]["family"]

    task = ecs.run_task(cluster=cluster["clusterName"], taskDefinition=family)["tasks"][0]
    assert task["lastStatus"] == "PENDING"  # no host: it waits
    ecs.stop_task(cluster=cluster["clusterName"], task=task["taskArn"], reason="remediate me")

    [delivered] = wait_for(lambda: list(out.glob("*.json")), timeout=10, message="the script to run")
    time.sleep(0.5)  # a PENDING event wrongly matched, or a second delivery, would show up by now
    assert list(out.glob("*.json")) == [delivered]
    event = json.loads(delivered.read_text())
    assert delivered.name == f"{event['id']}.json", "SHOAL_EVENT_ID is the event's id"
    assert event["source"] == "shoal.ecs" and event["detail-type"] == "ECS Task State Change"
    assert event["resources"] == [task["taskArn"]]
    detail = event["detail"]
    assert (detail["taskArn"], detail["lastStatus"], detail["stopCode"]) == (task["taskArn"], "STOPPED",
                                                                           "UserInitiated")
    assert detail["stoppedReason"] == "remediate me"
    [logged] = [e for e in server.events() if e["id"] == event["id"]]
    assert logged == event, "the script got the event as the log has it"


def test_input_transformer_to_a_file_and_a_disabled_rule(server, tmp_path, unique):
    events = server.client("events")
    kind = unique("deploy")
    pattern = {"source": ["custom.deploy"], "detail-type": [kind]}
    shaped, silent = tmp_path / "shaped.jsonl", tmp_path / "silent.jsonl"
    rule = unique("shape")
    put_rule(events, rule, pattern, {
        "Id": "file", "Arn": f"file:{shaped}", "InputTransformer": {
            "InputPathsMap": {"service": "$.detail.service", "version": "$.detail.version",
                              "first": "$.resources[0]"},
            "InputTemplate": '{"text": "<service> is at <version>", "version": <version>, '
                             '"resource": <first>, "rule": <aws.events.rule-name>}'}})
    # Enabled, then disabled: the router must drop it from its index.
    off = unique("off")
    put_rule(events, off, pattern, {"Id": "file", "Arn": f"file:{silent}"})
    events.disable_rule(Name=off)
    assert events.describe_rule(Name=off)["State"] == "DISABLED"

    events.put_events(Entries=[{"Source": "custom.deploy", "DetailType": kind, "Resources": ["svc/api"],
                                "Detail": json.dumps({"service": "api", "version": 42})}])
    lines = wait_for(lambda: shaped.exists() and shaped.read_text().splitlines(), timeout=10,
                     message="the transformed event in the file")
    assert [json.loads(line) for line in lines] == [
        {"text": "api is at 42", "version": 42, "resource": "svc/api", "rule": rule}]
    time.sleep(0.3)
    assert not silent.exists(), "the disabled rule delivered"
    assert shaped.stat().st_mode & 0o777 == 0o600


# -- one target's trouble is nobody else's ------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_slow_target_does_not_hold_back_another(server, receivers, unique):
    """A webhook that takes 2 s to answer does not delay another rule's webhook."""
    events = server.client("events")
    slow, fast = receivers(server.data_dir / "webhook-secret"), receivers(server.data_dir / "webhook-secret")
    slow.delay = 2.0
    kinds = {name: unique(name) for name in ("slow", "fast")}
    for name, hook in (("slow", slow), ("fast", fast)):
        put_rule(events, kinds[name], {"source": ["custom.app"], "detail-type": [kinds[name]]},
                 {"Id": "hook", "Arn": hook.arn})
    events.put_events(Entries=[{"Source": "custom.app", "DetailType": kinds["slow"], "Detail": "{}"}])
    wait_for(lambda: slow.started, timeout=5, message="the slow delivery under way")
    sent = time.monotonic()
    events.put_events(Entries=[{"Source": "custom.app", "DetailType": kinds["fast"], "Detail": "{}"}])
    [(arrived, _, _)] = wait_for(fast.snapshot, timeout=10, message="the fast target's event")
    assert arrived - sent < 1.0, f"delivered {arrived - sent:.2f} s after it was put"


def test_no_busy_loop_while_a_head_of_line_waits_to_retry(server, receivers, unique):
    """Events queued behind one that waits for its retry (same target, same resource) wait quietly:
    the server does not spin while the retries last."""
    events = server.client("events")
    hook = receivers(server.data_dir / "webhook-secret", status=500)
    kind = unique("stuck")
    put_rule(events, kind, {"source": ["custom.app"], "detail-type": [kind]},
             {"Id": "hook", "Arn": hook.arn, "RetryPolicy": {"MaximumRetryAttempts": 3}})
    # Three events about one resource: the first fails and waits to be retried, two wait behind it.
    events.put_events(Entries=[{"Source": "custom.app", "DetailType": kind, "Resources": ["thing/1"],
                                "Detail": json.dumps({"n": n})} for n in range(3)])
    wait_for(hook.snapshot, timeout=5, message="the first attempt")
    before, start = cpu_seconds(server.proc.pid), time.monotonic()
    time.sleep(1.5)  # within the retries (0.25-0.5 s, 0.5-1 s, 1-2 s after each failure)
    busy = (cpu_seconds(server.proc.pid) - before) / (time.monotonic() - start)
    events.remove_targets(Rule=kind, Ids=["hook"])  # what is left is dropped at its next attempt
    assert busy < 0.3, f"the server used {busy:.0%} of a core while waiting to retry"
