"""Event rule delivery: latency from a state change to a webhook, and delivery throughput, on
loopback, against a real `shoal server` (SQLite, fresh data dir).

Set-up: an HTTP receiver in this process (ThreadingHTTPServer, HTTP/1.1 keep-alive), answering
200 at once and timestamping each arrival (time.monotonic() and time.time()); it checks nothing
(signatures are the scenario tests' business). Rules, each with one webhook target to it:
`{"source":["shoal.ecs"],"detail-type":["ECS Task State Change"]}` and, for phase 2,
`{"source":["bench.load"]}`.

1. Latency. `--n` (500) RunTask calls, one at a time (boto3, retries off), of a task definition
   in a cluster with no host, so each RunTask writes exactly one event (the task, PENDING). After
   each call the client waits for that task's event at the webhook (matched by detail.taskArn)
   before the next: a closed loop, one event in flight at a time. Figures:
   - `runtask_to_webhook_ms`: from just before the RunTask call to the arrival (what a user sees);
   - `runtask_call_ms`: the RunTask round trip (the change is committed when it answers);
   - `commit_to_webhook_ms`: arrival (wall clock) - the task's `createdAt` in the event detail
     (millisecond resolution, taken by the server in the RunTask unit of work, just before its
     commit): the rule path alone, free of the client. The event's `time` has second resolution
     and is not used.
   Then `--paced` (300) more RunTask calls at a fixed `--rate` (50/s), not waiting for
   deliveries (open loop), with the same figures: events now overlap the dispatcher's work.
2. Throughput. `--burst` (2000) events by PutEvents, batches of 10, as fast as one client
   sends them; deliveries/s = events / (first PutEvents call -> last arrival). Twice: each
   entry with a resource of its own (`Resources: [thing/i]`, so nothing orders them), then with
   no Resources (all of one source: shoal sends events of one (target, resource) one at a time,
   and without resources the source is the resource).

Prints one JSON object on stdout (progress on stderr). Goal (issue): p99 runtask_to_webhook
<= 50 ms. Everything started here (the server, the receiver) is stopped at the end, on failure
too; the data dir is removed after a successful run. Results: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
from botocore.config import Config

REGION = "local"
GOAL_P99_MS = 50.0


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)  # nearest rank, as in benchmarks/api.py
    return ordered[min(len(ordered) - 1, max(0, int(p / 100 * len(ordered) + 0.5) - 1))]


def dist(ms: list[float]) -> dict:
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "min": round(min(ms), 1), "p50": round(pct(ms, 50), 1), "p90": round(pct(ms, 90), 1),
            "p99": round(pct(ms, 99), 1), "max": round(max(ms), 1), "mean": round(sum(ms) / len(ms), 1)}


def epoch(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class Receiver:
    """The webhook: records (monotonic, wall, event) per arrival; `wait(key)` blocks until the
    event with that key (detail.taskArn, else the event id) has arrived."""

    def __init__(self):
        self.cond = threading.Condition()
        self.by_key: dict[str, tuple[float, float, dict]] = {}
        self.count = 0
        self.last_mono = 0.0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                mono, wall = time.monotonic(), time.time()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                event = json.loads(body)
                key = event.get("detail", {}).get("taskArn") or event["id"]
                with receiver.cond:
                    receiver.by_key.setdefault(key, (mono, wall, event))
                    receiver.count += 1
                    receiver.last_mono = mono
                    receiver.cond.notify_all()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def arn(self) -> str:
        return f"webhook+http://127.0.0.1:{self.httpd.server_address[1]}/"

    def wait(self, key: str, timeout: float = 30.0) -> tuple[float, float, dict]:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.by_key, timeout):
                raise RuntimeError(f"no delivery of {key} within {timeout} s")
            return self.by_key[key]

    def wait_count(self, n: int, timeout: float) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.count >= n, timeout):
                raise RuntimeError(f"{self.count} of {n} deliveries within {timeout} s")

    def reset(self) -> None:
        with self.cond:
            self.by_key.clear()
            self.count = 0

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Server:
    def __init__(self, tmp: Path):
        self.dir = tmp / "server"
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "server.log"

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "shoal", "server", "--port", str(self.port), "--data-dir", str(self.dir)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.endpoint + "/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        self.creds = json.loads((self.dir / "credentials.json").read_text())

    def client(self, service: str):
        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.creds["accessKeyId"],
                            aws_secret_access_key=self.creds["secretAccessKey"],
                            config=Config(retries={"max_attempts": 1}, max_pool_connections=4))

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        except ProcessLookupError:
            pass


def latency_phase(ecs, receiver: Receiver, cluster: str, family: str, n: int, rate: float | None) -> dict:
    """n RunTask calls: closed loop (rate None: wait for each delivery) or paced at `rate`/s."""
    sent: list[tuple[str, float, float]] = []  # (taskArn, before call, after call)
    start = time.monotonic()
    for i in range(n):
        if rate:
            pause = start + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        t0 = time.monotonic()
        run = ecs.run_task(cluster=cluster, taskDefinition=family)
        t1 = time.monotonic()
        arn = run["tasks"][0]["taskArn"]
        sent.append((arn, t0, t1))
        if rate is None:
            receiver.wait(arn)
    total, call, commit = [], [], []
    for arn, t0, t1 in sent:
        mono, wall, event = receiver.wait(arn)
        total.append((mono - t0) * 1000)
        call.append((t1 - t0) * 1000)
        commit.append((wall - epoch(event["detail"]["createdAt"])) * 1000)
    return {"runtask_to_webhook_ms": dist(total), "runtask_call_ms": dist(call),
            "commit_to_webhook_ms": dist(commit),
            "slowest_runtask_to_webhook_ms": [round(x, 1) for x in sorted(total)[-5:]]}


def burst_phase(events, receiver: Receiver, n: int, own_resources: bool) -> dict:
    receiver.reset()
    t0 = time.monotonic()
    for first in range(0, n, 10):
        entries = [{"Source": "bench.load", "DetailType": "load", "Detail": json.dumps({"i": i}),
                    **({"Resources": [f"arn:aws:bench:local:0:thing/{i}"]} if own_resources else {})}
                   for i in range(first, min(n, first + 10))]
        resp = events.put_events(Entries=entries)
        assert resp["FailedEntryCount"] == 0, resp
    put_s = time.monotonic() - t0
    receiver.wait_count(n, timeout=max(120.0, n / 10))
    wall = receiver.last_mono - t0
    return {"events": n, "put_s": round(put_s, 2), "puts_per_s": round(n / put_s),
            "first_put_to_last_delivery_s": round(wall, 2), "deliveries_per_s": round(n / wall)}


def machine() -> dict:
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "kernel": platform.release(), "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=500, help="closed-loop RunTask samples")
    ap.add_argument("--paced", type=int, default=300, help="open-loop RunTask samples")
    ap.add_argument("--rate", type=float, default=50.0, help="open-loop RunTask calls per second")
    ap.add_argument("--burst", type=int, default=2000, help="events per throughput run")
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-events-"))
    server, receiver = Server(tmp), Receiver()
    ok = False
    try:
        server.start()
        ecs, events = server.client("ecs"), server.client("events")
        events.put_rule(Name="tasks", EventPattern=json.dumps(
            {"source": ["shoal.ecs"], "detail-type": ["ECS Task State Change"]}))
        events.put_targets(Rule="tasks", Targets=[{"Id": "hook", "Arn": receiver.arn}])
        events.put_rule(Name="load", EventPattern=json.dumps({"source": ["bench.load"]}))
        events.put_targets(Rule="load", Targets=[{"Id": "hook", "Arn": receiver.arn}])
        ecs.create_cluster(clusterName="bench")
        ecs.register_task_definition(family="idle", containerDefinitions=[
            {"name": "c", "image": "busybox", "memory": 32}])

        say(f"warm-up: {args.warmup} RunTask")
        latency_phase(ecs, receiver, "bench", "idle", args.warmup, None)
        cpu0 = server.cpu_seconds()
        say(f"latency, closed loop: {args.n} RunTask")
        closed = latency_phase(ecs, receiver, "bench", "idle", args.n, None)
        closed["server_cpu_ms_per_event"] = round((server.cpu_seconds() - cpu0) * 1000 / args.n, 2)
        say(f"latency, open loop: {args.paced} RunTask at {args.rate:g}/s")
        paced = latency_phase(ecs, receiver, "bench", "idle", args.paced, args.rate)
        say(f"throughput: {args.burst} events, a resource each")
        spread = burst_phase(events, receiver, args.burst, True)
        say(f"throughput: {args.burst} events, no resources (one line)")
        one_line = burst_phase(events, receiver, args.burst, False)
        p99 = closed["runtask_to_webhook_ms"]["p99"]
        print(json.dumps({
            "benchmark": "event_delivery",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(), "backend": "sqlite",
            "latency_closed_loop": closed, f"latency_open_loop_{args.rate:g}_per_s": paced,
            "throughput_resource_each": spread, "throughput_one_resource": one_line,
            "goal": {"runtask_to_webhook_p99_ms": GOAL_P99_MS, "measured_p99_ms": p99, "met": p99 <= GOAL_P99_MS},
        }, indent=2))
        ok = True
    finally:
        server.close()
        receiver.close()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            say(f"kept {tmp} (server.log there)")


if __name__ == "__main__":
    main()
