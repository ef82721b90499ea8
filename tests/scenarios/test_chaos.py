"""`shoal chaos` on real agents, and what a fault on self-managed capacity does (issue #6).

A real server, a real `shoal agent` with four simulated GPUs (`--fake-gpus`) on a self-managed
capacity provider, one real `shoal-fake-mps-control` daemon per GPU. The faults are injected the
way an operator would, with `shoal chaos …` through the control plane and the host's agent; the
rest is the ordinary path: detection, events, the action log, fencing, no repair.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from shoal.agent.mps.fake_control import binary_path
from tests.agent_support import AgentProcess
from tests.scenarios.test_agent_mps import _kill_mps_daemons
from tests.support import ServerProcess, kill_workloads, shoal_cli, wait_for

PY = sys.executable
INTERVAL = 1.0  # the agent's --mps-probe-interval
HEALTH_CHANGE = "ECS Container Instance Health Change"
pytestmark = pytest.mark.skipif(not os.access(binary_path(), os.X_OK), reason="shoal-fake-mps-control is not installed")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A self-managed provider with one 4-GPU host and a non-critical daemon on it."""
    root = tmp_path_factory.mktemp("chaos")
    server = ServerProcess(root / "server").start()
    ecs = server.client()
    ecs.create_cluster(clusterName="drill")
    ecs.create_capacity_provider(name="own", autoScalingGroupProvider={
        "autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:own"})
    ecs.put_cluster_capacity_providers(cluster="drill", capacityProviders=["own"], defaultCapacityProviderStrategy=[])
    td = ecs.register_daemon_task_definition(family="logd", containerDefinitions=[
        {"name": "logd", "image": "busybox", "memory": 32, "command": [PY, "-c", "import time; time.sleep(600)"]}])
    ecs.create_daemon(clusterArn="drill", daemonName="logd", critical=False, capacityProviderArns=["own"],
                      daemonTaskDefinitionArn=td["daemonTaskDefinitionArn"])
    spec = root / "gpus.json"
    spec.write_text(json.dumps({"model": "NVIDIA H100", "count": 4, "memoryMiB": 81920}))
    agent = AgentProcess(server, root / "host", ("--capacity-provider", "own", "--fake-gpus", str(spec),
                                                 "--mps-probe-interval", str(INTERVAL)), cluster="drill").start()
    agent.wait_active(ecs)
    try:
        yield server, ecs, agent, root
    finally:
        agent.stop()
        agent.kill_leftovers()
        _kill_mps_daemons(agent.data_dir.resolve())
        server.stop()
        kill_workloads(root)


def describe(ecs, agent) -> dict:
    return ecs.describe_container_instances(cluster="drill", containerInstances=[agent.arn],
                                            include=["CONTAINER_INSTANCE_HEALTH"])["containerInstances"][0]


def accelerated(ecs, agent) -> dict:
    return next(d for d in describe(ecs, agent)["healthStatus"]["details"] if d["type"] == "ACCELERATED_COMPUTE")


def task_def(ecs, family: str, gpu: dict) -> str:
    return ecs.register_task_definition(family=family, containerDefinitions=[{
        "name": "c", "image": "busybox", "memory": 32, "stopTimeout": 2,
        "command": [PY, "-c", "import time; time.sleep(600)"],
        "resourceRequirements": [{"type": "GPU", **gpu}]}])["taskDefinition"]["taskDefinitionArn"]


def run(ecs, td: str) -> dict:
    out = ecs.run_task(cluster="drill", taskDefinition=td)
    assert out["failures"] == [], out["failures"]
    return out["tasks"][0]


def running(ecs, arn: str) -> dict:
    def check():
        t = ecs.describe_tasks(cluster="drill", tasks=[arn])["tasks"][0]
        assert t["lastStatus"] != "STOPPED", t.get("stoppedReason")
        return t if t["lastStatus"] == "RUNNING" else None
    return wait_for(check, timeout=20, message=f"{arn} RUNNING")


def chaos(server, root, *args: str, code: int = 0) -> str:
    out = shoal_cli(server, root, "chaos", *args, "--cluster", "drill", code=code)
    return out.stdout + out.stderr


def actions(server, root) -> list[dict]:
    return json.loads(shoal_cli(server, root, "actions", "list", "--cluster", "drill", "--json").stdout)


