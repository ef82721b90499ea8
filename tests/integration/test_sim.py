"""Simulated fleets against a real server: fifty emulated hosts in three zones register through
the agent protocol and become ACTIVE with their catalog resources and GPUs; tasks placed on them
run and end as the task model says; StopTask stops one; idle hosts stay connected past the
server's agent timeout, and a silenced one does not; a host reports an impaired check and
recovers. `shoal sim` does the same from the shell.

One server (with a short --agent-timeout) and one fleet for the module; each test has its own
task definitions.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from shoal import catalog
from shoal.sim import HostSpec, SimFleet, TaskModel
from tests.support import ServerProcess, wait_for

AGENT_TIMEOUT = 3.0  # seconds without a poll before the server marks a host disconnected
POLL_WAIT = 1.5      # below AGENT_TIMEOUT, as it must be
ZONES = ["az-a", "az-b", "az-c"]
CLUSTER = "sim"
MODEL = TaskModel(run_time=1.0, start_delay=(0.1, 0.3), failure_rate=0.4, failure_exit_code=3, seed=11)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("shoal-sim"), extra_args=("--agent-timeout", str(AGENT_TIMEOUT)))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def ecs(server):
    client = server.client()
    client.create_cluster(clusterName=CLUSTER)
    return client


def join_token(server) -> str:
    return (server.data_dir / "join-token").read_text().strip()


@pytest.fixture(scope="module")
def fleet(server, ecs):
    specs = [HostSpec("p5.48xlarge", 20, zones=ZONES, attributes={"team": "ml"}),
             HostSpec("g6e.xlarge", 30, zones=ZONES)]
    with SimFleet(server.endpoint, join_token(server), CLUSTER, specs, MODEL, poll_wait=POLL_WAIT) as sim:
        sim.wait_active_blocking(timeout=20)
        sim.started = time.monotonic()
        yield sim


def describe_hosts(ecs, arns: list[str]) -> list[dict]:
    found = []
    for i in range(0, len(arns), 100):
        found += ecs.describe_container_instances(cluster=CLUSTER, containerInstances=arns[i:i + 100],
                                                  include=["CONTAINER_INSTANCE_HEALTH"])["containerInstances"]
    return found


def describe_tasks(ecs, arns: list[str]) -> list[dict]:
    return ecs.describe_tasks(cluster=CLUSTER, tasks=arns)["tasks"]


def attrs(host: dict) -> dict:
    return {a["name"]: a.get("value") for a in host["attributes"]}


def resource(host: dict, name: str):
    [r] = [r for r in host["registeredResources"] if r["name"] == name]
    return r.get("integerValue", r.get("stringSetValue"))


def test_fifty_hosts_in_three_zones_become_active_with_catalog_resources_and_gpus(fleet, ecs):
    listed = ecs.list_container_instances(cluster=CLUSTER, status="ACTIVE", maxResults=100)["containerInstanceArns"]
    assert sorted(listed) == sorted(fleet.arns) and len(listed) == 50
    hosts = describe_hosts(ecs, fleet.arns)
    zones = collections.Counter()
    for host in hosts:
        sim = fleet.host(host["containerInstanceArn"])
        a, spec = attrs(host), catalog.get(sim.instance_type)
        assert host["ec2InstanceId"] == sim.host_id
        assert host["status"] == "ACTIVE" and host["agentConnected"] is True
        assert host["healthStatus"]["overallStatus"] == "OK"
        assert {d["type"] for d in host["healthStatus"]["details"]} == {
            "CONTAINER_RUNTIME", "ACCELERATED_COMPUTE", "DAEMON", "AGENT_CONNECTIVITY"}
        assert a["ecs.instance-type"] == sim.instance_type
        assert a["ecs.availability-zone"] == sim.zone
        assert a["shoal.simulated"] == "true"
        assert "ecs.capability.gpu-sharing-mps" in a, "simulated GPUs come with simulated MPS"
        assert a.get("team") == ("ml" if sim.instance_type == "p5.48xlarge" else None)
        assert resource(host, "CPU") == spec.vcpus * 1024
        assert resource(host, "MEMORY") == int(spec.memory_gib * 1024)
        gpus = resource(host, "GPU")
        assert len(gpus) == spec.gpu.count == len(host["gpuDevices"])
        assert {d["gpuId"] for d in host["gpuDevices"]} == set(gpus)
        assert all(d["totalMemoryInMiB"] == spec.gpu.memory_mib for d in host["gpuDevices"])
        zones[sim.zone] += 1
    # Round-robin per spec: 20 p5 hosts deal 7/7/6, 30 g6e hosts 10/10/10.
    assert zones == {"az-a": 17, "az-b": 17, "az-c": 16}
    all_gpus = [g for h in hosts for g in resource(h, "GPU")]
    assert len(all_gpus) == len(set(all_gpus)) == 20 * 8 + 30, "every simulated GPU has a uuid of its own"


def test_tasks_run_and_stop_as_the_model_says(fleet, ecs, server):
    ecs.register_task_definition(family="batch", containerDefinitions=[
        {"name": "main", "memory": 64, "command": ["train"]},
        {"name": "sidecar", "memory": 32, "command": ["log"], "essential": False}])
    arns = [t["taskArn"] for t in ecs.run_task(cluster=CLUSTER, taskDefinition="batch", count=10)["tasks"]]
    assert len(arns) == 10
    done = wait_for(lambda: (lambda ts: all(t["lastStatus"] == "STOPPED" for t in ts) and ts)(
        describe_tasks(ecs, arns)), timeout=15, message="ten simulated tasks to run and end")
    for task in done:
        outcome = MODEL.outcome(task["taskArn"])
        containers = {c["name"]: c for c in task["containers"]}
        assert task["stopCode"] == "EssentialContainerExited"
        assert containers["main"]["exitCode"] == outcome.exit_code
        assert containers["sidecar"]["exitCode"] == MODEL.stop_exit_code, "the agent stops the rest"
        ran = (task["stoppedAt"] - task["startedAt"]).total_seconds()
        assert 0.9 <= ran < 5, ran

    statuses = collections.defaultdict(list)
    for event in server.events():
        if event["detail-type"] == "ECS Task State Change" and event["detail"]["taskArn"] in arns:
            statuses[event["detail"]["taskArn"]].append(event["detail"]["lastStatus"])
    for arn in arns:
        assert statuses[arn][-2:] == ["RUNNING", "STOPPED"] and statuses[arn][0] in ("PROVISIONING", "PENDING"), \
            statuses[arn]


def test_stop_task_stops_a_simulated_task_that_would_run_forever(fleet, ecs):
    ecs.register_task_definition(family="service", containerDefinitions=[
        {"name": "web", "memory": 64, "command": ["serve"],
         "environment": [{"name": "SHOAL_SIM_RUN_TIME", "value": "forever"}]}])
    [task] = ecs.run_task(cluster=CLUSTER, taskDefinition="service")["tasks"]
    arn = task["taskArn"]
    wait_for(lambda: describe_tasks(ecs, [arn])[0]["lastStatus"] == "RUNNING", timeout=10, message="RUNNING")
    assert any(arn in h.tasks for h in fleet.hosts)
    ecs.stop_task(cluster=CLUSTER, task=arn, reason="enough")
    stopped = wait_for(lambda: (lambda t: t["lastStatus"] == "STOPPED" and t)(describe_tasks(ecs, [arn])[0]),
                       timeout=10, message="the stopped task to be STOPPED")
    assert stopped["stopCode"] == "UserInitiated" and stopped["stoppedReason"] == "enough"
    assert stopped["containers"][0]["exitCode"] == MODEL.stop_exit_code


def test_idle_hosts_stay_connected_past_the_agent_timeout_and_a_silenced_one_does_not(fleet, ecs):
    # The condition is time itself: two agent timeouts since every host became ACTIVE.
    time.sleep(max(0.0, fleet.started + 2 * AGENT_TIMEOUT - time.monotonic()))
    silent = fleet.hosts[-1]
    fleet.silence(silent.host_id)
    hosts = describe_hosts(ecs, fleet.arns)
    assert all(h["agentConnected"] for h in hosts), [h["ec2InstanceId"] for h in hosts if not h["agentConnected"]]
    wait_for(lambda: not describe_hosts(ecs, [silent.arn])[0]["agentConnected"], timeout=AGENT_TIMEOUT + 5,
             message="the silenced host's agent to be marked disconnected")
    others = describe_hosts(ecs, fleet.arns[:-1])
    assert all(h["agentConnected"] for h in others)


def test_a_simulated_host_reports_an_impaired_check_and_recovers(fleet, ecs):
    host = fleet.hosts[0]

    def gpu_check() -> dict:
        [h] = describe_hosts(ecs, [host.arn])
        return next(d for d in h["healthStatus"]["details"] if d["type"] == "ACCELERATED_COMPUTE")

    fleet.set_health(host.host_id, "ACCELERATED_COMPUTE", "IMPAIRED", "Xid 79: GPU has fallen off the bus")
    impaired = wait_for(lambda: (lambda c: c["status"] == "IMPAIRED" and c)(gpu_check()), timeout=10,
                        message="ACCELERATED_COMPUTE to be IMPAIRED")
    assert impaired["statusReason"].startswith("Xid 79")
    fleet.set_health(host.host_id, "ACCELERATED_COMPUTE", "OK")
    wait_for(lambda: gpu_check()["status"] == "OK", timeout=10, message="ACCELERATED_COMPUTE to be OK again")


def test_shoal_sim_command_runs_a_fleet_until_interrupted(server, ecs):
    ecs.create_cluster(clusterName="cli")
    proc = subprocess.Popen(
        [sys.executable, "-m", "shoal", "sim", "--server", server.endpoint, "--cluster", "cli",
         "--hosts", "g5.xlarge:3", "--hosts", "p4d.24xlarge:2", "--hosts", "cpu.large:1:4:16",
         "--zones", "x,y", "--run-time", "1",
         "--poll-wait", str(POLL_WAIT), "--prefix", "cli-sim", "--stats-every", "1"],
        env={**os.environ, "SHOAL_JOIN_TOKEN": join_token(server)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("all 6 hosts ACTIVE" in line for line in lines), timeout=20,
                 message="`shoal sim` to say that its six hosts are ACTIVE")
        assert len(ecs.list_container_instances(cluster="cli", status="ACTIVE")["containerInstanceArns"]) == 6
        hosts = describe_hosts_in(ecs, "cli")
        assert sorted(h["ec2InstanceId"] for h in hosts) == [f"cli-sim-{i:05d}" for i in range(6)]
        assert collections.Counter(attrs(h)["ecs.availability-zone"] for h in hosts) == {"x": 4, "y": 2}
        [cpu_only] = [h for h in hosts if attrs(h)["ecs.instance-type"] == "cpu.large"]  # NAME:COUNT:VCPUS:GIB
        assert (resource(cpu_only, "CPU"), resource(cpu_only, "MEMORY")) == (4 * 1024, 16 * 1024)
        assert cpu_only["gpuDevices"] == [] and "ecs.capability.gpu-sharing-mps" not in attrs(cpu_only)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
        reader.join(5)
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert "6 hosts registered" in out and "stopped; the hosts stay registered" in out, out


def describe_hosts_in(ecs, cluster: str) -> list[dict]:
    arns = ecs.list_container_instances(cluster=cluster)["containerInstanceArns"]
    return ecs.describe_container_instances(cluster=cluster, containerInstances=arns)["containerInstances"]


def test_shoal_sim_refuses_an_unknown_instance_type_and_names_close_ones():
    result = subprocess.run([sys.executable, "-m", "shoal", "sim", "--server", "http://127.0.0.1:9",
                             "--join-token", "t", "--hosts", "p5.48xl:3"], capture_output=True, text=True)
    assert result.returncode == 2 and "p5.48xlarge" in result.stderr, result.stderr


def test_the_model_is_deterministic_per_seed_and_task():
    arn = "arn:shoal:ecs:local:000000000000:task/sim/abc"
    assert MODEL.outcome(arn) == MODEL.outcome(arn)
    assert TaskModel(run_time=5, distribution="exponential", seed=1).outcome(arn) != \
        TaskModel(run_time=5, distribution="exponential", seed=2).outcome(arn)
    forever = MODEL.outcome(arn, {"SHOAL_SIM_RUN_TIME": "forever", "SHOAL_SIM_EXIT_CODE": "7"})
    assert forever.run_time is None and forever.exit_code == 7
    assert forever.start_delay == MODEL.outcome(arn).start_delay, "an override shifts nothing else"
    with pytest.raises(ValueError):
        TaskModel(distribution="normal")
