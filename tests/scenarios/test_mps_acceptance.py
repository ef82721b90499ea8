"""ECS acceptance tests §6 items 8 ("MPS placement and accounting") and 9 ("MPS daemon down"),
literally and end to end: a real `shoal server`, one real `shoal agent` with one simulated 24 GiB
GPU (`--fake-gpus`) and its real `shoal-fake-mps-control` daemon, MPS tasks that run as real
clients of that daemon, boto3 for everything a user sees. The only fault is the fake's `hang` knob.

The helpers (Host, client, SHOW_ENV, …) are those of tests/scenarios/test_agent_mps.py; item 8
with hosts registered by the test itself is tests/integration/test_placement.py.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from shoal.agent.mps.fake_control import set_knobs
from tests.integration.test_placement import MPS_ATTRIBUTE, assert_waiting, gpu_devices
from tests.scenarios.test_agent_mps import FAKE, NOT_RESPONDING, SHOW_ENV, Host, _pid_or_none, client
from tests.support import wait_for

pytestmark = pytest.mark.skipif(not Path(FAKE).is_file(), reason=f"{FAKE} is not installed (pip install -e .)")

GPU_MIB = 24576  # "a 24 GiB GPU"
INTERVAL = 1.0  # --mps-probe-interval; each probe then waits at most 1 s for an answer
PROBE_TIMEOUT = 1.0
PROBE = "get_default_active_thread_percentage"


@pytest.fixture(scope="module")
def acceptance_host(server, ecs, tmp_path_factory):
    """One agent, one fake A10G-sized GPU (24576 MiB) with MPS, probed every second."""
    root = tmp_path_factory.mktemp("mps-acceptance")
    host = Host(server, ecs, root, "mps-acceptance", 1, "--mps-probe-interval", str(INTERVAL),
                model="NVIDIA A10G", memory_mib=GPU_MIB)
    try:
        yield host.start()
    finally:
        host.close()


@pytest.fixture
def host(acceptance_host):
    """The module's host, left as found: no knob, no task, ACCELERATED_COMPUTE OK."""
    yield acceptance_host
    if acceptance_host.agent.proc.poll() is None:
        for gpu in acceptance_host.gpus:
            set_knobs(acceptance_host.pipe(gpu), clear=True)
        acceptance_host.stop_all()
        acceptance_host.wait_accelerated("OK", timeout=30)


def _whole_gpu_task_definition(ecs) -> str:
    return ecs.register_task_definition(family="acc-whole-gpu", containerDefinitions=[{
        "name": "c", "image": "busybox", "memory": 32, "stopTimeout": 2, "command": ["sleep", "60"],
        "resourceRequirements": [{"type": "GPU", "value": "1"}]}])["taskDefinition"]["taskDefinitionArn"]


def _task_of(pid: int) -> str | None:
    """The SHOAL_TASK_ARN in a process's environment (every container process carries it)."""
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if entry.startswith(b"SHOAL_TASK_ARN="):
            return entry.split(b"=", 1)[1].decode()
    return None


