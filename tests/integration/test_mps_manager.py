"""The agent's MPS manager against `shoal-fake-mps-control`: real daemon processes, real server
and client processes, knobs for crash, hang, refuse and fault. No mocks.

Every test stops the daemons it started; a safety net kills any daemon still carrying the
test's data dir."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from shoal.agent.gpu.base import Gpu
from shoal.agent.mps.fake_control import binary_path, read_knobs, set_knobs
from shoal.agent.mps.manager import IMPAIRED, NOT_RESPONDING, OK, MpsManager

FAKE = binary_path()
pytestmark = pytest.mark.skipif(not os.access(FAKE, os.X_OK),
                                reason=f"{FAKE} is not installed (pip install -e .)")


def new_gpu(index: int = 0) -> Gpu:
    return Gpu(index=index, uuid=f"GPU-{uuid.uuid4()}", model="NVIDIA B200", memory_mib=183359)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def run(coro, timeout: float = 25.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(predicate, timeout: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _kill_leftovers(root: Path) -> None:
    marker = f"CUDA_MPS_PIPE_DIRECTORY={root}".encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if marker in (proc / "environ").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture
def data_dir():
    # short on purpose: the real daemon's socket path must fit in 108 bytes
    path = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    yield path
    _kill_leftovers(path)
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def manager(data_dir: Path, **kwargs):
    m = MpsManager(data_dir, binary=FAKE, **kwargs)
    try:
        yield m
    finally:
        await m.stop_all()
        m.close()


@contextlib.contextmanager
def clients(pipe_dir: Path, count: int):
    """`count` simulated CUDA programs attached to the daemon of `pipe_dir`."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)}
    procs = [subprocess.Popen([FAKE, "--client", "--", "sleep", "60"], env=env) for _ in range(count)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


class Changes:
    """What a watcher reported, with the monotonic time of each report."""

    def __init__(self):
        self.seen: list[tuple[float, str, str | None]] = []

    def __call__(self, status, reason):
        self.seen.append((time.monotonic(), status, reason))

    def last(self):
        return self.seen[-1][1:] if self.seen else None

    async def wait_for(self, status, timeout):
        await until(lambda: self.last() is not None and self.last()[0] == status, timeout, f"status {status}")
        return self.seen[-1]


def test_one_daemon_per_gpu_in_its_own_dirs_answers_probes_and_stops_cleanly(data_dir):
    gpus = [new_gpu(0), new_gpu(1)]

    async def scenario():
        async with manager(data_dir) as m:
            infos = [await m.start(g) for g in gpus]
            assert len({i.pid for i in infos}) == 2 and not any(i.adopted for i in infos)
            for g, info in zip(gpus, infos):
                assert info.pipe_dir == data_dir.resolve() / "mps" / g.uuid / "pipe"
                assert info.log_dir == data_dir.resolve() / "mps" / g.uuid / "log"
                assert (info.pipe_dir / "control").is_socket()
                assert (info.pipe_dir / "nvidia-cuda-mps-control.pid").read_text().split() == [str(info.pid)]
                environ = Path(f"/proc/{info.pid}/environ").read_bytes().split(b"\0")
                assert f"CUDA_VISIBLE_DEVICES={g.uuid}".encode() in environ
                assert f"CUDA_MPS_PIPE_DIRECTORY={info.pipe_dir}".encode() in environ
                assert f"CUDA_MPS_LOG_DIRECTORY={info.log_dir}".encode() in environ
                control_log = (info.log_dir / "control.log").read_text()
                assert f"] Starting control daemon using socket {info.pipe_dir}/control" in control_log
                assert f"Control {info.pid}]" in control_log
                probe = await m.probe(g)
                assert probe.ok and probe.error is None and probe.elapsed < 3
                assert (await m.gate(g)).ok
                assert (await m.start(g)).pid == info.pid  # idempotent
                assert (await m.server_state(g)).status == "NONE"  # lazy servers: none yet
                assert "Cmd:get_default_active_thread_percentage" in (info.log_dir / "control.log").read_text()
                # each device lists its clients; the daemon knows its device by uuid
                assert (await m.command(g, "get_device_client_list")).split() == [g.uuid]
        for info in infos:
            assert not alive(info.pid)
            assert not (info.pipe_dir / "control").exists()
            assert not (info.pipe_dir / "nvidia-cuda-mps-control.pid").exists()

    run(scenario())


def test_client_env_is_exactly_the_pipe_dir_the_memory_cap_and_the_optional_compute_share(data_dir):
    m = MpsManager(data_dir, binary=FAKE)
    gpu = new_gpu(3)
    pipe = str(data_dir.resolve() / "mps" / gpu.uuid / "pipe")
    assert m.client_env(gpu, 8192) == {
        "CUDA_MPS_PIPE_DIRECTORY": pipe,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",  # the client sees its GPU as device 0
    }
    assert m.client_env(gpu, 512, max_compute_percent=50) == {
        "CUDA_MPS_PIPE_DIRECTORY": pipe,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=512M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    }
    for bad in (0, -1, 1.5, True, "8192"):
        with pytest.raises(ValueError, match="nvidiaMps.memory"):
            m.client_env(gpu, bad)
    for bad in (0, 101, 50.5, True):
        with pytest.raises(ValueError, match="nvidiaMps.maxComputePercent"):
            m.client_env(gpu, 1024, max_compute_percent=bad)


def test_a_daemon_crash_is_seen_at_once_not_at_the_next_probe(data_dir):
    gpu = new_gpu()

    async def scenario():
        async with manager(data_dir) as m:
            info = await m.start(gpu)
            changes = Changes()
            m.watch(gpu, interval=10.0, on_change=changes)
            await asyncio.sleep(0.1)
            crashed_at = time.monotonic()
            set_knobs(info.pipe_dir, crash=0)
            at, status, reason = await changes.wait_for(IMPAIRED, timeout=2.0)
            assert at - crashed_at < 1.0, f"crash seen after {at - crashed_at:.2f} s"
            assert reason == f"MPS control daemon process {info.pid} exited"
            assert not alive(info.pid)
            assert "crash" not in read_knobs(info.pipe_dir)  # one-shot
            probe = await m.probe(gpu)
            assert not probe.ok and probe.error == reason
            # a restart clears the stale socket and pid file; the watcher sees the new daemon at once
            restarted_at = time.monotonic()
            new = await m.restart(gpu)
            assert new.pid != info.pid and not new.adopted
            at, status, reason = await changes.wait_for(OK, timeout=2.0)
            assert at - restarted_at < 1.5 and reason is None
            assert [s for _, s, _ in changes.seen] == [IMPAIRED, OK]

    run(scenario())


def test_a_crash_after_n_commands_answers_those_first(data_dir):
    gpu = new_gpu()

    async def scenario():
        async with manager(data_dir) as m:
            info = await m.start(gpu)
            set_knobs(info.pipe_dir, crash=2)
            await asyncio.sleep(0.15)  # the daemon reads its knobs every 50 ms
            assert (await m.probe(gpu)).ok
            assert (await m.probe(gpu)).ok
            await until(lambda: not alive(info.pid), 2.0, "the daemon to exit")
            assert not (await m.probe(gpu)).ok

    run(scenario())


def test_a_hung_daemon_is_impaired_after_three_failed_probes_and_ok_after_one_success(data_dir):
    gpu = new_gpu()

    async def scenario():
        async with manager(data_dir) as m:
            info = await m.start(gpu)
            changes = Changes()
            m.watch(gpu, interval=0.2, on_change=changes, timeout=0.5)
            await asyncio.sleep(0.5)
            assert changes.seen == []  # healthy: nothing to report
            hung_at = time.monotonic()
            set_knobs(info.pipe_dir, hang=True)
            at, status, reason = await changes.wait_for(IMPAIRED, timeout=5.0)
            # three probes of 0.5 s each had to time out first (probes start every 0.2 s, so they run
            # back to back; the first may have started up to ~0.1 s before the knob took effect)
            assert 1.4 <= at - hung_at <= 3 * (0.2 + 0.5) + 1.0, at - hung_at
            assert reason == "no answer to get_default_active_thread_percentage within 0.5 s"
            assert alive(info.pid)  # hung, not dead
            # the gate keeps to its deadline against a hung daemon
            gate = await m.gate(gpu, within=1.5, timeout=0.5, backoff=0.2)
            assert not gate.ok and gate.error.startswith(f"{NOT_RESPONDING}: no answer") and gate.elapsed < 2.0
            lifted_at = time.monotonic()
            set_knobs(info.pipe_dir, hang=None)
            at, status, reason = await changes.wait_for(OK, timeout=3.0)
            assert at - lifted_at < 1.5
            assert [s for _, s, _ in changes.seen] == [IMPAIRED, OK]
            assert m.pid(gpu) == info.pid  # the same daemon throughout

    run(scenario())


@pytest.mark.parametrize("mode, backoff", [("remove", 1.0), ("close", 0.2)])  # 1.0: the gate's default
def test_a_refusing_daemon_fails_the_task_gate_within_ten_seconds(data_dir, mode, backoff):
    gpu = new_gpu()

    async def scenario():
        async with manager(data_dir) as m:
            info = await m.start(gpu)
            set_knobs(info.pipe_dir, refuse=mode)
            # the socket file tells nothing in "close" mode (it stays): wait for the daemon to say it
            await until(lambda: "refuse knob: not accepting connections" in (info.log_dir / "control.log").read_text()
                        and (info.pipe_dir / "control").exists() == (mode == "close"), 2.0, "the refusal")
            started = time.monotonic()
            gate = await m.gate(gpu, backoff=backoff)
            assert time.monotonic() - started < 10.0
            assert not gate.ok
            assert NOT_RESPONDING in gate.error
            assert "Cannot find MPS control daemon process" in gate.error
            assert "(3 attempts in " in gate.error
            set_knobs(info.pipe_dir, refuse=None)
            await until(lambda: (info.pipe_dir / "control").is_socket(), 2.0, "the socket")
            assert (await m.gate(gpu)).ok

    run(scenario())


def test_a_fault_shows_in_server_state_and_clears_when_its_clients_are_gone(data_dir):
    gpu = new_gpu()

    async def scenario():
        async with manager(data_dir) as m:
            info = await m.start(gpu)
            with clients(info.pipe_dir, 1) as [client]:
                async def attached():
                    found = await m.clients(gpu)
                    return found if any(found.values()) else None
                servers = await until(attached, 5.0, "the client to attach")
                assert list(servers.values()) == [[client.pid]]
                [server] = servers
                assert alive(server)
                state = await m.server_state(gpu)
                assert state.servers == {server: "ACTIVE"} and not state.fault

                set_knobs(info.pipe_dir, fault=True)

                async def faulted():
                    return (await m.server_state(gpu)).fault
                await until(faulted, 2.0, "FAULT")
                state = await m.server_state(gpu)
                assert state.status == "FAULT" and state.faulted == [server]
                # a new client is refused while the server is in FAULT
                late = subprocess.run([FAKE, "--client", "--", "true"], capture_output=True, text=True, timeout=10,
                                      env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(info.pipe_dir)})
                assert late.returncode == 1 and "CUDA_ERROR_MPS_SERVER_NOT_READY" in late.stderr
                server_log = (info.log_dir / "server.log").read_text()
                assert "Server is handling a fatal GPU error" in server_log

                set_knobs(info.pipe_dir, fault=None)
                await asyncio.sleep(0.15)
                assert (await m.server_state(gpu)).fault  # the affected client is still attached
                assert await m.terminate_client(gpu, client.pid)
                assert (await m.server_state(gpu)).servers == {server: "ACTIVE"}

    run(scenario())


