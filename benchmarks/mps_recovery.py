"""MPS faults on managed GPU hosts: how fast shoal notices a crashed or hung MPS control daemon,
and how fast the MPS tasks that were on the host run again elsewhere.

Rig: a real `shoal server` (SQLite) whose local provisioner launches real `shoal agent
--simulate` processes (simulated GPUs, each with its own `shoal-fake-mps-control` daemon, probed
every `--probe-interval` seconds); a managed capacity provider of 3 single-GPU hosts and a
service of 6 MPS tasks (4 GiB each) spread over them. Each run faults the MPS control daemon of
the busiest host, alternately:

- crash: kill -9 of the daemon's process (the agent sees the exit at once);
- hang: the fake's `hang` knob (connections accepted, never answered: 3 probes must time out);

then reads the event log: detection = the host's ACCELERATED_COMPUTE IMPAIRED ("ECS Container
Instance Health Change"); tasks running again = as many new MPS tasks RUNNING as there were on
the host (a hang: the repair drains the host and the service replaces its tasks start-before-
stop; a crash: its clients die with it, the agent restarts the daemon at once, and the service
replaces them, on the host itself if the daemon answers again before a repair starts).
It waits for the fleet to be steady again before the next run. Prints one JSON object with
p50/p95 per figure; results in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from repair import CLUSTER, Rig, active_hosts, epoch, managed_cluster, say, tasks_on, wait_for  # noqa: E402

INSTANCE_TYPE = "g6e.xlarge"  # one L40S (45 GiB): every MPS task of a host shares its one GPU
TASKS = 6


def setup(rig: Rig, hosts: int) -> None:
    ecs = rig.ecs
    managed_cluster(ecs, "gpu", hosts, INSTANCE_TYPE)
    ecs.register_task_definition(family="infer", containerDefinitions=[{
        "name": "infer", "image": "busybox", "memory": 64, "command": ["sleep", "86400"],
        "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 4096}}}]}])
    wait_for(lambda: len(active_hosts(rig)) == hosts, 120, f"{hosts} ACTIVE hosts")
    ecs.create_service(cluster=CLUSTER, serviceName="infer", taskDefinition="infer", desiredCount=TASKS,
                       placementStrategy=[{"type": "spread", "field": "instanceId"}],
                       deploymentConfiguration={"minimumHealthyPercent": 100, "maximumPercent": 200})


def steady(rig: Rig, hosts: int) -> bool:
    svc = rig.ecs.describe_services(cluster=CLUSTER, services=["infer"])["services"][0]
    return (len(active_hosts(rig)) == hosts and svc["runningCount"] == TASKS and len(svc["deployments"]) == 1
            and svc["deployments"][0]["rolloutState"] == "COMPLETED"
            and not rig.ecs.list_container_instances(cluster=CLUSTER, status="DRAINING")["containerInstanceArns"])


def pipe_dir(rig: Rig, host: dict) -> Path:
    [gpu] = host["gpuDevices"]
    return rig.server_dir / "hosts" / host["ec2InstanceId"] / "mps" / gpu["gpuId"] / "pipe"


def fault(rig: Rig, host: dict, kind: str) -> float:
    pipe = pipe_dir(rig, host)
    at = time.time()
    if kind == "crash":
        os.kill(int((pipe / "nvidia-cuda-mps-control.pid").read_text()), signal.SIGKILL)
    else:
        (pipe / "shoal-fake-knobs.json").write_text(json.dumps({"hang": True}))
    return at


def one_run(rig: Rig, hosts: int, kind: str) -> dict:
    victim = max(active_hosts(rig), key=lambda h: h["runningTasksCount"])
    moved = [t for t in tasks_on(rig, victim["containerInstanceArn"]) if t["lastStatus"] == "RUNNING"]
    rig.events()  # the cursor moves to now
    at = fault(rig, victim, kind)
    # A hang has the host replaced; a crash restarts the daemon at once, which may answer again
    # before a repair starts: then the host stays, and the service replaces the killed tasks.
    events: list[dict] = []

    def impaired_at() -> float | None:
        events.extend(rig.events())
        return min((epoch(e["detail"]["updatedAt"]) for e in events
                    if e["detail-type"] == "ECS Container Instance Health Change"
                    and e["detail"]["containerInstanceArn"] == victim["containerInstanceArn"]
                    and any(c["type"] == "ACCELERATED_COMPUTE" and c["status"] == "IMPAIRED"
                            for c in e["detail"]["healthChecks"])), default=None)

    impaired = wait_for(impaired_at, 60, "the fault to be detected", interval=0.1)
    wait_for(lambda: steady(rig, hosts), 180, "the fleet to be steady again", interval=0.25)
    events.extend(rig.events())
    replaced = any(e["detail-type"] == "ECS Container Instance State Change" and e["detail"]["status"] == "INACTIVE"
                   and e["detail"]["containerInstanceArn"] == victim["containerInstanceArn"] for e in events)
    before = {t["taskArn"] for t in moved}
    started = sorted({d["taskArn"]: epoch(d["updatedAt"]) for e in events
                      if e["detail-type"] == "ECS Task State Change" and (d := e["detail"])["lastStatus"] == "RUNNING"
                      and d["taskArn"] not in before}.values())
    if len(started) < len(moved):
        raise RuntimeError(f"{len(moved)} MPS tasks were on the host, {len(started)} started elsewhere")
    return {"kind": kind, "detected_s": impaired - at, "tasks_running_again_s": started[len(moved) - 1] - at,
            "moved_tasks": len(moved), "host_replaced": replaced}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each fault kind")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--probe-interval", type=float, default=1.0)
    args = parser.parse_args()
    os.environ["SHOAL_MPS_PROBE_INTERVAL"] = str(args.probe_interval)  # the hosts' agents inherit it
    tmp = Path(tempfile.mkdtemp(prefix="shoal-mps-"))
    rig = Rig(tmp)
    runs = []
    try:
        setup(rig, args.hosts)
        wait_for(lambda: steady(rig, args.hosts), 120, "the first steady state", interval=0.25)
        for i in range(2 * args.runs):
            runs.append(one_run(rig, args.hosts, "crash" if i % 2 == 0 else "hang"))
            say(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in runs[-1].items()))
    finally:
        rig.stop()

    def stats(kind: str | None, key: str) -> dict:
        values = [r[key] for r in runs if kind in (None, r["kind"])]
        return {"p50": round(float(np.percentile(values, 50)), 3), "p95": round(float(np.percentile(values, 95)), 3),
                "max": round(max(values), 3)}

    print(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} vCPU, {platform.machine()}, Python {platform.python_version()}",
        "hosts": args.hosts, "runs_per_kind": args.runs, "probe_interval_s": args.probe_interval,
        "crash_detected_s": stats("crash", "detected_s"), "hang_detected_s": stats("hang", "detected_s"),
        "hang_goal_s": 3 * args.probe_interval + 3,
        "tasks_running_again_s": stats(None, "tasks_running_again_s"),
        "moved_tasks_per_run": [r["moved_tasks"] for r in runs],
        "hosts_replaced": {kind: sum(r["host_replaced"] for r in runs if r["kind"] == kind) for kind in ("crash", "hang")},
    }, indent=2))


if __name__ == "__main__":
    main()
