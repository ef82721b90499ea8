"""EventBridge rule matching: shoal's RuleIndex against moto's matcher, one workload.

Workload (seeded, so every run is the same): 1,000 rules of the shapes people write for ECS
events — source + detail-type exact, then detail.* exact values, clusterArn prefixes,
anything-but stop codes, numeric container exit codes (an array of objects), exists, resources
ARNs, some `$or`, a few equals-ignore-case / suffix / wildcard — over "ECS Task State Change",
"ECS Container Instance State Change", "ECS Service Action", "ECS Deployment State Change" and
the daemon events; and 100,000 ECS-shaped events, most of them from clusters no rule names, so
that a minority (reported) matches at least one rule.

Measured, on one core in this process:
* shoal: `RuleIndex.match(event)` for each of the 100,000 events (one pass, after one warm-up
  pass over the first 2,000), events per second;
* moto: `EventPattern.load(rule).matches_event(event)` for all 1,000 rules per event, on the
  first `--moto-events` events only (moto needs ~1,000 matcher calls per event), events per
  second on that subset; the ratio is shoal's rate over moto's (rates only are extrapolated,
  never results);
* agreement on that subset: events whose set of matching rules differs, and rule/event pairs that
  differ, by rule shape. moto does not descend into arrays of objects (containers[].exitCode),
  which accounts for its disagreements here; they are reported, not treated as failures.

Prints one JSON object. Goals: >= 50,000 events/s against 1,000 rules, >= 20x moto.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
import uuid
from collections import Counter

from shoal.events.patterns import RuleIndex, compile_pattern

ACCOUNT = "123456789012"
REGIONS = ["us-east-1", "us-west-2", "eu-west-1"]
TASK = "ECS Task State Change"
INSTANCE = "ECS Container Instance State Change"
SERVICE_ACTION = "ECS Service Action"
DEPLOYMENT = "ECS Deployment State Change"
DAEMON_ACTION = "ECS Daemon Service Action"
DAEMON_DEPLOYMENT = "ECS Daemon Deployment State Change"
STOP_CODES = ["EssentialContainerExited", "TaskFailedToStart", "UserInitiated",
              "ServiceSchedulerInitiated", "SpotInterruption", "TerminationNotice"]
STATUSES = ["PROVISIONING", "PENDING", "ACTIVATING", "RUNNING", "DEACTIVATING", "STOPPING",
            "DEPROVISIONING", "STOPPED"]
DAEMON_EVENTS = ["DAEMON_TASK_START_IMPAIRED", "DAEMON_TASK_STOPPED", "DAEMON_TASK_RUNNING",
                 "DAEMON_PLACEMENT_FAILED"]
SERVICE_EVENTS = ["SERVICE_STEADY_STATE", "SERVICE_TASK_PLACEMENT_FAILURE",
                  "SERVICE_TASK_START_IMPAIRED", "CAPACITY_PROVIDER_STEADY_STATE"]
DEPLOYMENT_EVENTS = ["SERVICE_DEPLOYMENT_IN_PROGRESS", "SERVICE_DEPLOYMENT_COMPLETED",
                     "SERVICE_DEPLOYMENT_FAILED"]


def cluster_arn(region: str, name: str) -> str:
    return f"arn:aws:ecs:{region}:{ACCOUNT}:cluster/{name}"


def make_rules(rng: random.Random, clusters: list[str]) -> list[tuple[str, dict]]:
    """(shape, pattern) x 1,000."""
    rules = []
    base = {"source": ["aws.ecs"]}

    def task(detail):
        return {**base, "detail-type": [TASK], "detail": detail}

    for i in range(1000):
        region = rng.choice(REGIONS)
        name = rng.choice(clusters)
        arn = cluster_arn(region, name)
        shape = rng.choices(
            ["task-stopped-on-cluster", "task-failed", "task-service-group", "task-exit-code",
             "task-or", "instance-not-active", "instance-agent-disconnected", "service-action",
             "deployment-failed", "daemon-action", "daemon-deployment", "task-resources",
             "task-misc-operators"],
            weights=[20, 12, 10, 8, 8, 8, 4, 8, 6, 6, 4, 4, 2])[0]
        if shape == "task-stopped-on-cluster":
            pattern = task({"clusterArn": [{"prefix": arn[: rng.choice([-2, -1, len(arn)])]}],
                            "lastStatus": ["STOPPED"]})
        elif shape == "task-failed":
            pattern = task({"clusterArn": [arn], "lastStatus": ["STOPPED"],
                            "stopCode": [{"anything-but": ["UserInitiated", "ServiceSchedulerInitiated"]}]})
        elif shape == "task-service-group":
            pattern = task({"group": [f"service:{name}-svc{rng.randrange(5)}"],
                            "desiredStatus": ["STOPPED"], "lastStatus": ["RUNNING", "STOPPED"]})
        elif shape == "task-exit-code":
            pattern = task({"clusterArn": [arn],
                            "containers": {"exitCode": [{"numeric": [">", 0]}]},
                            "stoppedReason": [{"exists": True}]})
        elif shape == "task-or":
            pattern = {**base, "detail-type": [TASK], "detail": {
                "clusterArn": [{"prefix": arn}],
                "$or": [{"stopCode": ["TaskFailedToStart", "SpotInterruption"]},
                        {"containers": {"exitCode": [{"numeric": [">=", 137, "<=", 143]}]}}]}}
        elif shape == "instance-not-active":
            pattern = {**base, "detail-type": [INSTANCE],
                       "detail": {"clusterArn": [arn], "status": [{"anything-but": "ACTIVE"}]}}
        elif shape == "instance-agent-disconnected":
            pattern = {**base, "detail-type": [INSTANCE],
                       "detail": {"clusterArn": [{"prefix": arn}], "agentConnected": [False]}}
        elif shape == "service-action":
            pattern = {**base, "detail-type": [SERVICE_ACTION], "resources": [
                {"prefix": f"arn:aws:ecs:{region}:{ACCOUNT}:service/{name}/"}],
                "detail": {"eventName": rng.sample(SERVICE_EVENTS, 2), "eventType": ["WARN", "ERROR"]}}
        elif shape == "deployment-failed":
            pattern = {**base, "detail-type": [DEPLOYMENT],
                       "detail": {"eventName": ["SERVICE_DEPLOYMENT_FAILED"],
                                  "clusterArn": [arn]}}
        elif shape == "daemon-action":
            pattern = {"source": ["aws.ecs", "shoal.ecs"], "detail-type": [DAEMON_ACTION],
                       "detail": {"eventName": [rng.choice(DAEMON_EVENTS)], "clusterArn": [arn]}}
        elif shape == "daemon-deployment":
            pattern = {**base, "detail-type": [DAEMON_DEPLOYMENT],
                       "detail": {"clusterArn": [{"prefix": arn}], "eventName": [
                           {"anything-but": {"prefix": "SERVICE_DEPLOYMENT_IN"}}]}}
        elif shape == "task-resources":
            pattern = task({"lastStatus": ["STOPPED"]}) | {"resources": [
                {"prefix": f"arn:aws:ecs:{region}:{ACCOUNT}:task/{name}/"}]}
        else:  # a few of the rarer operators
            pattern = task({"clusterArn": [{"suffix": f"/{name}"}],
                            "launchType": [{"equals-ignore-case": "ec2"}],
                            "taskDefinitionArn": [{"wildcard": f"*:task-definition/{name}-*"}]})
        rules.append((shape, pattern))
    return rules


def make_event(rng: random.Random, known: list[str], unknown: list[str], i: int) -> dict:
    region = rng.choice(REGIONS)
    name = rng.choice(known) if rng.random() < 0.35 else rng.choice(unknown)
    arn = cluster_arn(region, name)
    kind = rng.choices([TASK, INSTANCE, SERVICE_ACTION, DEPLOYMENT, DAEMON_ACTION, DAEMON_DEPLOYMENT],
                       weights=[60, 15, 8, 7, 6, 4])[0]
    envelope = {"version": "0", "id": str(uuid.UUID(int=rng.getrandbits(128))), "detail-type": kind,
                "source": "aws.ecs", "account": ACCOUNT, "time": f"2026-01-01T00:{i % 60:02d}:00Z",
                "region": region}
    if kind == TASK:
        task_id = f"{i:032x}"
        status = rng.choice(STATUSES)
        stopped = status == "STOPPED"
        containers = [{
            "containerArn": f"arn:aws:ecs:{region}:{ACCOUNT}:container/{name}/{task_id}/{c}",
            "lastStatus": status, "name": f"c{c}", "image": "nvcr.io/nvidia/pytorch:25.01",
            "taskArn": f"arn:aws:ecs:{region}:{ACCOUNT}:task/{name}/{task_id}",
            "networkInterfaces": [], "cpu": "0", "gpuIds": [str(c)],
            **({"exitCode": rng.choice([0, 0, 1, 137, 139])} if stopped else {}),
        } for c in range(rng.randint(1, 3))]
        detail = {
            "attachments": [], "attributes": [{"name": "ecs.cpu-architecture", "value": "x86_64"}],
            "availabilityZone": f"{region}a", "clusterArn": arn, "containers": containers,
            "containerInstanceArn": f"arn:aws:ecs:{region}:{ACCOUNT}:container-instance/{name}/{i:x}",
            "createdAt": "2026-01-01T00:00:00Z", "launchType": rng.choice(["EC2", "EXTERNAL"]),
            "cpu": "1024", "memory": "4096", "desiredStatus": rng.choice(["RUNNING", "STOPPED"]),
            "group": f"service:{name}-svc{rng.randrange(8)}", "lastStatus": status,
            "overrides": {"containerOverrides": [{"name": "c0"}]}, "connectivity": "CONNECTED",
            "taskArn": f"arn:aws:ecs:{region}:{ACCOUNT}:task/{name}/{task_id}",
            "taskDefinitionArn": f"arn:aws:ecs:{region}:{ACCOUNT}:task-definition/{name}-train:{i % 9}",
            "updatedAt": "2026-01-01T00:00:01Z", "version": rng.randint(1, 6),
        }
        if stopped:
            detail["stopCode"] = rng.choice(STOP_CODES)
            detail["stoppedReason"] = "Essential container in task exited"
            detail["stoppedAt"] = "2026-01-01T00:00:02Z"
        resources = [detail["taskArn"]]
    elif kind == INSTANCE:
        detail = {"agentConnected": rng.random() < 0.9, "clusterArn": arn,
                  "containerInstanceArn": f"arn:aws:ecs:{region}:{ACCOUNT}:container-instance/{name}/{i:x}",
                  "ec2InstanceId": f"i-{i:017x}", "status": rng.choice(["ACTIVE", "ACTIVE", "DRAINING"]),
                  "registeredResources": [{"name": "GPU", "type": "STRINGSET",
                                           "stringSetValue": ["0", "1", "2", "3"]},
                                          {"name": "CPU", "type": "INTEGER", "integerValue": 192}],
                  "versionInfo": {"agentVersion": "1.90.0"}, "version": rng.randint(1, 50)}
        resources = [detail["containerInstanceArn"]]
    else:
        events = {SERVICE_ACTION: SERVICE_EVENTS, DEPLOYMENT: DEPLOYMENT_EVENTS}.get(kind, DAEMON_EVENTS)
        detail = {"eventType": rng.choice(["INFO", "WARN", "ERROR"]), "eventName": rng.choice(events),
                  "clusterArn": arn, "createdAt": "2026-01-01T00:00:00Z"}
        resources = [f"arn:aws:ecs:{region}:{ACCOUNT}:service/{name}/{name}-svc{rng.randrange(8)}"]
    return {**envelope, "resources": resources, "detail": detail}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--moto-events", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    known = [f"gpu-{k:02d}" for k in range(50)]
    unknown = [f"team-{k:03d}" for k in range(400)]
    rules = make_rules(rng, known)
    events = [make_event(rng, known, unknown, i) for i in range(args.events)]

    index = RuleIndex()
    t0 = time.perf_counter()
    for n, (_, pattern) in enumerate(rules):
        index.add(f"rule-{n}", compile_pattern(json.dumps(pattern)))
    index.match(events[0])  # builds the per-path indexes
    build_s = time.perf_counter() - t0

    for event in events[:2000]:  # warm-up
        index.match(event)
    matched_events = total_matches = 0
    t0, c0 = time.perf_counter(), time.process_time()
    results = []
    for event in events:
        found = index.match(event)
        results.append(found)
    shoal_s, shoal_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    for found in results:
        matched_events += bool(found)
        total_matches += len(found)

    from moto.events.models import EventPattern

    moto_rules = [(f"rule-{n}", EventPattern.load(json.dumps(pattern))) for n, (_, pattern) in enumerate(rules)]
    subset = events[: args.moto_events]
    t0 = time.perf_counter()
    moto_results = [{rid for rid, p in moto_rules if p.matches_event(event)} for event in subset]
    moto_s = time.perf_counter() - t0

    shape_of = {f"rule-{n}": shape for n, (shape, _) in enumerate(rules)}
    differing_events = 0
    pairs: Counter = Counter()
    for ours, theirs in zip(results, moto_results):
        if ours != theirs:
            differing_events += 1
            for rid in ours ^ theirs:
                pairs[f"{shape_of[rid]} ({'shoal only' if rid in ours else 'moto only'})"] += 1

    shoal_rate = len(events) / shoal_s
    moto_rate = len(subset) / moto_s
    print(json.dumps({
        "workload": {"rules": len(rules), "events": len(events), "seed": args.seed,
                     "rule_shapes": dict(Counter(shape for shape, _ in rules)),
                     "events_matching_some_rule": round(matched_events / len(events), 4),
                     "rule_matches_total": total_matches},
        "shoal": {"events_per_s": round(shoal_rate), "seconds": round(shoal_s, 3),
                  "cpu_seconds": round(shoal_cpu_s, 3),
                  "us_per_event": round(1e6 * shoal_s / len(events), 2),
                  "index_build_s": round(build_s, 3), "sub_rules": sum(len(compile_pattern(p).subrules) for _, p in rules)},
        "moto": {"version": __import__("moto").__version__, "events": len(subset),
                 "note": "moto run on the first events only; its rate is extrapolated, never its results",
                 "events_per_s": round(moto_rate, 1), "seconds": round(moto_s, 3),
                 "extrapolated_s_for_all_events": round(len(events) / moto_rate, 1)},
        "speedup_vs_moto": round(shoal_rate / moto_rate, 1),
        "agreement_on_moto_subset": {"events_compared": len(subset), "events_differing": differing_events,
                                     "rule_event_pairs_differing": sum(pairs.values()),
                                     "by_rule_shape": dict(pairs)},
        "goals": {"events_per_s>=50000": shoal_rate >= 50_000, "speedup>=20": shoal_rate / moto_rate >= 20},
        "python": platform.python_version(), "machine": platform.machine(),
    }, indent=2))


if __name__ == "__main__":
    sys.exit(main())