def test_terminate_client_evicts_just_that_client(data_dir):
    gpu = new_gpu()

    async def _eq(coro, expected):
        return await coro == expected

    async def scenario():
        async with manager(data_dir) as m:
            info = await m.start(gpu)
            with clients(info.pipe_dir, 3) as procs:
                pids = sorted(p.pid for p in procs)

                async def attached():
                    found = await m.clients(gpu)
                    return found if sorted(sum(found.values(), [])) == pids else None
                [server] = await until(attached, 5.0, "three clients")
                victim = procs[1].pid
                assert await m.terminate_client(gpu, victim) is True
                assert await m.clients(gpu) == {server: sorted(p for p in pids if p != victim)}
                assert (await m.command(gpu, "get_device_client_list")).split() == \
                    [gpu.uuid] + [str(p) for p in pids if p != victim]
                # MPS does not kill: the evicted process lives until its owner stops it
                assert all(p.poll() is None for p in procs)
                assert await m.terminate_client(gpu, victim) is False
                assert "Client %d terminated" % victim in (info.log_dir / "server.log").read_text()
                # a client that exits leaves the list by itself
                procs[0].kill()
                procs[0].wait()
                await until(lambda: _eq(m.clients(gpu), {server: [procs[2].pid]}), 3.0, "the exit to be seen")

    run(scenario())


