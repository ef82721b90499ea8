"""An MPS control daemon hangs on managed GPU hosts (issue #6): real `shoal agent --simulate`
hosts from the local provisioner, each GPU with its own `shoal-fake-mps-control`, probed every
second. Two of five hosts hang at once: each is reported IMPAIRED within 3 probe intervals (+3 s),
they are replaced one at a time (fewer than 9 hosts: at most 1 draining), the MPS service keeps
its tasks RUNNING on healthy GPUs, and the old hosts are terminated."""

from __future__ import annotations

import datetime
import json
import os
import time

import pytest

from shoal.agent.mps.fake_control import binary_path
from tests.scenarios.test_daemon_repair import actions, hosts, instance_changes, managed_provider, max_draining, serve
from tests.support import wait_for

PROBE = 1.0
pytestmark = pytest.mark.skipif(not os.access(binary_path(), os.X_OK), reason="shoal-fake-mps-control not installed")


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_MPS_PROBE_INTERVAL", str(PROBE))  # the hosts' agents inherit it
    yield from serve(tmp_path)


def when(detail: dict) -> float:
    return datetime.datetime.fromisoformat(detail["updatedAt"].replace("Z", "+00:00")).timestamp()


def test_mps_hangs_on_two_of_five_managed_hosts_are_repaired_one_at_a_time(server):
    ecs = managed_provider(server, 5)
    wait_for(lambda: len(hosts(ecs, "ACTIVE")) == 5, timeout=90, interval=0.5, message="5 ACTIVE hosts")
    ecs.register_task_definition(family="infer", containerDefinitions=[{
        "name": "infer", "image": "busybox", "memory": 64, "command": ["sleep", "600"],
        "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 4096}}}]}])
    ecs.create_service(cluster="fleet", serviceName="infer", taskDefinition="infer", desiredCount=5,
                       placementStrategy=[{"type": "spread", "field": "instanceId"}],
                       deploymentConfiguration={"minimumHealthyPercent": 100, "maximumPercent": 200})
    wait_for(lambda: ecs.describe_services(cluster="fleet", services=["infer"])["services"][0]["deployments"][0][
        "rolloutState"] == "COMPLETED", timeout=60, message="the MPS service running and healthy")

    victims = hosts(ecs, "ACTIVE")[:2]
    hung_at = time.time()
    for host in victims:
        [gpu] = host["gpuDevices"]
        pipe = server.data_dir / "hosts" / host["ec2InstanceId"] / "mps" / gpu["gpuId"] / "pipe"
        (pipe / "shoal-fake-knobs.json").write_text(json.dumps({"hang": True}))

    gone = {h["containerInstanceArn"] for h in victims}
    wait_for(lambda: gone <= {c["containerInstanceArn"] for c in instance_changes(server) if c["status"] == "INACTIVE"},
             timeout=120, interval=0.5, message="both hung hosts to be replaced and terminated")
    events = server.events()
    for arn in gone:
        impaired = min(when(e["detail"]) for e in events if e["detail-type"] == "ECS Container Instance Health Change"
                       and e["detail"]["containerInstanceArn"] == arn and e["detail"]["overallStatus"] == "IMPAIRED")
        assert impaired - hung_at <= 3 * PROBE + 3
    assert max_draining(server) == 1
    assert sum(a["eventName"] == "REPAIR_WAITING" for a in actions(server)) >= 1
    # The service runs its 5 tasks on hosts whose MPS daemon answers.
    wait_for(lambda: ecs.describe_services(cluster="fleet", services=["infer"])["services"][0]["runningCount"] == 5,
             timeout=30, message="5 MPS tasks running")
    arns = ecs.list_tasks(cluster="fleet", serviceName="infer", desiredStatus="RUNNING")["taskArns"]
    placed = {t["containerInstanceArn"] for t in ecs.describe_tasks(cluster="fleet", tasks=arns)["tasks"]}
    assert not placed & gone and len(hosts(ecs, "ACTIVE")) == 5
