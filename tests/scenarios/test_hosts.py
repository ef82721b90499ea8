"""Stories about hosts: managed capacity that launches a simulated GPU host for waiting tasks and
retires it when idle; two hosts, one drained and then deregistered."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import ServerProcess, kill_workloads, wait_for


STARTED: list[subprocess.Popen] = []


@pytest.fixture
def server(tmp_path):
    srv = ServerProcess(tmp_path / "server").start()
    yield srv
    for agent in STARTED:  # whatever the test's outcome
        agent.kill()
        agent.wait(10)
    STARTED.clear()
    srv.stop()
    kill_workloads(tmp_path)  # tasks and the hosts' agents outlive the server by design
    for pid_file in tmp_path.rglob("agent.pid"):
        subprocess.run(["kill", "-9", pid_file.read_text().strip()], capture_output=True)


def start_agent(server: ServerProcess, data_dir: Path, *args: str) -> subprocess.Popen:
    data_dir.mkdir(parents=True)
    token = (server.data_dir / "join-token").read_text()
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "agent", "--server", server.endpoint,
                             "--data-dir", str(data_dir), *args],
                            env={**os.environ, "SHOAL_JOIN_TOKEN": token},
                            stdout=open(data_dir / "agent.log", "ab"), stderr=subprocess.STDOUT)
    STARTED.append(proc)
    return proc


def task(ecs, arn: str) -> dict:
    return ecs.describe_tasks(cluster="gpu", tasks=[arn])["tasks"][0]


def test_managed_provider_launches_a_simulated_p6_b200_for_waiting_gpu_tasks_and_retires_it(server):
    ecs = server.client()
    ecs.create_cluster(clusterName="gpu")
    ecs.create_capacity_provider(
        name="b200", cluster="gpu", tags=[{"key": "shoal:scale-in-after", "value": "3"}],
        managedInstancesProvider={
            "infrastructureRoleArn": "arn:shoal:iam::000000000000:role/x",
            "instanceLaunchTemplate": {
                "ec2InstanceProfileArn": "arn:shoal:iam::000000000000:instance-profile/x",
                "networkConfiguration": {"subnets": []},
                "instanceRequirements": {"vCpuCount": {"min": 1}, "memoryMiB": {"min": 1},
                                         "allowedInstanceTypes": ["p6-b200.48xlarge"]}}})
    ecs.put_cluster_capacity_providers(cluster="gpu", capacityProviders=["b200"],
                                       defaultCapacityProviderStrategy=[{"capacityProvider": "b200", "weight": 1}])
    show_env = ["sh", "-c", "env | grep -E '^(CUDA|NVIDIA)_' | sort; sleep 2"]
    ecs.register_task_definition(family="whole", containerDefinitions=[{
        "name": "c", "memory": 128, "command": show_env, "resourceRequirements": [{"type": "GPU", "value": "1"}]}])
    ecs.register_task_definition(family="mps", containerDefinitions=[{
        "name": "c", "memory": 128, "command": show_env, "resourceRequirements": [
            {"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 8192}}}]}])

    whole = ecs.run_task(cluster="gpu", taskDefinition="whole")["tasks"][0]
    mps = ecs.run_task(cluster="gpu", taskDefinition="mps")["tasks"][0]
    assert whole["lastStatus"] == mps["lastStatus"] == "PROVISIONING"
    assert "containerInstanceArn" not in whole, "no host yet: the provider has none"

    # The provider launches one host for both, which registers, becomes ACTIVE and takes them.
    done = wait_for(lambda: all(task(ecs, t["taskArn"])["lastStatus"] == "STOPPED" for t in (whole, mps)),
                    timeout=60, message="both GPU tasks to run and exit")
    hosts = ecs.list_container_instances(cluster="gpu", status="ACTIVE")["containerInstanceArns"]
    assert done and len(hosts) == 1, "one simulated host was enough for both tasks"
    [host] = ecs.describe_container_instances(cluster="gpu", containerInstances=hosts)["containerInstances"]
    assert host["capacityProviderName"] == "b200"
    assert {"name": "ecs.instance-type", "value": "p6-b200.48xlarge"} in host["attributes"]
    assert len(host["gpuDevices"]) == 8 and host["gpuDevices"][0]["totalMemoryInMiB"] > 170_000

    whole, mps = task(ecs, whole["taskArn"]), task(ecs, mps["taskArn"])
    assert whole["containers"][0]["exitCode"] == 0 and mps["containers"][0]["exitCode"] == 0
    [gpu] = whole["containers"][0]["gpuIds"]
    [shared] = mps["containers"][0]["gpuIds"]
    assert gpu != shared, "a whole GPU and an MPS share never land on the same GPU"
    hosts_dir = server.data_dir.resolve() / "hosts"
    [host_dir] = [d for d in hosts_dir.iterdir() if d.name == host["ec2InstanceId"]]

    def env_of(t: dict) -> dict:
        out = (host_dir / "tasks" / t["taskArn"].rsplit("/", 1)[1] / "c" / "stdout.log").read_text()
        return dict(line.split("=", 1) for line in out.split())

    index = [d["gpuId"] for d in host["gpuDevices"]].index(gpu)
    assert env_of(whole) == {"CUDA_VISIBLE_DEVICES": str(index), "NVIDIA_VISIBLE_DEVICES": gpu}
    assert env_of(mps)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env_of(mps)

    # Idle for 3 s: the host is retired and its machine (agent process) goes away.
    wait_for(lambda: not ecs.list_container_instances(cluster="gpu", status="ACTIVE")["containerInstanceArns"],
             timeout=20, message="the idle host to be retired")
    wait_for(lambda: (host_dir / "terminated").exists(), timeout=10, message="the idle host to be terminated")
    changes = [e["detail"]["status"] for e in server.events()
               if e["detail-type"] == "ECS Container Instance State Change"
               and e["detail"]["containerInstanceArn"] == host["containerInstanceArn"]]
    assert changes[0] == "REGISTERING" and "ACTIVE" in changes and changes[-1] == "INACTIVE", changes


def test_draining_one_of_two_hosts(server, tmp_path):
    ecs = server.client()
    ecs.create_cluster(clusterName="gpu")
    agents = [start_agent(server, tmp_path / f"host{i}", "--cluster", "gpu", "--attribute", f"name=host{i}")
              for i in (1, 2)]
    arns = wait_for(lambda: (lambda a: len(a) == 2 and a)(
        ecs.list_container_instances(cluster="gpu", status="ACTIVE")["containerInstanceArns"]),
        timeout=20, message="two ACTIVE hosts")
    ecs.register_task_definition(family="sleep", containerDefinitions=[
        {"name": "c", "memory": 32, "command": ["sleep", "60"]}])
    first = ecs.run_task(cluster="gpu", taskDefinition="sleep", count=2)["tasks"]
    assert {t["containerInstanceArn"] for t in first} == set(arns), "spread: one task on each host"
    wait_for(lambda: all(task(ecs, t["taskArn"])["lastStatus"] == "RUNNING" for t in first), timeout=15,
             message="both tasks RUNNING")

    # Drain the first agent's host (the two registered in either order).
    drained = json.loads((tmp_path / "host1" / "agent.json").read_text())["containerInstanceArn"]
    other = next(arn for arn in arns if arn != drained)
    ecs.update_container_instances_state(cluster="gpu", containerInstances=[drained], status="DRAINING")
    later = ecs.run_task(cluster="gpu", taskDefinition="sleep", count=3)["tasks"]
    assert {t["containerInstanceArn"] for t in later} == {other}, "nothing new lands on a DRAINING host"
    on_drained = [t for t in first if t["containerInstanceArn"] == drained][0]
    time.sleep(1)
    still = task(ecs, on_drained["taskArn"])
    assert still["lastStatus"] == "RUNNING" and still["containerInstanceArn"] == drained, \
        "a standalone task is not stopped or moved by draining"
    assert len(ecs.list_tasks(cluster="gpu")["taskArns"]) == 5, "no replacement was started anywhere"

    # Deregistering ends at INACTIVE, and the host's agent stops; its task is left running (as ECS does).
    ecs.deregister_container_instance(cluster="gpu", containerInstance=drained, force=True)
    assert agents[0].wait(15) == 0
    [gone] = ecs.describe_container_instances(cluster="gpu", containerInstances=[drained])["containerInstances"]
    assert gone["status"] == "INACTIVE"
    pid = int(next((tmp_path / "host1" / "tasks").glob("*/c/pid")).read_text())
    os.kill(pid, 0)  # still running
