"""Story: the same control-plane flow, driven through the real AWS CLI (`aws ecs --endpoint-url`).

A user who never writes Python points the stock `aws` command at shoal: a cluster with capacity
providers of both kinds, an MPS task definition and a whole-GPU one registered from JSON input, a
task run and stopped, and `shoal events list` then tells that task's story in order. CLI errors
come back as the ECS error codes the CLI prints.

The CLI runs as a subprocess with nothing from the user's environment: its own HOME, no config or
credentials files, the server's credentials and region `local` in the environment.

Why AWS_DATA_PATH: awscli 1.x ships its own copy of botocore, and the copy in awscli 1.46.3
(botocore 1.43.62) has an ECS model without `sharingStrategy`, so the CLI itself rejects an MPS
resource requirement before sending it ("Unknown parameter ... sharingStrategy"). Pointing
AWS_DATA_PATH at the botocore that shoal validates against gives the CLI the same ECS model as the
server; everything else (argument parsing, serialization, signing, error printing) is the CLI's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import botocore

BIN = Path(sys.executable).parent
MODELS = Path(botocore.__file__).parent / "data"
# The installed console scripts; the same programs through `python -m` where they are missing.
AWS = [str(BIN / "aws")] if (BIN / "aws").exists() else [sys.executable, "-m", "awscli"]
SHOAL = [str(BIN / "shoal")] if (BIN / "shoal").exists() else [sys.executable, "-m", "shoal.cli.main"]

MI_CONFIG = {
    "infrastructureRoleArn": "arn:aws:iam::000000000000:role/shoal-infra",
    "instanceLaunchTemplate": {"ec2InstanceProfileArn": "arn:aws:iam::000000000000:instance-profile/p",
                               "networkConfiguration": {"subnets": ["subnet-local"]}},
}


def _env(server, home: Path) -> dict:
    creds = server.credentials
    return {
        "PATH": str(BIN) + ":/usr/bin:/bin",
        "HOME": str(home),
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_ACCESS_KEY_ID": creds["accessKeyId"],
        "AWS_SECRET_ACCESS_KEY": creds["secretAccessKey"],
        "AWS_DEFAULT_REGION": "local",
        "AWS_DATA_PATH": str(MODELS),
        "AWS_EC2_METADATA_DISABLED": "true",
        "SHOAL_ENDPOINT": server.endpoint,
    }


def _run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def aws(server, home: Path, *args: str, ok: bool = True) -> dict | subprocess.CompletedProcess:
    """`aws ecs <args>` against the server; the parsed JSON output, or the process when ok=False."""
    proc = _run([*AWS, "ecs", *args, "--endpoint-url", server.endpoint, "--output", "json"],
                _env(server, home))
    if not ok:
        return proc
    assert proc.returncode == 0, f"aws ecs {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}"
    return json.loads(proc.stdout) if proc.stdout.strip() else {}


def shoal_events(server, home: Path, *args: str) -> list[dict]:
    proc = _run([*SHOAL, "events", "list", "--json", *args], _env(server, home))
    assert proc.returncode == 0, f"shoal events list failed ({proc.returncode}):\n{proc.stderr}"
    return json.loads(proc.stdout)


def test_cluster_capacity_task_lifecycle_and_events_through_the_aws_cli(server, unique, tmp_path):
    name = unique("cli")
    cluster = aws(server, tmp_path, "create-cluster", "--cluster-name", name,
                  "--tags", "key=team,value=ml")["cluster"]
    assert cluster["clusterArn"].endswith(f":cluster/{name}") and cluster["status"] == "ACTIVE"

    managed = aws(server, tmp_path, "create-capacity-provider", "--name", unique("mi"), "--cluster", name,
                  "--managed-instances-provider", json.dumps(MI_CONFIG))["capacityProvider"]
    assert managed["type"] == "MANAGED_INSTANCES" and managed["cluster"] == name
    assert managed["managedInstancesProvider"]["autoRepairConfiguration"]["actionsStatus"] == "ENABLED"
    selfm = aws(server, tmp_path, "create-capacity-provider", "--name", unique("onprem"),
                "--auto-scaling-group-provider",
                "autoScalingGroupArn=arn:aws:autoscaling:local:000000000000:autoScalingGroup:x")["capacityProvider"]
    assert selfm["type"] == "EC2_AUTOSCALING"
    associated = aws(server, tmp_path, "put-cluster-capacity-providers", "--cluster", name,
                     "--capacity-providers", managed["name"], selfm["name"],
                     "--default-capacity-provider-strategy",
                     f"capacityProvider={selfm['name']},weight=1")["cluster"]
    assert associated["capacityProviders"] == [managed["name"], selfm["name"]]
    assert associated["defaultCapacityProviderStrategy"][0]["capacityProvider"] == selfm["name"]

    mps = aws(server, tmp_path, "register-task-definition", "--cli-input-json", json.dumps({
        "family": unique("infer"),
        "containerDefinitions": [{"name": "server", "image": "vllm", "memory": 2048, "resourceRequirements": [
            {"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 8192, "maxComputePercent": 50}}}]}],
    }))["taskDefinition"]
    assert mps["revision"] == 1 and mps["requiresAttributes"] == [{"name": "ecs.capability.gpu-sharing-mps"}]
    shared = mps["containerDefinitions"][0]["resourceRequirements"][0]["sharingStrategy"]["nvidiaMps"]
    assert shared == {"memory": 8192, "maxComputePercent": 50}
    whole = aws(server, tmp_path, "register-task-definition", "--cli-input-json", json.dumps({
        "family": unique("train"),
        "containerDefinitions": [{"name": "trainer", "image": "pytorch", "memory": 4096,
                                  "resourceRequirements": [{"type": "GPU", "value": "8"}]}],
    }))["taskDefinition"]
    assert whole["containerDefinitions"][0]["resourceRequirements"] == [{"type": "GPU", "value": "8"}]

    run = aws(server, tmp_path, "run-task", "--cluster", name, "--task-definition", mps["family"],
              "--launch-type", "EC2", "--started-by", "cli-story")
    assert run["failures"] == []
    task = run["tasks"][0]
    assert (task["lastStatus"], task["desiredStatus"]) == ("PENDING", "RUNNING")
    assert task["taskDefinitionArn"] == mps["taskDefinitionArn"]

    stopped = aws(server, tmp_path, "stop-task", "--cluster", name, "--task", task["taskArn"].split("/")[-1],
                  "--reason", "done from the CLI")["task"]
    assert (stopped["lastStatus"], stopped["stopCode"]) == ("STOPPED", "UserInitiated")
    assert stopped["stoppedReason"] == "done from the CLI"
    described = aws(server, tmp_path, "describe-tasks", "--cluster", cluster["clusterArn"],
                    "--tasks", task["taskArn"])
    assert described["failures"] == []
    assert [(t["taskArn"], t["lastStatus"], t["stopCode"]) for t in described["tasks"]] == \
        [(task["taskArn"], "STOPPED", "UserInitiated")]

    everything = shoal_events(server, tmp_path)
    task_events = [e for e in everything if e["resources"] == [task["taskArn"]]]
    assert [e["detail-type"] for e in task_events] == ["ECS Task State Change"] * 2
    assert [e["detail"]["lastStatus"] for e in task_events] == ["PENDING", "STOPPED"]
    assert task_events[1]["detail"]["stopCode"] == "UserInitiated"

    first = task_events[0]["id"]
    after_first = shoal_events(server, tmp_path, "--since", first)
    ids = [e["id"] for e in everything]
    assert [e["id"] for e in after_first] == ids[ids.index(first) + 1:]
    assert [e["detail"]["lastStatus"] for e in after_first if e["resources"] == [task["taskArn"]]] == ["STOPPED"]


def test_cli_error_names_the_ecs_exception(server, tmp_path):
    proc = aws(server, tmp_path, "describe-tasks", "--cluster", "nope", "--tasks", "x", ok=False)
    assert proc.returncode != 0
    assert "ClusterNotFoundException" in proc.stderr
    assert proc.stdout.strip() == ""
