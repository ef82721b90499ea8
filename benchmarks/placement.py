"""Placement at fleet scale: 10,000 simulated hosts and 100,000 tasks, the engine alone and end
to end through the ECS API with the store.

The fleet (the same in both phases): 60 % CPU-only hosts (64 vCPU, 256 GiB), 20 % 8-GPU hosts
(p6-b200.48xlarge, 8 × B200) and 20 % MPS-capable hosts (p5en.48xlarge, 8 × H200, attribute
ecs.capability.gpu-sharing-mps), dealt over three availability zones. The tasks: 70 % CPU-only
(1 vCPU, 2 GiB), 10 % one whole GPU (8 vCPU, 64 GiB) and 20 % one 8 GiB MPS share (1 vCPU,
8 GiB). Every task is placed with spread over `attribute:ecs.availability-zone`, then binpack
on memory, and one memberOf constraint that selects its kind of host.

1. engine: `shoal.scheduler.engine.HostTable` in this process, the tasks placed one by one, in a
   shuffled order; each decision is timed (p50, p99). Peak RSS of this process after the phase.
2. end to end: a real `shoal server` (SQLite) and `shoal sim` (a separate process emulating the
   hosts through the agent protocol); the hosts join, then `--e2e-tasks` tasks are placed
   (a) by RunTask calls of count 10 from `--clients` boto3 threads, and (b) by one CreateService
   whose desiredCount is the rest, as a service scale-up does. Reported: tasks placed per
   second of each part and of the whole (every task placed, over the time both parts took),
   RunTask call latency, the services' time until every task has a host, and the peak RSS of
   the server. RunTask throughput depends on how many calls are in flight: the server commits
   the calls that arrive together as one batch, so a few callers pay a commit (and a poll per
   host) for few tasks. The default, 32 callers, is about where this machine peaks (see
   BENCHMARKS.md for the curve); `--clients` changes it.

Prints one JSON object on stdout (progress on stderr). Results: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import httpx
import numpy as np
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shoal import catalog  # noqa: E402
from shoal.scheduler.engine import Decision, HostTable, Plan  # noqa: E402
from shoal.scheduler.hosts import HostInfo  # noqa: E402
from shoal.scheduler.resources import Demand  # noqa: E402

ZONES = ("az-1", "az-2", "az-3")
MPS_ATTRIBUTE = "ecs.capability.gpu-sharing-mps"
CPU_HOST = ("cpu.16xlarge", 64, 256)  # a CPU-only host: name, vCPUs, GiB
STRATEGY = [{"type": "spread", "field": "attribute:ecs.availability-zone"}, {"type": "binpack", "field": "memory"}]
KINDS = {  # task kind -> (share of tasks, demand, memberOf)
    "cpu": (0.7, dict(cpu=1024, memory=2048), "attribute:ecs.instance-type == cpu.16xlarge"),
    "gpu": (0.1, dict(cpu=8192, memory=65536, whole_gpus={"main": 1}),
            "attribute:ecs.instance-type == p6-b200.48xlarge"),
    "mps": (0.2, dict(cpu=1024, memory=8192, mps_memory={"main": 8192}, required_attributes=(MPS_ATTRIBUTE,)),
            "attribute:ecs.availability-zone in [az-1, az-2, az-3]"),
}


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fleet(hosts: int) -> list[tuple[str, int]]:
    """(instance type, count) for the mix."""
    gpu = mps = hosts // 5
    return [(CPU_HOST[0], hosts - gpu - mps), ("p6-b200.48xlarge", gpu), ("p5en.48xlarge", mps)]


def host_infos(hosts: int) -> list[HostInfo]:
    out = []
    for instance_type, count in fleet(hosts):
        if instance_type == CPU_HOST[0]:
            cpu, memory, gpus = CPU_HOST[1] * 1024, CPU_HOST[2] * 1024, []
        else:
            spec = catalog.get(instance_type)
            cpu, memory, gpus = spec.vcpus * 1024, int(spec.memory_gib * 1024), [spec.gpu.memory_mib] * spec.gpu.count
        for _ in range(count):
            n = len(out)
            attributes = {"ecs.instance-type": instance_type, "ecs.availability-zone": ZONES[n % 3]}
            if instance_type == "p5en.48xlarge":
                attributes[MPS_ATTRIBUTE] = None
            out.append(HostInfo(f"host-{n}", 1, "ACTIVE", True, None, cpu, memory, frozenset({"22"}), frozenset(),
                                [(f"GPU-{n}-{g}", m) for g, m in enumerate(gpus)], attributes, registered_at=n))
    return out


def task_kinds(tasks: int, seed: int) -> list[str]:
    kinds = [k for k, (share, _, _) in KINDS.items() for _ in range(round(share * tasks))]
    random.Random(seed).shuffle(kinds)
    return kinds[:tasks]


def percentile(values: list[float], p: float) -> float:
    return float(np.percentile(values, p)) if values else float("nan")


def bench_engine(hosts: int, tasks: int, seed: int) -> dict:
    say(f"engine: {hosts} hosts, {tasks} tasks")
    table = HostTable(rng=random.Random(seed))
    started = time.perf_counter()
    for host in host_infos(hosts):
        table.upsert(host)
    load_s = time.perf_counter() - started
    plans = {k: Plan.compile({"placementStrategy": STRATEGY,
                              "placementConstraints": [{"type": "memberOf", "expression": expr}]})
             for k, (_, _, expr) in KINDS.items()}
    demands = {k: Demand(**fields, group=f"service:{k}") for k, (_, fields, _) in KINDS.items()}
    latencies, unplaced = [], 0
    clock = time.perf_counter
    started = clock()
    for n, kind in enumerate(task_kinds(tasks, seed)):
        t0 = clock()
        decision = table.place(f"task-{n}", demands[kind], plans[kind])
        latencies.append(clock() - t0)
        unplaced += not isinstance(decision, Decision)
    elapsed = clock() - started
    return {
        "hosts": hosts, "tasks": tasks, "placed": tasks - unplaced, "unplaced": unplaced,
        "load_hosts_s": round(load_s, 3),
        "placements_per_s": round((tasks - unplaced) / elapsed),
        "decision_p50_us": round(percentile(latencies, 50) * 1e6, 1),
        "decision_p99_us": round(percentile(latencies, 99) * 1e6, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


# --- end to end ------------------------------------------------------------------------------------

REGION, CLUSTER = "local", "bench"
SERVICE_MAX = 5000  # ECS's most tasks per service


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shoal_exe() -> list[str]:
    exe = Path(sys.executable).with_name("shoal")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "shoal.cli.main"]


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) used so far by process `pid`, or by this one."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(rig: "Rig") -> dict[str, float]:
    """CPU seconds used so far by the server, the fleet emulator and this process (the clients)."""
    return {name: cpu_seconds(pid) for name, pid in (("server", rig.server.pid), ("fleet", rig.sim.pid),
                                                      ("clients", None))}


def cpu_since(rig: "Rig", before: dict[str, float]) -> dict[str, float]:
    now = cpu_snapshot(rig)
    return {name: round(now[name] - before[name], 1) for name in now}


def cpu_use(rig: "Rig", run) -> tuple[object, dict]:
    """Run `run()`; return its result and the CPU seconds each process spent meanwhile."""
    before = cpu_snapshot(rig)
    result = run()
    return result, cpu_since(rig, before)


def peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


class Rig:
    """A `shoal server` (SQLite) and a `shoal sim` fleet for it, both child processes."""

    def __init__(self, tmp: Path, hosts: int, start_delay: float = 0.2):
        self.tmp, self.hosts, self.port, self.start_delay = tmp, hosts, free_port(), start_delay
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.data = tmp / "server"
        # Idle simulated hosts long-poll every 60 s (the server's longest wait): the agent
        # timeout must be longer.
        self.server = subprocess.Popen([*shoal_exe(), "server", "--port", str(self.port), "--data-dir",
                                        str(self.data), "--agent-timeout", "150"],
                                       stdout=open(tmp / "server.log", "ab"), stderr=subprocess.STDOUT)
        self.sim: subprocess.Popen | None = None
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {(tmp / 'server.log').read_text()[-2000:]}")
            time.sleep(0.05)
        self.creds = json.loads((self.data / "credentials.json").read_text())

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/healthz", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def client(self, pool: int = 2):
        return boto3.client("ecs", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.creds["accessKeyId"],
                            aws_secret_access_key=self.creds["secretAccessKey"],
                            config=Config(retries={"max_attempts": 1}, max_pool_connections=pool,
                                          read_timeout=300))

    def start_fleet(self) -> float:
        """Start `shoal sim` with the benchmark's mix; return seconds until every host is ACTIVE."""
        hosts = []
        for instance_type, count in fleet(self.hosts):
            hosts += ["--hosts", f"{instance_type}:{count}" + (f":{CPU_HOST[1]}:{CPU_HOST[2]}"
                                                                if instance_type == CPU_HOST[0] else "")]
        log = open(self.tmp / "sim.log", "ab")
        token = (self.data / "join-token").read_text().strip()
        started = time.monotonic()
        self.sim = subprocess.Popen([*shoal_exe(), "sim", "--server", self.endpoint, "--cluster", CLUSTER, *hosts,
                                     "--zones", ",".join(ZONES), "--poll-wait", "60", "--stats-every", "5",
                                     "--start-delay", str(self.start_delay)],
                                    stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SHOAL_JOIN_TOKEN": token})
        while "hosts ACTIVE after" not in (self.tmp / "sim.log").read_text():
            if self.sim.poll() is not None or time.monotonic() - started > 900:
                raise RuntimeError(f"the fleet did not come up: {(self.tmp / 'sim.log').read_text()[-2000:]}")
            time.sleep(0.5)
        return time.monotonic() - started

    def events(self, after: str | None) -> tuple[list[dict], str | None]:
        found, cursor = [], after
        signer = SigV4Auth(Credentials(self.creds["accessKeyId"], self.creds["secretAccessKey"]), "ecs", REGION)
        with httpx.Client(timeout=60) as http:
            while True:
                params = {"limit": 1000, **({"after": cursor} if cursor else {})}
                url = str(httpx.URL(self.endpoint + "/v1/events", params=params))
                request = AWSRequest(method="GET", url=url)
                signer.add_auth(request)
                page = http.get(url, headers=dict(request.headers.items())).raise_for_status().json()
                if not page["events"] or page["cursor"] == cursor:
                    return found, cursor
                found += page["events"]
                cursor = page["cursor"]

    def stop(self) -> None:
        for proc in (self.sim, self.server):
            if proc and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _placed_at(events: list[dict], group_prefix: str) -> dict[str, float]:
    """Task ARN -> epoch seconds of the change that gave it a host (its first such event), for
    the tasks whose group starts with `group_prefix`."""
    out = {}
    for event in events:
        detail = event["detail"]
        if event["detail-type"] == "ECS Task State Change" and detail.get("containerInstanceArn") \
                and detail.get("group", "").startswith(group_prefix):
            when = datetime.datetime.fromisoformat(detail["updatedAt"].replace("Z", "+00:00")).timestamp()
            out.setdefault(detail["taskArn"], when)
    return out


def register_definitions(ecs) -> dict[str, str]:
    families = {}
    for kind, (_, fields, _) in KINDS.items():
        container = {"name": "main", "image": "sim", "cpu": fields["cpu"], "memory": fields["memory"]}
        if "whole_gpus" in fields:
            container["resourceRequirements"] = [{"type": "GPU", "value": "1"}]
        if "mps_memory" in fields:
            container["resourceRequirements"] = [{"type": "GPU", "sharingStrategy": {
                "nvidiaMps": {"memory": fields["mps_memory"]["main"]}}}]
        # An MPS share makes the definition require ecs.capability.gpu-sharing-mps by itself.
        families[kind] = ecs.register_task_definition(family=f"bench-{kind}", containerDefinitions=[container]
                                                      )["taskDefinition"]["taskDefinitionArn"]
    return families


def constraints(kind: str) -> list[dict]:
    return [{"type": "memberOf", "expression": KINDS[kind][2]}]


def bench_run_task(rig: Rig, families: dict, tasks: int, clients: int, seed: int) -> dict:
    """Tasks placed by RunTask calls of count 10, from `clients` threads."""
    ecs = [rig.client() for _ in range(clients)]
    kinds = task_kinds(tasks // 10, seed)
    latencies: list[float] = []

    def call(i: int) -> int:
        kind = kinds[i]
        t0 = time.perf_counter()
        resp = ecs[i % clients].run_task(cluster=CLUSTER, taskDefinition=families[kind], count=10,
                                         placementStrategy=STRATEGY, placementConstraints=constraints(kind),
                                         group=f"run:{kind}")
        latencies.append(time.perf_counter() - t0)
        return sum(1 for t in resp["tasks"] if t.get("containerInstanceArn"))

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        placed = sum(pool.map(call, range(len(kinds))))
    elapsed = time.perf_counter() - started
    return {"tasks": len(kinds) * 10, "placed_at_once": placed, "clients": clients, "elapsed_s": round(elapsed, 2),
            "placements_per_s": round(placed / elapsed), "call_p50_ms": round(percentile(latencies, 50) * 1000, 1),
            "call_p99_ms": round(percentile(latencies, 99) * 1000, 1)}


def bench_services(rig: Rig, families: dict, tasks: int) -> dict:
    """Tasks placed by service scale-ups: CreateService calls (desiredCount up to 5,000 each) for
    `tasks` in all, split by kind; timed until the last one has a host (from the event log).
    CPU is counted from the first call until every task exists, not while this benchmark reads
    the event log (the whole log first, for its end: 10,000 hosts' and the RunTask phase's)."""
    ecs = rig.client()
    _, cursor = rig.events(None)
    cpu_before = cpu_snapshot(rig)
    desired = {}
    for kind, (share, _, _) in KINDS.items():
        left, n = round(share * tasks), 0
        while left > 0:
            desired[f"svc-{kind}-{n}"] = (kind, min(left, SERVICE_MAX))
            left, n = left - SERVICE_MAX, n + 1
    started = time.time()
    for name, (kind, count) in desired.items():
        ecs.create_service(cluster=CLUSTER, serviceName=name, taskDefinition=families[kind], desiredCount=count,
                           placementStrategy=STRATEGY, placementConstraints=constraints(kind))
    calls_done = time.time() - started
    total, deadline = sum(c for _, c in desired.values()), time.monotonic() + 900
    names = list(desired)
    while time.monotonic() < deadline:  # every task created (each is placed as it is created)
        time.sleep(2)
        created = sum(s["runningCount"] + s["pendingCount"] for i in range(0, len(names), 10)
                      for s in ecs.describe_services(cluster=CLUSTER, services=names[i:i + 10])["services"])
        if created >= total:
            break
    cpu = cpu_since(rig, cpu_before)
    events, _ = rig.events(cursor)  # the log is the record of when each task got its host
    placed = _placed_at(events, "service:svc-")
    last = max(placed.values(), default=started)
    return {"services": len(desired), "tasks": total, "placed": len(placed),
            "create_calls_s": round(calls_done, 2), "all_placed_after_s": round(last - started, 2),
            "placements_per_s": round(len(placed) / max(last - started, 1e-9)), "cpu_s": cpu}


def bench_e2e(hosts: int, run_task_tasks: int, service_tasks: int, clients: int, seed: int,
              start_delay: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="shoal-placement-"))
    rig = Rig(tmp, hosts, start_delay)
    try:
        rig.client().create_cluster(clusterName=CLUSTER)
        say(f"end to end: {hosts} simulated hosts joining")
        active_after = rig.start_fleet()
        say(f"all hosts ACTIVE after {active_after:.1f} s")
        families = register_definitions(rig.client())
        say(f"RunTask: {run_task_tasks} tasks, count 10, {clients} clients")
        run_task, cpu = cpu_use(rig, lambda: bench_run_task(rig, families, run_task_tasks, clients, seed))
        run_task["cpu_s"] = cpu
        say(f"services: {service_tasks} tasks")
        services = bench_services(rig, families, service_tasks)
        placed = run_task["placed_at_once"] + services["placed"]
        return {"hosts": hosts, "task_start_delay_s": start_delay,
                "fleet_active_after_s": round(active_after, 1),
                "placements_per_s": round(placed / (run_task["elapsed_s"] + services["all_placed_after_s"])),
                "run_task": run_task,
                "services": services, "server_peak_rss_mib": peak_rss_mib(rig.server.pid),
                "sim_peak_rss_mib": peak_rss_mib(rig.sim.pid)}
    finally:
        rig.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks placed by the engine alone")
    parser.add_argument("--e2e-tasks", type=int, default=100_000,
                        help="tasks placed end to end: half by RunTask, half by services")
    parser.add_argument("--clients", type=int, default=32, help="RunTask calls in flight (boto3 threads)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--start-delay", type=float, default=0.2,
                        help="the simulated hosts start a placed task within this many seconds; a long delay "
                             "measures placement without the fleet's RUNNING reports")
    parser.add_argument("--skip-e2e", action="store_true")
    args = parser.parse_args()
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{os.cpu_count()} vCPU, {platform.machine()}, Python {platform.python_version()}",
              "engine": bench_engine(args.hosts, args.tasks, args.seed)}
    if not args.skip_e2e:
        half = args.e2e_tasks // 2
        result["end_to_end"] = bench_e2e(args.hosts, half, args.e2e_tasks - half, args.clients, args.seed,
                                         args.start_delay)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