AGENT = """
import asyncio, os, sys
from shoal.agent.gpu.base import Gpu
from shoal.agent.mps.manager import MpsManager

async def main():
    info = await MpsManager(sys.argv[1], binary=sys.argv[2]).start(Gpu(0, sys.argv[3], "NVIDIA B200", 183359))
    print(info.pid, flush=True)
    os._exit(0)  # the agent dies without cleaning anything up

asyncio.run(main())
"""


def test_a_restarted_agent_adopts_the_running_daemon(data_dir):
    gpu = new_gpu()
    first = subprocess.run([sys.executable, "-c", AGENT, str(data_dir), FAKE, gpu.uuid],
                           capture_output=True, text=True, timeout=20)
    assert first.returncode == 0, first.stderr
    pid = int(first.stdout)
    assert alive(pid)  # outlived its agent

    async def scenario():
        async with manager(data_dir) as m:
            info = await m.start(gpu)
            assert info.adopted and info.pid == pid
            assert (await m.probe(gpu)).ok
            # the adopted daemon is watched like one started here: a crash is seen at once
            changes = Changes()
            m.watch(gpu, interval=10.0, on_change=changes)
            await asyncio.sleep(0.05)
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            at, _, reason = await changes.wait_for(IMPAIRED, 2.0)
            assert at - killed_at < 1.0 and str(pid) in reason
            # its stale socket and pid file do not fool the next start
            assert (info.pipe_dir / "nvidia-cuda-mps-control.pid").exists()
            fresh = await m.start(gpu)
            assert not fresh.adopted and fresh.pid != pid
            await changes.wait_for(OK, 2.0)

    run(scenario())


