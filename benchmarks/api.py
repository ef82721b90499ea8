"""ECS API throughput and latency through boto3: shoal on SQLite, side by side with moto.

What is measured, and why:

* RunTask: the hot write path (validate, resolve the task definition, insert the task and its
  "ECS Task State Change" event in one committed SQLite transaction on the single writer thread).
  N calls from 2 forked client processes of 8 threads each (one boto3 process is GIL-bound near
  one core; concurrent writes share the server's group commits); throughput = calls / wall time, plus p50/p99 per-call latency.
* DescribeTasks: the hot read path, 10 task ARNs per call (drawn from the tasks just created),
  first from C client threads (throughput), then from a single client (the latency figure: no
  queueing behind other clients, so p99 shows the cost of one call).

Everything goes through real boto3 clients (SigV4 signing, botocore parameter validation and
parsing), one client per thread, created and warmed up (one call each) before the clock starts,
with retries off so that every latency is one HTTP round trip. shoal runs as a `shoal server`
subprocess on a fresh SQLite data dir. moto (the peer this project can run here) runs as
`ThreadedMotoServer` in a subprocess of its own too, so that neither server shares a GIL with the
clients. moto needs a registered container instance for EC2 tasks, so its tasks are launched as
FARGATE (with no network configuration, which moto allows); shoal's are EC2 and wait PENDING, as
there is no agent in the benchmark. The server's CPU time (from /proc) and the benchmark
process's own (the boto3 clients) are reported per call, so that client and server cost can be
told apart on a small machine where both compete for the cores.

Prints one JSON object on stdout. Goals (issue): >= 500 RunTask/s, p99 DescribeTasks <= 20 ms
(single client) on one server process. Results are recorded in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import boto3
from botocore.config import Config

MOTO_BOOT = ("import sys, time; from moto.server import ThreadedMotoServer; "
             "ThreadedMotoServer('127.0.0.1', int(sys.argv[1]), verbose=False).start(); time.sleep(1e9)")
CONTAINERS = [{"name": "main", "image": "busybox", "memory": 128, "essential": True}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, from /proc (None where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Server:
    """A server subprocess, its endpoint and how to make clients for it."""

    def __init__(self, name: str, cmd: list[str], port: int, ready_path: str, region: str, log: Path,
                 run_args: dict, credentials_file: Path | None = None):
        self.name, self.cmd, self.ready_path, self.region, self.log = name, cmd, ready_path, region, log
        self.run_args, self.credentials_file = run_args, credentials_file
        self.endpoint = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.creds = ("testing", "testing")

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start; log:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        if self.credentials_file:
            creds = json.loads(self.credentials_file.read_text())
            self.creds = (creds["accessKeyId"], creds["secretAccessKey"])

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + self.ready_path, timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def client(self, pool: int = 2):
        return boto3.client("ecs", endpoint_url=self.endpoint, region_name=self.region,
                            aws_access_key_id=self.creds[0], aws_secret_access_key=self.creds[1],
                            config=Config(retries={"max_attempts": 1}, max_pool_connections=pool))

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def shoal_server(tmp: Path) -> Server:
    data_dir, port = tmp / "shoal", free_port()
    exe = Path(sys.executable).with_name("shoal")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "shoal.cli.main"]
    return Server("shoal", [*cmd, "server", "--port", str(port), "--data-dir", str(data_dir)], port,
                  "/healthz", "local", tmp / "shoal.log", run_args={},
                  credentials_file=data_dir / "credentials.json")


def moto_server(tmp: Path) -> Server:
    port = free_port()
    return Server("moto", [sys.executable, "-c", MOTO_BOOT, str(port)], port, "/moto-api/data.json",
                  "us-east-1", tmp / "moto.log", run_args={"launchType": "FARGATE"})


def timed(clients: list, calls: int, call) -> tuple[list[float], float, list]:
    """`calls` calls of `call(client, i)` over the clients, one thread each: latencies, wall time, results."""
    latencies: list[float] = [0.0] * calls
    results: list = [None] * calls
    errors: list[BaseException] = []
    start = threading.Barrier(len(clients) + 1)

    def worker(k: int, client) -> None:
        start.wait()
        try:
            for i in range(k, calls, len(clients)):
                t0 = time.perf_counter()
                results[i] = call(client, i)
                latencies[i] = time.perf_counter() - t0
        except BaseException as err:  # reported after join, with the others stopped
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(k, c)) for k, c in enumerate(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return latencies, wall, results


def timed_in_processes(srv: "Server", processes: int, threads: int, calls: int, call):
    """`timed` spread over forked client processes, each with `threads` clients of its own.

    One Python process of boto3 clients tops out near one core (the GIL); on a 2-core machine
    that, not the server, caps a write-heavy phase. Returns latencies, wall time, results and the
    client processes' CPU time."""
    ready = multiprocessing.Barrier(processes + 1)
    out = multiprocessing.Queue()

    def child(p: int) -> None:
        clients = [srv.client() for _ in range(threads)]
        for c in clients:
            c.list_clusters()  # warm up
        mine = list(range(p, calls, processes))
        ready.wait()
        lat, _wall, res = timed(clients, len(mine), lambda c, j: call(c, mine[j]))
        out.put((mine, lat, res))

    children = [multiprocessing.Process(target=child, args=(p,)) for p in range(processes)]
    for c in children:
        c.start()
    before = os.times()
    ready.wait()
    t0 = time.perf_counter()
    latencies: list[float] = [0.0] * calls
    results: list = [None] * calls
    for _ in children:
        mine, lat, res = out.get()
        for i, latency, result in zip(mine, lat, res):
            latencies[i], results[i] = latency, result
    wall = time.perf_counter() - t0
    for c in children:
        c.join()
    after = os.times()
    client_cpu = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    return latencies, wall, results, client_cpu


