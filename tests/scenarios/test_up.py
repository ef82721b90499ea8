"""Story: a new user runs `shoal up`, pastes the export lines, runs the three commands printed
after them, and sees their task's output. With `--simulate`, two simulated p6-b200 hosts are
ACTIVE before the exports appear, and a GPU task lands on one of them.

Ctrl-C (SIGINT) or SIGTERM shuts it down cleanly; a restart keeps the same credentials and the
same local host, and the simulated hosts of a session leave with it.
"""

import os
import sqlite3
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import botocore

from tests.support import free_port, kill_workloads, wait_for

SHOAL = Path(sys.executable).parent / "shoal"
BOTOCORE_DATA = str(Path(botocore.__file__).parent / "data")  # awscli's bundled model predates sharingStrategy


def _start(data_dir: Path, port: int, *args: str) -> tuple[subprocess.Popen, dict[str, str], list[str]]:
    proc = subprocess.Popen([str(SHOAL), "up", "--port", str(port), "--data-dir", str(data_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    exports: dict[str, str] = {}
    lines: list[str] = []
    while True:
        line = proc.stdout.readline()
        assert line, f"shoal up exited early: {''.join(lines)}"
        lines.append(line)
        if line.startswith("export "):
            key, _, value = line[len("export "):].strip().partition("=")
            exports[key] = value
        if line.startswith("# events:"):
            return proc, exports, lines


def _client(exports: dict[str, str]):
    return boto3.client("ecs", endpoint_url=exports["SHOAL_ENDPOINT"], region_name=exports["AWS_DEFAULT_REGION"],
                        aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"])


def _stop(proc: subprocess.Popen, sig: int) -> None:
    proc.send_signal(sig)
    assert proc.wait(30) == 0


def test_up_runs_the_printed_commands_and_keeps_credentials_across_restarts(tmp_path):
    port, data_dir = free_port(), tmp_path / "shoal"
    proc, exports, lines = _start(data_dir, port)
    try:
        assert list(exports) == ["SHOAL_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"]
        assert exports["SHOAL_ENDPOINT"] == f"http://127.0.0.1:{port}"
        assert "cluster default: 1 × local ACTIVE" in "".join(lines)
        commands = [line for line in lines if not line.startswith(("export ", "#"))]
        assert len(commands) == 3, lines
        env = {**os.environ, **exports, "HOME": str(tmp_path), "AWS_CONFIG_FILE": "/dev/null",
               "AWS_DATA_PATH": BOTOCORE_DATA, "PATH": f"{SHOAL.parent}{os.pathsep}{os.environ['PATH']}"}
        out = subprocess.run(["bash", "-c", "set -e\n" + "".join(commands)], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "hello from shoal" in out.stdout

        ecs = _client(exports)
        cluster = ecs.describe_clusters(clusters=["default"])["clusters"][0]
        assert cluster["defaultCapacityProviderStrategy"] == [{"capacityProvider": "local", "weight": 1, "base": 0}]
        [host] = ecs.describe_container_instances(
            containerInstances=ecs.list_container_instances()["containerInstanceArns"])["containerInstances"]
        assert host["capacityProviderName"] == "local" and host["agentConnected"]
        out = subprocess.run([str(SHOAL), "events", "list", "--json"], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    finally:
        _stop(proc, signal.SIGINT)

    proc, again, _ = _start(data_dir, port)
    try:
        assert again == exports
        ecs = _client(again)
        hosts = ecs.list_container_instances()["containerInstanceArns"]
        assert hosts == [host["containerInstanceArn"]], "the local agent comes back as the same host"
    finally:
        _stop(proc, signal.SIGTERM)
        kill_workloads(data_dir)


def test_up_with_simulated_gpu_hosts(tmp_path):
    data_dir = tmp_path / "shoal"
    proc, exports, lines = _start(data_dir, free_port(), "--simulate", "p6-b200.48xlarge:2")
    try:
        assert "2 × sim-p6-b200-48xlarge" in "".join(lines), "the simulated hosts are ACTIVE before the exports"
        ecs = _client(exports)
        arns = ecs.list_container_instances(filter="attribute:ecs.instance-type == p6-b200.48xlarge")[
            "containerInstanceArns"]
        hosts = ecs.describe_container_instances(containerInstances=arns)["containerInstances"]
        assert len(hosts) == 2
        assert all(len(h["gpuDevices"]) == 8 and h["capacityProviderName"] == "sim-p6-b200-48xlarge" for h in hosts)
        ecs.register_task_definition(family="gpu", containerDefinitions=[{
            "name": "train", "memory": 256, "resourceRequirements": [{"type": "GPU", "value": "1"}],
            "command": ["sh", "-c", "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; sleep 30"]}])
        task = ecs.run_task(taskDefinition="gpu", capacityProviderStrategy=[
            {"capacityProvider": "sim-p6-b200-48xlarge", "weight": 1}])["tasks"][0]
        [container] = task["containers"]
        assert len(container["gpuIds"]) == 1 and task["containerInstanceArn"] in arns
        wait_for(lambda: ecs.describe_tasks(tasks=[task["taskArn"]])["tasks"][0]["lastStatus"] == "RUNNING",
                 timeout=20, message="the GPU task to run")
    finally:
        _stop(proc, signal.SIGINT)
        kill_workloads(data_dir)
    hosts_dir = data_dir / "hosts"
    assert all((d / "terminated").exists() for d in hosts_dir.iterdir()), "simulated hosts leave with shoal up"
    with sqlite3.connect(data_dir / "shoal.db") as db:
        states = db.execute("select status from container_instances where capacity_provider_name like 'sim-%'")
        assert states.fetchall() == [("INACTIVE",), ("INACTIVE",)]
