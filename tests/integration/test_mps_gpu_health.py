"""MPS work and GPU health on the server side (issue #6 point 4): a GPU whose MPS control daemon
the agent reports down takes no new MPS shares (its other GPUs, and whole-GPU work, carry on);
the number of MPS clients per GPU is the server's setting."""

from __future__ import annotations

import pytest

from tests.integration.test_placement import (HEALTHY, describe_host, family, gpu_devices, make_cluster,
                                              mps_share, pending_reason, placed_on, register_host, report, run,
                                              whole_gpus)
from tests.support import ServerProcess, wait_for


def impaired(gpus: list[str], reason: str = "MPS control daemon is not responding") -> dict:
    return {**HEALTHY, "ACCELERATED_COMPUTE": {"status": "IMPAIRED", "reason": reason, "gpus": gpus}}


def test_a_gpu_whose_mps_daemon_is_down_takes_no_new_mps_shares(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    arn, token = register_host(server, cluster, gpus=2, mps=True)
    first, second = gpu_devices(describe_host(ecs, cluster, arn))
    shares = family(ecs, unique, mps_share(1024))
    # Both shares would go to one GPU (the fullest that fits); with it impaired, the other one.
    assert report(server, token, health=impaired([first])).status_code == 200
    tasks = [run(ecs, cluster, shares) for _ in range(2)]
    assert {t["containers"][0]["gpuIds"][0] for t in tasks} == {second}
    # A whole GPU can still be had, and it is the impaired one (the other is shared now).
    whole = run(ecs, cluster, family(ecs, unique, whole_gpus("1")))
    assert whole["containers"][0]["gpuIds"] == [first]
    # The internal mark is not shown.
    [host] = ecs.describe_container_instances(cluster=cluster, containerInstances=[arn],
                                              include=["CONTAINER_INSTANCE_HEALTH"])["containerInstances"]
    assert "_impairedGpus" not in host
    details = {d["type"]: d for d in host["healthStatus"]["details"]}
    assert details["ACCELERATED_COMPUTE"]["statusReason"] == "MPS control daemon is not responding"
    # Reported: a Health Change event and an action-log entry naming the GPU.
    entries = server.get("/v1/action-logs", {"cluster": cluster}).json()["entries"]
    [entry] = [e for e in entries if e["eventName"] == "ACCELERATED_COMPUTE_IMPAIRED"]
    assert entry["detail"]["gpus"] == [first] and entry["actionSourceId"] == arn
    # (on PostgreSQL the event log shows a commit once no older transaction is still in flight)
    wait_for(lambda: any(e["detail-type"] == "ECS Container Instance Health Change" and e["resources"] == [arn]
                         and e["detail"]["overallStatus"] == "IMPAIRED" for e in server.events()),
             timeout=10, message="the Health Change event")


def test_when_every_gpu_is_impaired_mps_work_waits_and_is_placed_once_one_recovers(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    arn, token = register_host(server, cluster, gpus=1, mps=True)
    [gpu] = gpu_devices(describe_host(ecs, cluster, arn))
    assert report(server, token, health=impaired([gpu])).status_code == 200
    task = ecs.run_task(cluster=cluster, taskDefinition=family(ecs, unique, mps_share(1024)))["tasks"][0]
    assert "containerInstanceArn" not in task and pending_reason(task) == "RESOURCE:GPU"
    recovered = {**HEALTHY, "ACCELERATED_COMPUTE": {"status": "OK"}}
    assert report(server, token, health=recovered).status_code == 200
    assert placed_on(ecs, cluster, task["taskArn"])["containers"][0]["gpuIds"] == [gpu]


def test_impaired_gpus_must_be_the_hosts_own(server, ecs, unique):
    cluster = make_cluster(ecs, unique)
    _, token = register_host(server, cluster, gpus=1, mps=True)
    resp = report(server, token, health=impaired(["GPU-not-mine"]))
    assert resp.status_code == 400 and "health.ACCELERATED_COMPUTE.gpus" in resp.json()["message"]


@pytest.fixture
def two_client_server(tmp_path):
    srv = ServerProcess(tmp_path / "server", extra_args=("--mps-max-clients", "2")).start()
    yield srv
    srv.stop()


def test_mps_clients_per_gpu_are_limited_by_the_server_setting(two_client_server, unique):
    server, ecs = two_client_server, two_client_server.client()
    cluster = make_cluster(ecs, unique)
    register_host(server, cluster, gpus=1, mps=True)
    shares = family(ecs, unique, mps_share(1024))
    placed = [run(ecs, cluster, shares) for _ in range(3)]
    assert [bool(t.get("containerInstanceArn")) for t in placed] == [True, True, False]
    assert pending_reason(placed[2]) == "RESOURCE:GPU"
