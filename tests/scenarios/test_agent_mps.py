"""Stories of MPS and GPU health on real agents: a real `shoal server`, real `shoal agent`
processes with simulated GPUs (`--fake-gpus`), and one real `shoal-fake-mps-control` daemon per
GPU, started by the agent. MPS tasks run as simulated CUDA programs
(`shoal-fake-mps-control --client -- CMD`), so they are real clients of their GPU's daemon.

The hardware boundary is faked, nothing else: faults are the fake's knobs (hang, fault), a
SIGKILL of the daemon process, and Xids injected into the fake GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from shoal.agent.gpu.fake import inject
from shoal.agent.mps.fake_control import binary_path, set_knobs
from tests.agent_support import AgentProcess
from tests.support import wait_for

FAKE = binary_path()
HEALTH_CHANGE = "ECS Container Instance Health Change"
NOT_RESPONDING = "MPS control daemon is not responding"
pytestmark = pytest.mark.skipif(not os.access(FAKE, os.X_OK), reason=f"{FAKE} is not installed (pip install -e .)")


# -- hosts -----------------------------------------------------------------------------------------
class Host:
    """One agent with fake GPUs, alone in a cluster of its own."""

    def __init__(self, server, ecs, root: Path, name: str, gpus: int, *args: str,
                 model: str = "NVIDIA H100", memory_mib: int = 81920):
        self.ecs, self.server, self.cluster = ecs, server, name
        ecs.create_cluster(clusterName=name)
        spec = root / f"{name}-gpus.json"
        spec.write_text(json.dumps({"model": model, "count": gpus, "memoryMiB": memory_mib}))
        self.agent = AgentProcess(server, root / name, ("--fake-gpus", str(spec), *args), cluster=name)
        self.tasks: list[str] = []

    def start(self) -> "Host":
        self.agent.start().wait_active(self.ecs)
        return self

    @property
    def data_dir(self) -> Path:
        return self.agent.data_dir.resolve()

    @property
    def gpus(self) -> list[str]:
        return [d["gpuId"] for d in self.describe()["gpuDevices"]]

    def pipe(self, gpu: str) -> Path:
        return self.data_dir / "mps" / gpu / "pipe"

    def daemon_pid(self, gpu: str) -> int:
        return int((self.pipe(gpu) / "nvidia-cuda-mps-control.pid").read_text())

    def control(self, gpu: str, command: str, timeout: float = 10) -> str:
        """One command through the fake's front end, as an operator would type it."""
        out = subprocess.run([FAKE], input=command + "\n", capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe(gpu))})
        assert out.returncode == 0, out.stderr
        return out.stdout

    def hung(self, gpu: str) -> bool:
        """The daemon reads its knobs every 50 ms: it hangs once a command goes unanswered."""
        try:
            self.control(gpu, "get_default_active_thread_percentage", timeout=0.5)
        except subprocess.TimeoutExpired:
            return True
        return False

    def clients(self, gpu: str) -> dict[int, list[int]]:
        return {int(s): [int(c) for c in self.control(gpu, f"get_client_list {s}").split()]
                for s in self.control(gpu, "get_server_list").split()}

    def describe(self) -> dict:
        return self.ecs.describe_container_instances(cluster=self.cluster, containerInstances=[self.agent.arn],
                                                     include=["CONTAINER_INSTANCE_HEALTH"])["containerInstances"][0]

    def accelerated(self) -> dict:
        return next(d for d in self.describe()["healthStatus"]["details"] if d["type"] == "ACCELERATED_COMPUTE")

    def wait_accelerated(self, status: str, timeout: float) -> dict:
        return wait_for(lambda: (lambda d: d if d["status"] == status else None)(self.accelerated()),
                        timeout=timeout, interval=0.05, message=f"ACCELERATED_COMPUTE {status}; agent log:\n"
                        f"{self.agent.log_tail(1500)}")

    def health_events(self) -> list[tuple[str, str | None, float]]:
        """(status, reason, lastStatusChange) of ACCELERATED_COMPUTE in this host's health change events."""
        out = []
        for e in self.server.events():
            if e["detail-type"] == HEALTH_CHANGE and e["detail"]["containerInstanceArn"] == self.agent.arn:
                check = next(c for c in e["detail"]["healthChecks"] if c["type"] == "ACCELERATED_COMPUTE")
                entry = (check["status"], check.get("statusReason"), _iso(check["lastStatusChange"]))
                if entry not in out:  # an event about another check repeats this one as it was
                    out.append(entry)
        return out

    def wait_clients(self, gpu: str, count: int) -> dict[int, list[int]]:
        return wait_for(lambda: (lambda c: c if len(sum(c.values(), [])) == count else None)(self.clients(gpu)),
                        message=f"{count} MPS clients on {gpu}")

    # -- tasks ---------------------------------------------------------------------------------
    def register(self, family: str, command: list[str], memory: int = 4096, percent: int | None = None) -> str:
        mps = {"memory": memory, **({"maxComputePercent": percent} if percent is not None else {})}
        return self.ecs.register_task_definition(family=family, containerDefinitions=[{
            "name": "c", "image": "busybox", "memory": 32, "stopTimeout": 2, "command": command,
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": mps}}]}]
        )["taskDefinition"]["taskDefinitionArn"]

    def run(self, td: str) -> dict:
        out = self.ecs.run_task(cluster=self.cluster, taskDefinition=td)
        assert out["failures"] == [], out["failures"]
        self.tasks.append(out["tasks"][0]["taskArn"])
        return out["tasks"][0]

    def task(self, arn: str) -> dict:
        return self.ecs.describe_tasks(cluster=self.cluster, tasks=[arn])["tasks"][0]

    def wait_task(self, arn: str, status: str, timeout: float = 15) -> dict:
        return wait_for(lambda: (lambda t: t if t["lastStatus"] == status else None)(self.task(arn)),
                        timeout=timeout, interval=0.05,
                        message=f"task {arn} {status}; agent log:\n{self.agent.log_tail(1500)}")

    def gpu_of(self, arn: str) -> str:
        [gpu] = self.task(arn)["containers"][0]["gpuIds"]
        return gpu

    def stdout(self, arn: str) -> str:
        return (self.agent.container_dir(arn, "c") / "stdout.log").read_text()

    def stop_all(self) -> None:
        for arn in self.tasks:
            if self.task(arn)["lastStatus"] != "STOPPED":
                self.ecs.stop_task(cluster=self.cluster, task=arn, reason="test cleanup")
        for arn in self.tasks:
            self.wait_task(arn, "STOPPED")
        self.tasks.clear()

    def close(self) -> None:
        agent = self.agent
        if agent.proc is not None and agent.proc.poll() is None:
            self.ecs.deregister_container_instance(cluster=self.cluster, containerInstance=agent.arn, force=True)
            try:
                agent.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        agent.stop()
        agent.kill_leftovers()
        _kill_mps_daemons(self.data_dir)  # they outlive the agent by design


def _kill_mps_daemons(data_dir: Path) -> None:
    """The fake daemons (and servers) this host's agent started: their environment names its data dir."""
    marker = f"CUDA_MPS_LOG_DIRECTORY={data_dir}/mps/".encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "environ").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass


def _alive(pid: int) -> bool:
    """Running, and not a zombie (a daemon's parent is init, which may be slow to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _pid_or_none(host: Host, gpu: str) -> int | None:
    try:
        return host.daemon_pid(gpu)
    except (OSError, ValueError):  # between the old daemon and the new one
        return None


def _iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def client(*command: str) -> list[str]:
    """A simulated CUDA program: an MPS client of the daemon in its CUDA_MPS_PIPE_DIRECTORY."""
    return [FAKE, "--client", "--", *command]


INTERVAL = 1.5  # --mps-probe-interval of the module's host
SHOW_ENV = "env | grep -E '^(CUDA|NVIDIA)_' | sort; echo ready; exec sleep 60"


@pytest.fixture(scope="module")
def host(server, ecs, tmp_path_factory):
    """Two fake GPUs, MPS daemons probed every 1.5 s (each probe under 1.5 s)."""
    h = Host(server, ecs, tmp_path_factory.mktemp("mps"), "mps", 2, "--mps-probe-interval", str(INTERVAL))
    try:
        yield h.start()
    finally:
        h.close()


@pytest.fixture
def mps(host):
    yield host
    if host.agent.proc.poll() is None:
        for gpu in host.gpus:
            set_knobs(host.pipe(gpu), clear=True)
        host.stop_all()


# -- the stories -----------------------------------------------------------------------------------
def test_an_mps_task_gets_exactly_the_mps_client_environment_and_stopping_it_spares_its_neighbour(mps):
    host = mps
    attributes = {a["name"]: a.get("value") for a in host.describe()["attributes"]}
    assert "ecs.capability.gpu-sharing-mps" in attributes
    assert attributes["shoal.mps.probe-interval"] == "1.5"
    assert attributes["shoal.gpu.xid-set"] == "46,48,54,62,64,74,79,95,109,110,136,140,142,143,151,155,156,158"
    # one control daemon per GPU, started by the agent, in the GPU's own pipe dir
    pids = {gpu: host.daemon_pid(gpu) for gpu in host.gpus}
    assert len(set(pids.values())) == 2 and all(_alive(pid) for pid in pids.values())
    assert host.accelerated()["status"] == "OK"

    capped = host.run(host.register("mps-env", client("sh", "-c", SHOW_ENV), memory=4096, percent=50))
    plain = host.run(host.register("mps-env-plain", client("sh", "-c", SHOW_ENV), memory=2048))
    for t in (capped, plain):
        host.wait_task(t["taskArn"], "RUNNING")
        wait_for(lambda t=t: "ready" in host.stdout(t["taskArn"]), message="the task's output")
    gpu = host.gpu_of(capped["taskArn"])
    assert host.gpu_of(plain["taskArn"]) == gpu, "MPS shares pack onto the fullest GPU"

    def env_of(arn):
        return dict(line.split("=", 1) for line in host.stdout(arn).split() if "=" in line)

    pipe = str(host.pipe(gpu))
    assert env_of(capped["taskArn"]) == {
        "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "NVIDIA_VISIBLE_DEVICES": gpu}
    assert env_of(plain["taskArn"]) == {
        "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M", "NVIDIA_VISIBLE_DEVICES": gpu}

    # both are real clients of their GPU's daemon, on one server
    [(server, attached)] = host.wait_clients(gpu, 2).items()
    assert len(attached) == 2

    # stopping one evicts its client through the control interface; the neighbour keeps its server
    host.ecs.stop_task(cluster=host.cluster, task=capped["taskArn"], reason="done")
    host.wait_task(capped["taskArn"], "STOPPED")
    server_log = (host.data_dir / "mps" / gpu / "log" / "server.log").read_text()
    terminated = [int(line.split("Client ")[1].split()[0]) for line in server_log.splitlines()
                  if "terminated (sticky error" in line]
    assert len(terminated) == 1 and terminated[0] in attached, server_log[-2000:]
    assert host.clients(gpu) == {server: [pid for pid in attached if pid != terminated[0]]}
    assert host.task(plain["taskArn"])["lastStatus"] == "RUNNING"


def test_a_hung_daemon_fails_the_gate_impairs_the_host_moves_mps_work_away_and_recovers(mps):
    host = mps
    td = host.register("mps-hang", client("sleep", "60"))
    first = host.run(td)
    host.wait_task(first["taskArn"], "RUNNING")
    gpu = host.gpu_of(first["taskArn"])
    [other] = [g for g in host.gpus if g != gpu]

    set_knobs(host.pipe(gpu), hang=True)  # accepts connections, never answers
    hung_at = time.time()
    wait_for(lambda: host.hung(gpu), timeout=3, message="the daemon to hang")
    # a task placed there before the agent has called the daemon impaired: the gate stops it
    gated = host.run(td)
    assert host.gpu_of(gated["taskArn"]) == gpu, "packing puts the next share on the fullest GPU"

    # within 3 probe intervals and a probe's timeout: IMPAIRED, with the probe error
    impaired = host.wait_accelerated("IMPAIRED", timeout=10)
    took = time.time() - hung_at
    assert took < 3 * INTERVAL + 3, f"a hung daemon was reported after {took:.1f} s"
    assert impaired["statusReason"] == "no answer to get_default_active_thread_percentage within 1.5 s", impaired
    assert host.describe()["healthStatus"]["overallStatus"] == "IMPAIRED"

    # the impaired GPU takes no new MPS share: the next one lands on the other GPU, and runs
    moved = host.run(td)
    assert host.gpu_of(moved["taskArn"]) == other
    host.wait_task(moved["taskArn"], "RUNNING")

    stopped = host.wait_task(gated["taskArn"], "STOPPED", timeout=15)
    assert stopped["stopCode"] == "TaskFailedToStart", stopped
    assert stopped["stoppedReason"].startswith(f"{NOT_RESPONDING}: no answer to get_default_active_thread_"
                                               f"percentage"), stopped["stoppedReason"]
    assert "(3 attempts in" in stopped["stoppedReason"]
    assert not host.agent.container_dir(gated["taskArn"], "c").exists(), "no container was created"
    assert "runtimeId" not in stopped["containers"][0] and "exitCode" not in stopped["containers"][0]
    assert host.task(first["taskArn"])["lastStatus"] == "RUNNING", "running clients are left alone"
    hung_pid = host.daemon_pid(gpu)
    assert _alive(hung_pid), "a hung daemon is not restarted under running tasks"

    # once no task uses the GPU, restarting its daemon is safe, and the agent does it (the knob is a
    # level, like a wedged driver: the new daemon hangs too, and the GPU stays impaired)
    host.ecs.stop_task(cluster=host.cluster, task=first["taskArn"], reason="done")
    host.wait_task(first["taskArn"], "STOPPED", timeout=5)
    wait_for(lambda: _pid_or_none(host, gpu) not in (None, hung_pid), timeout=10,
             message="the hung daemon to be restarted")
    assert not _alive(hung_pid)
    assert host.accelerated()["status"] == "IMPAIRED"

    lifted_at = time.time()
    set_knobs(host.pipe(gpu), hang=None)
    ok = host.wait_accelerated("OK", timeout=8)
    assert "statusReason" not in ok and time.time() - lifted_at < INTERVAL + 3
    statuses = [s for s, _, at in host.health_events() if at >= hung_at - 0.5]
    assert statuses == ["IMPAIRED", "OK"], host.health_events()
    # the GPU takes MPS work again
    again = host.run(td)
    host.wait_task(again["taskArn"], "RUNNING")


def test_a_fault_fails_the_gpus_mps_tasks_restarts_its_server_and_new_work_runs(mps):
    host = mps
    td = host.register("mps-fault", client("sleep", "60"))
    tasks = [host.run(td)["taskArn"] for _ in range(2)]
    for arn in tasks:
        host.wait_task(arn, "RUNNING")
    gpu = host.gpu_of(tasks[0])
    assert host.gpu_of(tasks[1]) == gpu
    [old_server] = host.wait_clients(gpu, 2)

    faulted_at = time.time()
    set_knobs(host.pipe(gpu), fault=True)
    reason = f"MPS server on GPU {gpu} entered FAULT state"
    for arn in tasks:
        stopped = host.wait_task(arn, "STOPPED", timeout=10)
        assert stopped["stoppedReason"] == reason, stopped
        assert stopped["stopCode"] == "EssentialContainerExited"
    assert any(s == "IMPAIRED" and r == reason and at >= faulted_at - 0.5 for s, r, at in host.health_events()), \
        host.health_events()
    control_log = host.data_dir / "mps" / gpu / "log" / "control.log"
    wait_for(lambda: f"Server {old_server} exited" in control_log.read_text(), timeout=5,
             message="the faulted server to be shut down")
    text = control_log.read_text()
    assert text.count("Cmd:terminate_client") >= 2 and f"Cmd:shutdown_server {old_server} -f" in text

    set_knobs(host.pipe(gpu), fault=None)  # the GPU error is over
    host.wait_accelerated("OK", timeout=6)
    fresh = host.run(td)
    host.wait_task(fresh["taskArn"], "RUNNING")
    fresh_gpu = host.gpu_of(fresh["taskArn"])
    servers = wait_for(lambda: host.clients(fresh_gpu) or None, message="the new task's MPS server")
    assert old_server not in servers and len(sum(servers.values(), [])) == 1


@pytest.fixture
def crash_host(server, ecs, tmp_path_factory):
    h = Host(server, ecs, tmp_path_factory.mktemp("mps-crash"), "mps-crash", 1, "--mps-probe-interval", "10")
    try:
        yield h.start()
    finally:
        h.close()


def test_a_daemon_crash_is_reported_in_under_a_second_and_the_daemon_is_restarted(crash_host):
    host = crash_host
    [gpu] = host.gpus
    victim = host.run(host.register("mps-crash", client("sleep", "60")))
    host.wait_task(victim["taskArn"], "RUNNING")
    host.wait_accelerated("OK", timeout=5)
    pid = host.daemon_pid(gpu)

    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    host.wait_accelerated("IMPAIRED", timeout=5)
    [(_, reason, at)] = [e for e in host.health_events() if e[0] == "IMPAIRED"]
    detected = at - killed_at
    print(f"MPS daemon crash reported {detected * 1000:.0f} ms after the kill (probe interval 10 s)")
    assert detected < 1.0, f"a crash was reported {detected:.2f} s after the kill"
    assert reason == f"MPS control daemon process {pid} exited"

    # its clients lost their server: the task stops; the daemon is started again and probed OK
    stopped = host.wait_task(victim["taskArn"], "STOPPED", timeout=10)
    assert stopped["stoppedReason"] == f"MPS control daemon on GPU {gpu} exited: its clients lost their MPS server"
    host.wait_accelerated("OK", timeout=5)
    new = host.daemon_pid(gpu)
    assert new != pid and _alive(new) and not _alive(pid)
    assert [s for s, _, at in host.health_events() if at >= killed_at] == ["IMPAIRED", "OK"]
    again = host.run(host.register("mps-crash", client("sleep", "60")))
    host.wait_task(again["taskArn"], "RUNNING")
    host.stop_all()


@pytest.fixture
def xid_host(server, ecs, tmp_path_factory):
    h = Host(server, ecs, tmp_path_factory.mktemp("xid"), "xid", 2)
    try:
        yield h.start()
    finally:
        h.close()


def test_a_critical_xid_impairs_the_host_for_good_and_others_are_only_logged(xid_host):
    host = xid_host
    host.wait_accelerated("OK", timeout=5)
    inject(host.data_dir, 1, 13)  # a "restart the app" Xid: not in the set
    wait_for(lambda: "Xid 13" in host.agent.log_tail(20000), message="Xid 13 to be logged")
    assert host.accelerated()["status"] == "OK"

    injected_at = time.time()
    inject(host.data_dir, 0, 79)  # fell off the bus
    check = host.wait_accelerated("IMPAIRED", timeout=5)
    assert check["statusReason"] == "XID_79" and time.time() - injected_at < 2
    assert host.describe()["healthStatus"]["overallStatus"] == "IMPAIRED"
    # it stays: an Xid does not heal, and an agent restart does not forget it
    daemons = {gpu: host.daemon_pid(gpu) for gpu in host.gpus}
    host.agent.stop()
    host.agent.start()
    wait_for(lambda: "ACCELERATED_COMPUTE stays IMPAIRED: Xid 79" in host.agent.log_tail(20000),
             message="the restarted agent to read back the Xid")
    deadline = time.time() + 2  # its first reports go out at once: none of them may say OK
    while time.time() < deadline:
        assert host.accelerated()["statusReason"] == "XID_79"
        time.sleep(0.1)
    assert json.loads((host.data_dir / "gpu-xid.json").read_text())["xid"] == 79
    # the MPS daemons outlived the agent, and the new agent adopted them
    assert {gpu: host.daemon_pid(gpu) for gpu in host.gpus} == daemons
    assert "adopted control daemon" in host.agent.log_tail(20000)
    assert [(s, r) for s, r, at in host.health_events() if at >= injected_at - 0.5] == [("IMPAIRED", "XID_79")]
