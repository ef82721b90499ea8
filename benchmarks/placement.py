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
   second, RunTask call latency, the service's time until every task has a host, and the peak
   RSS of the server.

Prints one JSON object on stdout (progress on stderr). Results: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shoal import catalog  # noqa: E402
from shoal.scheduler.engine import Decision, HostInfo, HostTable, Plan  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--skip-e2e", action="store_true")
    args = parser.parse_args()
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{os.cpu_count()} vCPU, {platform.machine()}, Python {platform.python_version()}",
              "engine": bench_engine(args.hosts, args.tasks, args.seed)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