def _stamps(path: Path, needle: str) -> list[float]:
    """When lines containing `needle` were logged: the fake daemon's "[2026-01-01 10:00:00.123 …" and
    the agent's "2026-01-01 10:00:00,123 …" (both local time, to the millisecond)."""
    out = []
    for line in path.read_text().splitlines():
        if needle in line:
            text = line.lstrip("[")[:23].replace(",", ".")
            out.append(datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").timestamp())
    return out


# -- item 8 ----------------------------------------------------------------------------------------
def test_item_8_mps_placement_and_accounting_on_a_real_agent(host, ecs):
    """§6 item 8, MPS placement and accounting:
    * A 24 GiB GPU and two tasks, each with `nvidiaMps.memory=8192` → both on the same GPU, with
      `sharingMode=NVIDIA_MPS`, `containerCount=2`, `remainingMemoryInMiB=24576-16384`.
    * A third task that wants 12288 MiB goes elsewhere or stays pending.
    * A whole-GPU (`value:"1"`) task is never placed on that GPU.
    * The container environment has `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M` and no
      `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` when `maxComputePercent` is absent.
    * A task that mixes `value` and `sharingStrategy` containers is rejected at registration.
    Here both shares also run, as real clients of the GPU's MPS control daemon."""
    [gpu] = host.gpus
    before = gpu_devices(host.describe())[gpu]
    assert before["totalMemoryInMiB"] == GPU_MIB and before["sharingMode"] == "IDLE", before

    share = host.register("acc-share-8192", client("sh", "-c", SHOW_ENV), memory=8192)  # no maxComputePercent
    assert {"name": MPS_ATTRIBUTE} in ecs.describe_task_definition(taskDefinition=share)["taskDefinition"][
        "requiresAttributes"]
    shares = [host.run(share) for _ in range(2)]
    for task in shares:
        assert task["containerInstanceArn"] == host.agent.arn
        assert task["containers"][0]["gpuIds"] == [gpu], "both on the same GPU"
        assert task["containers"][0]["gpuSharingStrategy"] == {"nvidiaMps": {"memory": 8192}}
    accounted = {"gpuId": gpu, "sharingMode": "NVIDIA_MPS", "containerCount": 2, "totalMemoryInMiB": GPU_MIB,
                 "remainingMemoryInMiB": 24576 - 16384}
    assert gpu_devices(host.describe())[gpu] == accounted

    # 12288 MiB does not fit in the 8192 left, and there is no elsewhere: it stays pending
    bigger = host.run(host.register("acc-share-12288", client("sleep", "60"), memory=12288))
    assert_waiting(bigger, "RESOURCE:GPU")
    # a whole GPU is never carved out of a GPU that MPS shares
    whole = host.run(_whole_gpu_task_definition(ecs))
    assert_waiting(whole, "RESOURCE:GPU")

    # both shares RUNNING, as the two clients of one MPS server of the GPU's daemon
    for task in shares:
        host.wait_task(task["taskArn"], "RUNNING", timeout=30)
        wait_for(lambda task=task: "ready" in host.stdout(task["taskArn"]), timeout=15, message="the task's output")
    [(_, attached)] = host.wait_clients(gpu, 2).items()
    assert sorted(_task_of(pid) for pid in attached) == sorted(t["taskArn"] for t in shares)

    # the environment each container saw: an 8192 MiB pinned limit on device 0, no thread percentage
    for task in shares:
        print(f"environment of {task['taskArn']}:\n{host.stdout(task['taskArn'])}")
        env = dict(line.split("=", 1) for line in host.stdout(task["taskArn"]).split() if "=" in line)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
        assert env == {"CUDA_MPS_PIPE_DIRECTORY": str(host.pipe(gpu)), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",
                       "NVIDIA_VISIBLE_DEVICES": gpu}

    # with both shares running (the control loop has placed work since), the other two still wait,
    # and the accounting is unchanged
    for task in (bigger, whole):
        assert_waiting(host.task(task["taskArn"]), "RESOURCE:GPU")
    assert gpu_devices(host.describe())[gpu] == accounted
    for task in (bigger, whole):  # stop them before the shares give the GPU back
        ecs.stop_task(cluster=host.cluster, task=task["taskArn"], reason="acceptance done")
        assert "containerInstanceArn" not in host.wait_task(task["taskArn"], "STOPPED")

    # mixing a whole-GPU container and an MPS container in one task definition
    with pytest.raises(ClientError) as rejected:
        ecs.register_task_definition(family="acc-mixed", containerDefinitions=[
            {"name": "whole", "image": "busybox", "memory": 32,
             "resourceRequirements": [{"type": "GPU", "value": "1"}]},
            {"name": "shared", "image": "busybox", "memory": 32, "resourceRequirements": [
                {"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 1024}}}]}])
    error = rejected.value.response["Error"]
    assert error["Code"] == "InvalidParameterException", error
    assert "'containerDefinitions'" in error["Message"] and "same option" in error["Message"], error
    with pytest.raises(ClientError) as missing:
        ecs.describe_task_definition(taskDefinition="acc-mixed")
    assert missing.value.response["Error"]["Code"] == "ClientException", "nothing was registered"


# -- item 9 ----------------------------------------------------------------------------------------
def _restarted(host: Host, gpu: str, old: int) -> int:
    """The pid of the daemon the agent started in place of `old` (it restarts a hung daemon once
    no task uses the GPU; the knob is a level, so the new one hangs too)."""
    return wait_for(lambda: (lambda pid: pid if pid not in (None, old) else None)(_pid_or_none(host, gpu)),
                    timeout=20, message=f"the hung daemon {old} to be restarted")


def test_item_9_mps_daemon_down_on_a_real_agent(host, ecs, server):
    """§6 item 9, MPS daemon down: an MPS task goes to STOPPED before any container is created, with
    a reason containing "MPS control daemon is not responding". After 3 consecutive probe failures
    the instance's `ACCELERATED_COMPUTE` check becomes IMPAIRED with a `statusReason`; one
    successful probe returns it to OK. ("Down" here: the daemon hangs, accepting commands and
    never answering.)"""
    [gpu] = host.gpus
    control_log = host.data_dir / "mps" / gpu / "log" / "control.log"
    agent_log = host.agent.log_path
    host.wait_accelerated("OK", timeout=10)

    # -- 3 consecutive probe failures → IMPAIRED with a statusReason (nothing else talks to the
    # daemon here: no task, no test command). Hang just after a probe was answered, so that every
    # probe from then on goes unanswered; while hung, the daemon logs only the connections.
    answered = len(_stamps(control_log, f"Cmd:{PROBE}"))
    wait_for(lambda: len(_stamps(control_log, f"Cmd:{PROBE}")) > answered, timeout=10, interval=0.01,
             message="the watcher's next probe")
    old = host.daemon_pid(gpu)
    set_knobs(host.pipe(gpu), hang=True)
    hung_at = time.time()
    impaired = host.wait_accelerated("IMPAIRED", timeout=30)
    assert impaired["statusReason"] == f"no answer to {PROBE} within 1 s", impaired
    assert host.describe()["healthStatus"]["overallStatus"] == "IMPAIRED"
    [said_at] = _stamps(agent_log, f"control daemon for {gpu} is not responding")[-1:]
    probes = [t for t in _stamps(control_log, "Accepting connection") if hung_at <= t <= said_at]
    print(f"IMPAIRED {said_at - hung_at:.2f} s after the hang, after unanswered probes at "
          f"+{[round(t - hung_at, 2) for t in probes]} s (one every {INTERVAL} s, each given {PROBE_TIMEOUT} s)")
    assert len(probes) == 3, f"IMPAIRED after {len(probes)} unanswered probes, not 3"
    assert said_at - probes[0] >= 2 * PROBE_TIMEOUT, "the first two probes were not waited out"
    assert [(s, r) for s, r, at in host.health_events() if at >= hung_at] == [("IMPAIRED", impaired["statusReason"])]

    # -- one successful probe → OK (first let the agent's restart of the idle, hung daemon go through)
    _restarted(host, gpu, old)
    cleared_at = time.time()
    set_knobs(host.pipe(gpu), hang=None)
    ok = host.wait_accelerated("OK", timeout=15)
    assert "statusReason" not in ok, ok
    assert [s for s, _, at in host.health_events() if at >= hung_at] == ["IMPAIRED", "OK"], host.health_events()
    answered_at = [t for t in _stamps(control_log, f"Cmd:{PROBE}") if t >= cleared_at - 0.01]
    [back_at] = _stamps(agent_log, f"control daemon for {gpu} answers again")[-1:]
    print(f"probes answered after the clear at +{[round(t - cleared_at, 2) for t in answered_at]} s; "
          f"the agent said OK at +{back_at - cleared_at:.2f} s")
    assert answered_at and answered_at[0] <= back_at + 0.01, (answered_at, back_at)
    # probes start a second apart: none of a later round was needed (one that was waiting when the
    # knob was cleared may be answered together with the first)
    assert not [t for t in answered_at if answered_at[0] + INTERVAL / 2 < t <= back_at], \
        f"OK at {back_at} after probes answered at {answered_at}: more than one successful probe"

    # -- an MPS task placed on the GPU while its daemon does not answer: STOPPED by the agent's
    # gate before any container is created
    td = host.register("acc-gated", client("sleep", "60"), memory=8192)
    old = host.daemon_pid(gpu)
    set_knobs(host.pipe(gpu), hang=True)
    wait_for(lambda: host.hung(gpu), timeout=5, message="the daemon to hang")
    gated = host.run(td)  # at once: three failed probes take 3 s, the GPU is still OK
    assert gated["containers"][0]["gpuIds"] == [gpu], gated
    stopped = host.wait_task(gated["taskArn"], "STOPPED", timeout=40)
    assert NOT_RESPONDING in stopped["stoppedReason"], stopped["stoppedReason"]
    # the gate's last probe gets what is left of its 10 s: "within 3 s" or less
    assert re.fullmatch(rf"{NOT_RESPONDING}: no answer to {PROBE} within [0-9.]+ s \(3 attempts in [0-9.]+ s\)",
                        stopped["stoppedReason"]), stopped["stoppedReason"]
    assert stopped["stopCode"] == "TaskFailedToStart", stopped
    assert not host.agent.container_dir(gated["taskArn"], "c").exists(), "a container was created"
    container = stopped["containers"][0]
    assert "runtimeId" not in container and "exitCode" not in container, container
    assert "startedAt" not in stopped, stopped
    statuses = [e["detail"]["lastStatus"] for e in server.events()
                if e["detail-type"] == "ECS Task State Change" and e["detail"]["taskArn"] == gated["taskArn"]]
    assert statuses and "RUNNING" not in statuses and statuses[-1] == "STOPPED", statuses
    assert host.accelerated()["status"] == "IMPAIRED"  # the watcher saw the same hang meanwhile

    # the daemon answers again: OK, and MPS work runs on the GPU again
    _restarted(host, gpu, old)
    set_knobs(host.pipe(gpu), hang=None)
    host.wait_accelerated("OK", timeout=15)
    again = host.run(td)
    assert again["containers"][0]["gpuIds"] == [gpu]
    host.wait_task(again["taskArn"], "RUNNING", timeout=30)