def summary(latencies: list[float], wall: float, clients: int, cpu: float | None, client_cpu: float) -> dict:
    ordered = sorted(latencies)

    def pct(p: float) -> float:  # nearest rank
        return round(ordered[min(len(ordered) - 1, max(0, int(p / 100 * len(ordered) + 0.5) - 1))] * 1000, 2)

    out = {"calls": len(latencies), "clients": clients, "throughput_per_s": round(len(latencies) / wall, 1),
           "p50_ms": pct(50), "p99_ms": pct(99)}
    if cpu is not None:
        out["server_cpu_ms_per_call"] = round(cpu * 1000 / len(latencies), 3)
    out["client_cpu_ms_per_call"] = round(client_cpu * 1000 / len(latencies), 3)
    return out


def phase(srv: Server, clients: list, calls: int, call) -> tuple[dict, list]:
    cpu0, client0 = cpu_seconds(srv.proc.pid), time.process_time()
    latencies, wall, results = timed(clients, calls, call)
    cpu1, client1 = cpu_seconds(srv.proc.pid), time.process_time()
    cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return summary(latencies, wall, len(clients), cpu, client1 - client0), results


def bench(srv: Server, args) -> dict:
    setup = srv.client()
    cluster = setup.create_cluster(clusterName="bench")["cluster"]["clusterArn"]
    td = setup.register_task_definition(
        family="bench", containerDefinitions=CONTAINERS, cpu="256", memory="512", requiresCompatibilities=["EC2"],
    )["taskDefinition"]["taskDefinitionArn"]
    clients = [srv.client() for _ in range(args.clients)]
    for c in clients:  # warm up: connection, credentials, the service model's first load
        c.describe_clusters(clusters=[cluster])

    cpu0 = cpu_seconds(srv.proc.pid)
    latencies, wall, results, client_cpu = timed_in_processes(
        srv, args.client_processes, args.runtask_clients, args.runtask, lambda c, i: c.run_task(
            cluster=cluster, taskDefinition=td, count=1, startedBy="bench", **srv.run_args)["tasks"])
    cpu1 = cpu_seconds(srv.proc.pid)
    run = summary(latencies, wall, args.client_processes * args.runtask_clients,
                  cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None, client_cpu)
    results = [{"tasks": r} for r in results]
    task_arns = [r["tasks"][0]["taskArn"] for r in results]
    rng = random.Random(42)
    batches = [rng.sample(task_arns, min(10, len(task_arns))) for _ in range(args.describe)]

    def describe(c, i):
        got = c.describe_tasks(cluster=cluster, tasks=batches[i])
        if len(got["tasks"]) != len(batches[i]):
            raise RuntimeError(f"{srv.name}: DescribeTasks returned {len(got['tasks'])} of {len(batches[i])}")

    many, _ = phase(srv, clients[:args.clients], args.describe, describe)
    single, _ = phase(srv, clients[:1], args.describe, describe)
    return {"runtask": run, "describe_tasks": many, "describe_tasks_single_client": single}


def run_target(make, tmp: Path, args) -> dict:
    srv = make(tmp)
    try:
        srv.start()
        return bench(srv, args)
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runtask", type=int, default=2000, help="RunTask calls (default 2000)")
    ap.add_argument("--describe", type=int, default=2000, help="DescribeTasks calls per phase (default 2000)")
    ap.add_argument("--clients", type=int, default=4,
                    help="concurrent DescribeTasks client threads (default 4, see BENCHMARKS.md)")
    ap.add_argument("--runtask-clients", type=int, default=8,
                    help="RunTask client threads per client process (default 8)")
    ap.add_argument("--client-processes", type=int, default=2,
                    help="RunTask client processes (default 2: one boto3 process is GIL-bound near one core)")
    ap.add_argument("--no-moto", action="store_true", help="skip the moto side")
    args = ap.parse_args()
    if min(args.runtask, args.describe, args.clients, args.runtask_clients, args.client_processes) < 1:
        ap.error("--runtask, --describe, --clients, --runtask-clients and --client-processes must be at least 1")

    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_1m_at_start": round(os.getloadavg()[0], 2)},
    }
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        report["shoal"] = run_target(shoal_server, Path(tmp), args)
        if args.no_moto:
            report["moto"] = {"skipped": "--no-moto"}
        else:
            try:
                import moto.server  # noqa: F401  (only to see whether it is there)
            except ImportError as err:
                report["moto"] = {"skipped": f"moto is not installed ({err}); pip install -e '.[bench]'"}
            else:
                report["moto"] = run_target(moto_server, Path(tmp), args)
    ours = report["shoal"]
    report["goals"] = {"runtask_per_s_500": ours["runtask"]["throughput_per_s"] >= 500,
                       "describe_p99_20ms": ours["describe_tasks_single_client"]["p99_ms"] <= 20}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