def test_a_data_dir_too_long_for_a_socket_path_still_works_with_the_fake(data_dir):
    deep = data_dir / ("d" * 60)
    gpu = new_gpu()
    assert len(str(deep / "mps" / gpu.uuid / "pipe" / "control")) > 108

    async def scenario():
        async with manager(deep) as m:
            await m.start(gpu)
            assert (await m.probe(gpu)).ok

    run(scenario())


def test_the_fake_works_from_a_shell_like_the_real_binary(data_dir):
    pipe = data_dir / "pipe"
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(data_dir / "log"),
           "PATH": f"{Path(FAKE).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    def sh(script):
        return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=10)

    nothing = sh("echo get_server_list | shoal-fake-mps-control")
    assert nothing.returncode == 1 and "Cannot find MPS control daemon process" in nothing.stderr
    assert sh("shoal-fake-mps-control -d").returncode == 0
    try:
        again = sh("shoal-fake-mps-control -d")
        assert again.returncode == 1 and "already running" in again.stderr
        empty = sh("echo get_server_list | shoal-fake-mps-control")
        assert (empty.returncode, empty.stdout) == (0, "")
        started = sh(f"echo start_server -uid {os.getuid()} | shoal-fake-mps-control")
        assert (started.returncode, started.stdout) == (0, "")
        listed = sh("echo get_server_list | shoal-fake-mps-control")
        assert listed.returncode == 0 and listed.stdout.strip().isdigit()
        server = int(listed.stdout)
        assert alive(server)
        several = sh(f"printf 'get_server_status {server}\\nset_default_active_thread_percentage 40\\n"
                     f"get_default_active_thread_percentage\\nset_default_device_pinned_mem_limit 0 2G\\n"
                     f"get_default_device_pinned_mem_limit 0\\nno_such_command\\n' | shoal-fake-mps-control")
        assert several.returncode == 0
        assert several.stdout.splitlines() == ["ACTIVE", "40.0", "40.0", "2G", "Unrecognized command: no_such_command"]
        daemon = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
        assert sh("echo quit | shoal-fake-mps-control").returncode == 0
        deadline = time.monotonic() + 5
        while alive(daemon) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(daemon) and not alive(server)  # quit stops the servers too
        assert not (pipe / "control").exists() and not (pipe / "nvidia-cuda-mps-control.pid").exists()
        log = (data_dir / "log" / "control.log").read_text()
        for line in ("NEW UI", "Cmd:get_server_list", "UI closed", f"NEW SERVER {server}: Ready",
                     f"Server {server} exited with status 0"):
            assert line in log
    finally:
        sh("echo quit | shoal-fake-mps-control")


def test_stopping_a_hung_daemon_falls_back_to_signals(data_dir):
    gpu = new_gpu()

    async def scenario():
        async with manager(data_dir) as m:
            info = await m.start(gpu)
            set_knobs(info.pipe_dir, hang=True)
            await asyncio.sleep(0.15)
            started = time.monotonic()
            await m.stop(gpu)
            assert time.monotonic() - started < 4.0
            assert not alive(info.pid)
            assert not (info.pipe_dir / "control").exists()
            assert m.pid(gpu) is None

    run(scenario())


def test_the_supervisors_gate_lets_no_task_in_while_a_restart_replaces_the_daemon(data_dir):
    """A restart decided while the daemon was down goes on even if the old daemon answers
    meanwhile; a task gated in that window must attach to the new daemon, not the one quitting."""
    from shoal.agent.accelerated import AcceleratedCompute
    from shoal.agent.mps.supervisor import MpsSupervisor

    gpu = new_gpu()

    async def scenario():
        async with manager(data_dir) as m:
            old = (await m.start(gpu)).pid
            health = AcceleratedCompute(data_dir, (), lambda: None)
            supervisor = MpsSupervisor(m, [gpu], interval=5.0, health=health, tasks_on=lambda uuid: [])
            restart = asyncio.ensure_future(m.restart(gpu))
            await asyncio.sleep(0)  # the restart has begun: the old daemon still answers probes
            assert m.restarting(gpu) and alive(old)
            assert await supervisor.gate(gpu.uuid) is None
            assert not m.restarting(gpu) and m.pid(gpu) not in (None, old), "gated against the old daemon"
            await restart

    run(scenario())
