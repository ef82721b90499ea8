"""`shoal demo`: the whole story of managed daemons, MPS and who owns recovery, on simulated
p6-b200 hosts (8 simulated B200 GPUs each, one `shoal-fake-mps-control` per GPU), in one command.

1. A critical log daemon and a non-critical metrics daemon start on every host, before any
   application task.
2. MPS inference tasks share GPUs (a service on the managed provider, one on the operator's).
3. The non-critical daemon is killed on a managed host: it restarts there, nothing moves.
4. The MPS control daemon of a managed host's GPU hangs: detected, the host is replaced
   start-before-stop, its MPS tasks run elsewhere, the old host is terminated.
5. The same fault on the self-managed host: reported and fenced, left in place for the operator.

Faults go in with `shoal chaos` orders; every figure at the end is read back from the event log
and the action log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from shoal.agent.mps.fake_control import binary_path
from shoal.demo import timeline
from shoal.demo.rig import Rig, wait_for

CLUSTER, MANAGED, OWN = "demo", "gpu", "own"
INSTANCE_TYPE = "p6-b200.48xlarge"
MANAGED_HOSTS, MANAGED_TASKS, OWN_TASKS = 2, 6, 2
SHARE_MIB = 16384
SELF_MANAGED_WATCH = 5.0  # how long the demo watches the self-managed host stay in place


class Story:
    def __init__(self, rig: Rig, say: Callable[[str], None]):
        self.rig, self.ecs, self.say = rig, rig.ecs, say
        self.events: list[dict] = []
        self.figures: dict = {}

    # -- reading the cluster ----------------------------------------------------------------------
    def hosts(self, status: str | None = "ACTIVE") -> list[dict]:
        """Hosts with `status`; None: every host not yet deregistered."""
        arns = self.ecs.list_container_instances(cluster=CLUSTER, **({"status": status} if status else {}))[
            "containerInstanceArns"]
        if not arns:
            return []
        return self.ecs.describe_container_instances(cluster=CLUSTER, containerInstances=arns,
                                                     include=["CONTAINER_INSTANCE_HEALTH"])["containerInstances"]

    def tasks(self, **filters) -> list[dict]:
        arns = self.ecs.list_tasks(cluster=CLUSTER, **filters)["taskArns"]
        found = []
        for i in range(0, len(arns), 100):
            found += self.ecs.describe_tasks(cluster=CLUSTER, tasks=arns[i:i + 100])["tasks"]
        return found

    def service(self, name: str) -> dict:
        return self.ecs.describe_services(cluster=CLUSTER, services=[name])["services"][0]

    def steady(self, name: str, count: int) -> bool:
        s = self.service(name)
        return s["runningCount"] == count and len(s["deployments"]) == 1 \
            and s["deployments"][0]["rolloutState"] == "COMPLETED"

    def read_events(self) -> list[dict]:
        self.events += self.rig.events()
        return self.events

    @staticmethod
    def check(host: dict, kind: str) -> dict:
        return next(d for d in host["healthStatus"]["details"] if d["type"] == kind)

    # -- the story --------------------------------------------------------------------------------
    def setup(self) -> None:
        ecs = self.ecs
        self.say(f"1. A cluster with two capacity providers of {INSTANCE_TYPE} hosts (8 simulated B200 GPUs each):")
        ecs.create_cluster(clusterName=CLUSTER)
        ecs.create_capacity_provider(
            name=MANAGED, cluster=CLUSTER, tags=[{"key": "shoal:min-hosts", "value": str(MANAGED_HOSTS)}],
            managedInstancesProvider={
                "infrastructureRoleArn": "arn:shoal:iam::000000000000:role/demo",
                "instanceLaunchTemplate": {
                    "ec2InstanceProfileArn": "arn:shoal:iam::000000000000:instance-profile/demo",
                    "networkConfiguration": {"subnets": []},
                    "instanceRequirements": {"vCpuCount": {"min": 1}, "memoryMiB": {"min": 1},
                                             "allowedInstanceTypes": [INSTANCE_TYPE]}}})
        ecs.create_capacity_provider(name=OWN, autoScalingGroupProvider={
            "autoScalingGroupArn": "arn:shoal:autoscaling:local:000000000000:autoScalingGroup:own"})
        ecs.put_cluster_capacity_providers(cluster=CLUSTER, capacityProviders=[MANAGED, OWN],
                                           defaultCapacityProviderStrategy=[{"capacityProvider": MANAGED, "weight": 1}])
        for name, critical in (("logd", True), ("metricsd", False)):
            td = ecs.register_daemon_task_definition(family=name, containerDefinitions=[{
                "name": name, "image": "busybox", "memory": 64,
                "command": [sys.executable, "-c", "import time; time.sleep(86400)"]}])
            ecs.create_daemon(clusterArn=CLUSTER, daemonName=name, critical=critical, capacityProviderArns=[MANAGED, OWN],
                              daemonTaskDefinitionArn=td["daemonTaskDefinitionArn"])
        self.say(f"   - '{MANAGED}': managed, shoal launches {MANAGED_HOSTS} hosts and repairs them;")
        self.say(f"   - '{OWN}': self-managed, one host the operator started, the operator owns its recovery;")
        self.say("   - daemons on both: 'logd' (critical) and 'metricsd' (critical=false).")
        self.own_host = self.rig.operator_host(INSTANCE_TYPE, CLUSTER, OWN)
        wait_for(lambda: len(self.hosts()) == MANAGED_HOSTS + 1, 180, "every host ACTIVE", 0.5)
        events = self.read_events()
        for host in sorted(self.hosts(), key=lambda h: h["capacityProviderName"]):
            daemons = [t for t in self.tasks(containerInstance=host["containerInstanceArn"])
                       if t.get("group", "").startswith("daemon:")]
            active = timeline.first(events, timeline.HOST, 0, lambda d, h=host: d["containerInstanceArn"] ==
                                    h["containerInstanceArn"] and d["status"] == "ACTIVE")
            started = max(t["startedAt"].timestamp() for t in daemons)
            self.say(f"   host {host['ec2InstanceId']} ({host['capacityProviderName']}): "
                     f"{', '.join(sorted(t['group'][7:] + ' ' + t['lastStatus'] for t in daemons))}; "
                     f"ACTIVE {active - started:+.2f} s after its last daemon started")

    def share_gpus(self) -> None:
        self.say(f"\n2. MPS inference: {MANAGED_TASKS} tasks on '{MANAGED}', {OWN_TASKS} on '{OWN}', "
                 f"{SHARE_MIB // 1024} GiB of GPU memory each, real MPS clients of their GPU's daemon:")
        self.ecs.register_task_definition(family="infer", containerDefinitions=[{
            "name": "infer", "image": "busybox", "memory": 256, "stopTimeout": 2,
            "command": [binary_path(), "--client", "--", "sleep", "86400"],
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": SHARE_MIB}}}]}])
        for name, provider, count in (("infer", MANAGED, MANAGED_TASKS), ("infer-own", OWN, OWN_TASKS)):
            self.ecs.create_service(cluster=CLUSTER, serviceName=name, taskDefinition="infer", desiredCount=count,
                                    capacityProviderStrategy=[{"capacityProvider": provider, "weight": 1}],
                                    placementStrategy=[{"type": "spread", "field": "instanceId"}],
                                    deploymentConfiguration={"minimumHealthyPercent": 100, "maximumPercent": 200})
        wait_for(lambda: self.steady("infer", MANAGED_TASKS) and self.steady("infer-own", OWN_TASKS), 120,
                 "the inference services to run", 0.5)
        for host in sorted(self.hosts(), key=lambda h: h["capacityProviderName"]):
            shared = [g for g in host["gpuDevices"] if g["sharingMode"] == "NVIDIA_MPS"]
            self.say(f"   host {host['ec2InstanceId']}: " + "; ".join(
                f"GPU {self.gpu_index(host, g['gpuId'])} NVIDIA_MPS, {g['containerCount']} tasks, "
                f"{g['remainingMemoryInMiB'] // 1024} GiB left" for g in shared))

    @staticmethod
    def gpu_index(host: dict, gpu_id: str) -> int:
        gpus = next(r["stringSetValue"] for r in host["registeredResources"] if r["name"] == "GPU")
        return gpus.index(gpu_id)

    def noncritical_daemon_fails(self) -> None:
        victim = next(h for h in self.hosts() if h["capacityProviderName"] == MANAGED)
        arn, host_id = victim["containerInstanceArn"], victim["ec2InstanceId"]
        before = {t["taskArn"] for t in self.tasks(containerInstance=arn) if t["group"] == "service:infer"}
        self.say(f"\n3. The non-critical daemon 'metricsd' is killed on {host_id} "
                 f"(shoal chaos daemon --host {host_id} --daemon metricsd --kill):")
        order = self.rig.chaos(cluster=CLUSTER, host=host_id, action="daemon", daemon="metricsd", kill=True)
        at = timeline.epoch(order["requestedAt"])

        def restarted():
            return [t for t in self.tasks(containerInstance=arn, desiredStatus="RUNNING")
                    if t["group"] == "daemon:metricsd" and t["taskArn"] != order["taskArn"]
                    and t["lastStatus"] == "RUNNING"]
        [again] = wait_for(restarted, 30, "metricsd to run again", 0.2)
        host = next(h for h in self.hosts() if h["containerInstanceArn"] == arn)
        after = {t["taskArn"] for t in self.tasks(containerInstance=arn) if t["group"] == "service:infer"
                 and t["lastStatus"] == "RUNNING"}
        drained = self.ecs.list_container_instances(cluster=CLUSTER, status="DRAINING")["containerInstanceArns"]
        took = again["startedAt"].timestamp() - at
        self.say(f"   metricsd restarted on the same host after {took:.2f} s; host {host['status']}, "
                 f"overall health {host['healthStatus']['overallStatus']}; inference tasks untouched: "
                 f"{len(after & before)}/{len(before)}; hosts drained: {len(drained)}")
        self.figures["noncritical_daemon"] = {"restarted_after_s": round(took, 3), "hosts_drained": len(drained),
                                              "tasks_moved": len(before - after), "host_status": host["status"]}

    def busiest_gpu(self, provider: str) -> tuple[dict, int, list[dict]]:
        """The host of `provider` with the most MPS tasks, its busiest GPU's index, and those tasks."""
        best = None
        for host in self.hosts():
            if host["capacityProviderName"] != provider:
                continue
            tasks = [t for t in self.tasks(containerInstance=host["containerInstanceArn"], desiredStatus="RUNNING")
                     if t["group"].startswith("service:infer")]
            if best is None or len(tasks) > len(best[1]):
                best = (host, tasks)
        host, tasks = best
        gpu = max({t["containers"][0]["gpuIds"][0] for t in tasks},
                  key=lambda g: sum(t["containers"][0]["gpuIds"][0] == g for t in tasks))
        on_gpu = [t for t in tasks if t["containers"][0]["gpuIds"][0] == gpu]
        return host, self.gpu_index(host, gpu), on_gpu

    def managed_mps_hang(self, probe_interval: float) -> None:
        host, gpu, moved = self.busiest_gpu(MANAGED)
        arn, host_id = host["containerInstanceArn"], host["ec2InstanceId"]
        self.say(f"\n4. The MPS control daemon of GPU {gpu} on managed host {host_id} hangs "
                 f"(shoal chaos mps --host {host_id} --gpu {gpu} --mode hang); {len(moved)} MPS tasks use it:")
        order = self.rig.chaos(cluster=CLUSTER, host=host_id, action="mps", mode="hang", gpu=gpu)
        at = timeline.epoch(order["requestedAt"])
        wait_for(lambda: timeline.first(self.read_events(), timeline.HOST, at, lambda d: d["containerInstanceArn"] == arn
                                        and d["status"] == "INACTIVE"), 180, "the hung host to be replaced and terminated", 0.5)
        wait_for(lambda: self.steady("infer", MANAGED_TASKS) and len(
            [h for h in self.hosts() if h["capacityProviderName"] == MANAGED]) == MANAGED_HOSTS, 120,
                 "the inference service to be steady on healthy hosts", 0.5)
        events = self.read_events()
        impaired = timeline.first(events, timeline.HEALTH, at, lambda d: d["containerInstanceArn"] == arn
                                  and timeline.accelerated("IMPAIRED")(d))
        draining = timeline.first(events, timeline.HOST, at, lambda d: d["containerInstanceArn"] == arn
                                  and d["status"] == "DRAINING")
        replacement = timeline.first(events, timeline.HOST, at, lambda d: d["containerInstanceArn"] != arn
                                     and d.get("capacityProviderName") == MANAGED and d["status"] == "ACTIVE")
        terminated = timeline.first(events, timeline.HOST, at, lambda d: d["containerInstanceArn"] == arn
                                    and d["status"] == "INACTIVE")
        old = {t["taskArn"] for t in moved}
        started = sorted({e["detail"]["taskArn"]: timeline.epoch(e["detail"]["updatedAt"]) for e in events
                          if e["detail-type"] == timeline.TASK and e["detail"]["lastStatus"] == "RUNNING"
                          and e["detail"].get("group") == "service:infer" and e["detail"]["taskArn"] not in old
                          and timeline.epoch(e["detail"]["updatedAt"]) >= at}.values())
        running_again = started[len(moved) - 1] if len(started) >= len(moved) else None
        figures = {"probe_interval_s": probe_interval, "detected_s": impaired - at, "goal_detected_s":
                   3 * probe_interval + 3, "draining_s": draining - at, "replacement_active_s": replacement - at,
                   "tasks_running_again_s": None if running_again is None else running_again - at,
                   "old_host_terminated_s": terminated - at, "moved_tasks": len(moved)}
        self.figures["managed_mps_hang"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}
        self.say(f"   IMPAIRED after {impaired - at:.2f} s (goal ≤ 3 × {probe_interval:g} s + 3 s); DRAINING after "
                 f"{draining - at:.2f} s; replacement ACTIVE after {replacement - at:.2f} s; the {len(moved)} MPS tasks "
                 f"RUNNING elsewhere after {figures['tasks_running_again_s'] or float('nan'):.2f} s; "
                 f"old host terminated after {terminated - at:.2f} s")

    def self_managed_mps_hang(self, probe_interval: float) -> None:
        host, gpu, there = self.busiest_gpu(OWN)
        arn, host_id = host["containerInstanceArn"], host["ec2InstanceId"]
        self.say(f"\n5. The same fault on the self-managed host {host_id}, GPU {gpu} ({len(there)} MPS tasks):")
        order = self.rig.chaos(cluster=CLUSTER, host=host_id, action="mps", mode="hang", gpu=gpu)
        at = timeline.epoch(order["requestedAt"])

        def impaired():
            h = next(h for h in self.hosts() if h["containerInstanceArn"] == arn)
            return h if self.check(h, "ACCELERATED_COMPUTE")["status"] == "IMPAIRED" else None
        wait_for(impaired, 3 * probe_interval + 10, "the self-managed host to be reported IMPAIRED", 0.2)
        time.sleep(SELF_MANAGED_WATCH)  # a managed provider would have started its repair by now
        now = next(h for h in self.hosts(None) if h["containerInstanceArn"] == arn)
        still = [t for t in self.tasks(containerInstance=arn, desiredStatus="RUNNING") if t["taskArn"] in
                 {x["taskArn"] for x in there} and t["lastStatus"] == "RUNNING"]
        own_hosts = [h for h in self.hosts(None) if h["capacityProviderName"] == OWN]
        events = self.read_events()
        detected = timeline.first(events, timeline.HEALTH, at, lambda d: d["containerInstanceArn"] == arn
                                  and timeline.accelerated("IMPAIRED")(d))
        reason = self.check(now, "ACCELERATED_COMPUTE").get("statusReason")
        self.say(f"   IMPAIRED after {detected - at:.2f} s ({reason}); {SELF_MANAGED_WATCH:g} s later: host "
                 f"{now['status']}, {len(own_hosts)} host(s) in '{OWN}' (none launched), its {len(still)} MPS tasks "
                 f"still RUNNING, no new MPS share on GPU {gpu}. Recovery is the operator's: "
                 f"shoal explain recovery --cluster {CLUSTER} --capacity-provider {OWN}")
        self.figures["self_managed_mps_hang"] = {
            "detected_s": round(detected - at, 3), "status_after_s": {f"{SELF_MANAGED_WATCH:g}": now["status"]},
            "hosts_in_provider": len(own_hosts), "tasks_still_running": len(still), "replaced": len(own_hosts) != 1}
        self.rig.chaos(cluster=CLUSTER, host=host_id, action="mps", mode="recover", gpu=gpu)

    def timeline(self, since: float) -> list[tuple[float, str]]:
        return timeline.build(self.read_events(), self.rig.actions(CLUSTER), since)