def test_an_mps_hang_on_self_managed_capacity_is_reported_fenced_and_left_in_place(fleet):
    server, ecs, agent, root = fleet
    host_id = describe(ecs, agent)["ec2InstanceId"]
    gpus = [d["gpuId"] for d in describe(ecs, agent)["gpuDevices"]]
    share, whole = task_def(ecs, "share", {"sharingStrategy": {"nvidiaMps": {"memory": 8192}}}), \
        task_def(ecs, "whole", {"value": "1"})
    first = run(ecs, share)
    dedicated = run(ecs, whole)
    [hung_gpu], [whole_gpu] = running(ecs, first["taskArn"])["containers"][0]["gpuIds"], \
        running(ecs, dedicated["taskArn"])["containers"][0]["gpuIds"]
    assert hung_gpu != whole_gpu

    started = time.time()
    said = chaos(server, root, "mps", "--host", host_id, "--mode", "hang", "--gpu", str(gpus.index(hung_gpu)))
    assert "DONE" in said and "never answers" in said, said

    # detected within 3 probe intervals (and a probe's timeout), reported with the probe error
    check = wait_for(lambda: (lambda c: c if c["status"] == "IMPAIRED" else None)(accelerated(ecs, agent)),
                     timeout=3 * INTERVAL + 5, interval=0.05, message="ACCELERATED_COMPUTE IMPAIRED")
    assert time.time() - started < 3 * INTERVAL + 3 + 2  # + the CLI's round trip
    assert "no answer to" in check["statusReason"], check
    impaired = [e for e in server.events() if e["detail-type"] == HEALTH_CHANGE and any(
        c["type"] == "ACCELERATED_COMPUTE" and c["status"] == "IMPAIRED" for c in e["detail"]["healthChecks"])]
    assert len(impaired) == 1, impaired
    names = [a["eventName"] for a in actions(server, root)]
    assert names.index("CHAOS_REQUESTED") < names.index("CHAOS_DONE") < names.index("ACCELERATED_COMPUTE_IMPAIRED")

    # no new MPS share on the hung GPU; whole-GPU work on the other GPUs goes on and still lands
    second = running(ecs, run(ecs, share)["taskArn"])
    assert second["containers"][0]["gpuIds"] != [hung_gpu]
    another = running(ecs, run(ecs, whole)["taskArn"])
    assert another["containers"][0]["gpuIds"][0] not in (hung_gpu, whole_gpu)
    assert running(ecs, dedicated["taskArn"])["containers"][0]["gpuIds"] == [whole_gpu]
    assert running(ecs, first["taskArn"]), "a hung control daemon leaves running clients alone"

    # self-managed: the operator owns recovery. Two tasks started since it was reported (seconds;
    # a managed provider starts its repair within a second), and nothing drained or was replaced.
    hosts = ecs.list_container_instances(cluster="drill")["containerInstanceArns"]
    assert hosts == [agent.arn] and describe(ecs, agent)["status"] == "ACTIVE"
    assert not [a for a in actions(server, root) if "REPAIR" in a["eventName"] or "DRAIN" in a["eventName"]]

    # the operator lifts the fault: one good probe and the GPU takes MPS work again
    assert "DONE" in chaos(server, root, "mps", "--host", host_id, "--mode", "recover",
                           "--gpu", str(gpus.index(hung_gpu)))
    wait_for(lambda: accelerated(ecs, agent)["status"] == "OK", timeout=INTERVAL + 5, message="OK again")
    third = running(ecs, run(ecs, share)["taskArn"])
    assert third["containers"][0]["gpuIds"] == [hung_gpu], "packing: the fullest GPU with room"
    for arn in (first["taskArn"], dedicated["taskArn"], second["taskArn"], another["taskArn"], third["taskArn"]):
        ecs.stop_task(cluster="drill", task=arn)


def test_chaos_kills_a_daemon_task_and_raises_xids(fleet):
    server, ecs, agent, root = fleet
    host_id = describe(ecs, agent)["ec2InstanceId"]
    [daemon_task] = ecs.list_tasks(cluster="drill", startedBy=ecs.list_daemons(clusterArn="drill")[
        "daemonSummariesList"][0]["daemonArn"])["taskArns"]
    said = chaos(server, root, "daemon", "--host", agent.arn.rsplit("/", 1)[-1], "--daemon", "logd", "--kill")
    assert "DONE" in said and "killed daemon logd" in said, said
    stopped = wait_for(lambda: (lambda t: t if t["lastStatus"] == "STOPPED" else None)(
        ecs.describe_tasks(cluster="drill", tasks=[daemon_task])["tasks"][0]), timeout=10, message="daemon task stopped")
    assert stopped["containers"][0]["exitCode"] == 137, stopped
    # the daemon scheduler starts it again (backoff 1 s)
    wait_for(lambda: [t for t in ecs.list_tasks(cluster="drill", desiredStatus="RUNNING")["taskArns"]
                      if t != daemon_task and ecs.describe_tasks(cluster="drill", tasks=[t])["tasks"][0]
                      .get("group") == "daemon:logd"], timeout=15, message="a new daemon task")

    # an Xid outside the watched set is logged only; one in it impairs the check for good. The
    # agent takes Xids in order, so once XID_79 shows, Xid 13 was handled: it changed nothing.
    position = len(server.events())
    assert "Xid 13 raised" in chaos(server, root, "xid", "--host", host_id, "--gpu", "1", "--xid", "13")
    assert "Xid 79 raised" in chaos(server, root, "xid", "--host", host_id, "--gpu", "1", "--xid", "79")
    check = wait_for(lambda: (lambda c: c if c["status"] == "IMPAIRED" else None)(accelerated(ecs, agent)),
                     timeout=5, message="XID_79")
    assert check["statusReason"] == "XID_79"
    reasons = [c.get("statusReason") for e in server.events()[position:] if e["detail-type"] == HEALTH_CHANGE
               for c in e["detail"]["healthChecks"] if c["type"] == "ACCELERATED_COMPUTE" and c["status"] == "IMPAIRED"]
    assert set(reasons) == {"XID_79"}, reasons
    assert describe(ecs, agent)["status"] == "ACTIVE"  # self-managed: reported, left in place


def test_chaos_refuses_what_it_cannot_do_and_names_the_field(fleet):
    server, ecs, agent, root = fleet
    host_id = describe(ecs, agent)["ec2InstanceId"]
    for args, field in [(("mps", "--host", host_id, "--mode", "melt"), "'mode'"),
                        (("mps", "--host", host_id, "--mode", "crash", "--gpu", "4"), "'gpu'"),
                        (("mps", "--host", "i-nope", "--mode", "crash"), "'host'"),
                        (("daemon", "--host", host_id, "--daemon", "nope", "--kill"), "'daemon'")]:
        said = chaos(server, root, *args, code=1)
        assert "InvalidParameterException" in said and field in said, said
    assert "--kill" in chaos(server, root, "daemon", "--host", host_id, "--daemon", "logd", code=2)
