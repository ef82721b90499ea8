"""Repair after a critical daemon dies: how fast shoal notices, replaces the host, and has the
host's tasks running again elsewhere.

Rig: a real `shoal server` (SQLite) whose local provisioner launches real `shoal agent
--simulate` processes (issue #5's local provisioner); a managed capacity provider of 3 hosts
(`shoal:min-hosts`), a critical daemon (a real `sleep` process) on each, a service of 6 tasks
spread over the hosts and one standalone task per host. Each run kills -9 the daemon's process on
one host that runs tasks, then reads the event log and the action log:

- impaired: from the kill to the host's DAEMON check IMPAIRED ("ECS Container Instance Health
  Change");
- replacement ACTIVE: from the kill to the replacement host's ACTIVE state change;
- tasks running again: from the kill until every task that was on the host runs elsewhere (the
  service's replacements and the standalone task's re-run: their RUNNING changes).

Then it waits for the fleet to be steady again (3 ACTIVE hosts, the old one terminated, the
service's deployment COMPLETED) and starts the next run. Prints one JSON object with p50/p95 of
each figure; results in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from shoal.demo.rig import Rig

CLUSTER, INSTANCE_TYPE = "fleet", "g6e.xlarge"


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def epoch(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


def managed_cluster(ecs, provider: str, hosts: int, instance_type: str) -> None:
    """The cluster, with one managed provider of `hosts` hosts (the local provisioner) as its default."""
    ecs.create_cluster(clusterName=CLUSTER)
    ecs.create_capacity_provider(
        name=provider, cluster=CLUSTER, tags=[{"key": "shoal:min-hosts", "value": str(hosts)}],
        managedInstancesProvider={
            "infrastructureRoleArn": "arn:shoal:iam::000000000000:role/x",
            "instanceLaunchTemplate": {
                "ec2InstanceProfileArn": "arn:shoal:iam::000000000000:instance-profile/x",
                "networkConfiguration": {"subnets": []},
                "instanceRequirements": {"vCpuCount": {"min": 1}, "memoryMiB": {"min": 1},
                                         "allowedInstanceTypes": [instance_type]}}})
    ecs.put_cluster_capacity_providers(cluster=CLUSTER, capacityProviders=[provider],
                                       defaultCapacityProviderStrategy=[{"capacityProvider": provider, "weight": 1}])


def setup(rig: Rig, hosts: int) -> None:
    ecs = rig.ecs
    td = ecs.register_daemon_task_definition(family="agentd", containerDefinitions=[
        {"name": "agentd", "image": "busybox", "memory": 32, "command": ["sleep", "86400"]}])["daemonTaskDefinitionArn"]
    managed_cluster(ecs, "mi", hosts, INSTANCE_TYPE)  # its hosts take seconds to start: the daemon is there first
    ecs.create_daemon(clusterArn=CLUSTER, daemonName="agentd", daemonTaskDefinitionArn=td, capacityProviderArns=["mi"])
    ecs.register_task_definition(family="web", containerDefinitions=[
        {"name": "web", "image": "busybox", "memory": 32, "command": ["sleep", "86400"]}])
    wait_for(lambda: len(active_hosts(rig)) == hosts, 120, f"{hosts} ACTIVE hosts")
    ecs.create_service(cluster=CLUSTER, serviceName="web", taskDefinition="web", desiredCount=2 * hosts,
                       placementStrategy=[{"type": "spread", "field": "instanceId"}],
                       deploymentConfiguration={"minimumHealthyPercent": 100, "maximumPercent": 200})
    for host in active_hosts(rig):
        ecs.start_task(cluster=CLUSTER, taskDefinition="web", containerInstances=[host["containerInstanceArn"]],
                       group="standalone")


def active_hosts(rig: Rig) -> list[dict]:
    arns = rig.ecs.list_container_instances(cluster=CLUSTER, status="ACTIVE")["containerInstanceArns"]
    return rig.ecs.describe_container_instances(cluster=CLUSTER, containerInstances=arns)["containerInstances"] \
        if arns else []


def steady(rig: Rig, hosts: int) -> bool:
    svc = rig.ecs.describe_services(cluster=CLUSTER, services=["web"])["services"][0]
    return (len(active_hosts(rig)) == hosts and svc["runningCount"] == 2 * hosts
            and len(svc["deployments"]) == 1 and svc["deployments"][0]["rolloutState"] == "COMPLETED"
            and not rig.ecs.list_container_instances(cluster=CLUSTER, status="DRAINING")["containerInstanceArns"])


def tasks_on(rig: Rig, host_arn: str) -> list[dict]:
    arns = rig.ecs.list_tasks(cluster=CLUSTER, containerInstance=host_arn)["taskArns"]
    return rig.ecs.describe_tasks(cluster=CLUSTER, tasks=arns)["tasks"] if arns else []


def one_run(rig: Rig, hosts: int) -> dict:
    victim = max(active_hosts(rig), key=lambda h: h["runningTasksCount"])
    on_it = tasks_on(rig, victim["containerInstanceArn"])
    [daemon] = [t for t in on_it if t["group"] == "daemon:agentd"]
    moved = [t for t in on_it if t["group"] != "daemon:agentd" and t["lastStatus"] == "RUNNING"]
    pid_file = next((rig.server_dir / "hosts" / victim["ec2InstanceId"] / "tasks" / daemon["taskArn"].rsplit("/", 1)[1])
                    .glob("*/pid"))
    before = {h["containerInstanceArn"] for h in active_hosts(rig)}
    rig.events()  # the cursor moves to now
    killed = time.time()
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    wait_for(lambda: not any(h["containerInstanceArn"] == victim["containerInstanceArn"]
                             for h in active_hosts(rig)) and steady(rig, hosts), 180, "the fleet to be steady again",
             interval=0.25)
    events = rig.events()
    impaired = min(epoch(e["detail"]["updatedAt"]) for e in events
                   if e["detail-type"] == "ECS Container Instance Health Change"
                   and e["detail"]["containerInstanceArn"] == victim["containerInstanceArn"]
                   and e["detail"]["overallStatus"] == "IMPAIRED")
    replacement_active = min(epoch(e["detail"]["updatedAt"]) for e in events
                             if e["detail-type"] == "ECS Container Instance State Change"
                             and e["detail"]["containerInstanceArn"] not in before and e["detail"]["status"] == "ACTIVE")
    # Every task that ran on the host runs again elsewhere: the service's new tasks and the
    # standalone task's re-run, each counted at its first RUNNING change.
    started = {}
    for e in events:
        d = e["detail"]
        if e["detail-type"] == "ECS Task State Change" and d["lastStatus"] == "RUNNING" \
                and d.get("containerInstanceArn") != victim["containerInstanceArn"] \
                and not d["group"].startswith("daemon:"):
            started.setdefault(d["taskArn"], epoch(d["updatedAt"]))
    new_times = sorted(started.values())
    if len(new_times) < len(moved):
        raise RuntimeError(f"{len(moved)} tasks were on the host, {len(new_times)} started elsewhere")
    return {"impaired_s": impaired - killed, "replacement_active_s": replacement_active - killed,
            "tasks_running_again_s": new_times[len(moved) - 1] - killed, "moved_tasks": len(moved)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hosts", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shoal-repair-"))
    rig = Rig(tmp)
    runs = []
    try:
        setup(rig, args.hosts)
        wait_for(lambda: steady(rig, args.hosts), 120, "the first steady state", interval=0.25)
        for i in range(args.runs):
            runs.append(one_run(rig, args.hosts))
            say(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in runs[-1].items()))
    finally:
        rig.stop()

    def stats(key: str) -> dict:
        values = [r[key] for r in runs]
        return {"p50": round(float(np.percentile(values, 50)), 3), "p95": round(float(np.percentile(values, 95)), 3),
                "max": round(max(values), 3)}

    print(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} vCPU, {platform.machine()}, Python {platform.python_version()}",
        "hosts": args.hosts, "runs": len(runs),
        "impaired_s": stats("impaired_s"), "replacement_active_s": stats("replacement_active_s"),
        "tasks_running_again_s": stats("tasks_running_again_s"),
        "moved_tasks_per_run": [r["moved_tasks"] for r in runs],
    }, indent=2))


if __name__ == "__main__":
    main()
