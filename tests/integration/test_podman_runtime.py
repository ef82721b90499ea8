"""The podman runtime: real containers of a locally built image, run under real shims.

The image is built by tests/fixtures/podman/build_image.py (a static busybox root filesystem,
`podman import`ed; no registry is contacted). Tests that run containers are skipped only when
podman is not installed; a podman that is installed but cannot run containers fails them.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from shoal.agent.runtime import podman, shims

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "podman"))
import build_image  # noqa: E402

needs_podman = pytest.mark.skipif(
    podman.podman_path() is None,
    reason="podman is not installed (on Debian: apt-get install -y podman runc)")


def _podman(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([podman.podman_path(), *podman.global_flags(), *args], check=check,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def _exists(name: str) -> bool:
    return _podman("container", "exists", podman.container_name(name)).returncode == 0


@pytest.fixture(scope="session")
def image() -> str:
    return build_image.ensure_image(build_image.TAG, podman.podman_path())


@pytest.fixture
def run(tmp_path, image):
    """Launch a container under a shim: run(command, **run_argv overrides) -> (handle, name)."""
    names: list[str] = []

    def launch(command, *, stop_timeout=2.0, **kw):
        name = f"shoal-test-{uuid.uuid4().hex[:12]}"
        names.append(name)
        args = dict(name=name, image=image, entry_point=None, command=command, env={},
                    workdir=None, memory_mib=None, memory_reservation_mib=None, cpu_units=None,
                    stop_timeout=stop_timeout, env_file=tmp_path / f"{name}.env")
        args.update(kw)
        argv = podman.run_argv(**args)
        handle = shims.launch(tmp_path / name, argv, podman.host_env(), None,
                              podman.shim_stop_timeout(stop_timeout))
        return handle, name

    yield launch
    for name in names:
        podman.remove(name)


def _wait(handle, timeout=60.0) -> dict:
    status = handle.wait(timeout)
    assert status is not None, (handle.dir / "shim.log").read_text()
    return status


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# --- the command line, no podman needed ---------------------------------------------------------

def test_run_argv_carries_the_container_settings(tmp_path):
    argv = podman.run_argv(
        name="Task/ABC:web", image="localhost/app:1", entry_point=["/bin/sh", "-c"],
        command=["echo $X"], env={"A": "1", "SECRET": "hunter2", "ML": "x\ny"}, workdir="/srv",
        memory_mib=64, memory_reservation_mib=32, cpu_units=0, stop_timeout=2.5,
        gpu_env={"CUDA_VISIBLE_DEVICES": "0"}, env_file=tmp_path / "c.env")
    inner = argv[argv.index("--") + 1:]
    assert argv[argv.index("supervise") + 1] == podman.container_name("Task/ABC:web")
    run_at = inner.index("run")
    assert inner[run_at:run_at + 5] == ["run", "--rm", "--replace", "--name",
                                        podman.container_name("Task/ABC:web")]
    for flag in ("--pull=never", "--network=host", "--memory=64m", "--memory-reservation=32m",
                 "--cpu-shares=2", "--stop-timeout=3", "--workdir=/srv", "--http-proxy=false"):
        assert flag in inner
    assert inner[inner.index("--env-file") + 1] == str(tmp_path / "c.env")
    assert '--entrypoint=["/bin/sh", "-c"]' in inner
    assert inner[-2:] == ["localhost/app:1", "echo $X"]
    # Secrets stay off the command line; the env file is private.
    assert not any("hunter2" in a for a in argv)
    assert "--env=ML=x\ny" in inner  # an env file cannot carry a line break
    text = (tmp_path / "c.env").read_text()
    assert "SECRET=hunter2\n" in text and "A=1\n" in text and "CUDA_VISIBLE_DEVICES=0\n" in text
    assert stat.S_IMODE((tmp_path / "c.env").stat().st_mode) == 0o600


def test_run_argv_without_env_file_or_limits():
    argv = podman.run_argv(name="c1", image="img", entry_point=None, command=None, env={"K": "v"},
                           workdir=None, memory_mib=None, memory_reservation_mib=None,
                           cpu_units=None, stop_timeout=0)
    inner = argv[argv.index("--") + 1:]
    assert "--env=K=v" in inner and "--env-file" not in inner
    assert not any(a.startswith(("--memory", "--cpu-shares", "--workdir", "--entrypoint"))
                   for a in inner)
    assert inner[-1] == "img"


@pytest.mark.parametrize("name", ["Task/ABC:web", "-x", "UPPER", "a" * 300, "", "..",
                                  "ok-name_1.2"])
def test_container_names_are_valid_and_distinct(name):
    cname = podman.container_name(name)
    assert podman._NAME_OK.fullmatch(cname) and len(cname) <= podman._NAME_MAX
    assert podman.container_name(name.upper() + "!") != cname
    if name == "ok-name_1.2":
        assert cname == name


# --- real containers -----------------------------------------------------------------------------

@needs_podman
def test_podman_is_usable_here():
    assert podman.available(), "podman is installed but `podman info` fails"


@needs_podman
def test_stdout_stderr_and_exit_code(run):
    handle, _ = run(["sh", "-c", "echo hello from podman; echo oops >&2; exit 3"])
    status = _wait(handle)
    # 125/126 mean podman itself failed: its message is in stderr.log.
    assert status["exitCode"] == 3, (status, handle.stderr_path.read_text())
    assert status["signal"] is None and not status["stopRequested"]
    assert handle.stdout_path.read_text() == "hello from podman\n"
    assert handle.stderr_path.read_text() == "oops\n"


@needs_podman
def test_the_image_is_honoured(run):
    assert not Path("/" + build_image.MARKER_PATH).exists()
    handle, _ = run(["cat", "/" + build_image.MARKER_PATH])
    assert _wait(handle)["exitCode"] == 0
    assert handle.stdout_path.read_text() == build_image.MARKER_TEXT


@needs_podman
def test_env_and_workdir_reach_the_container(run):
    env = {"GREETING": "hello world", "TRICKY": "a=b #c $HOME", "MULTI": "line1\nline2",
           "PADDED": " padded ", "QUOTED": '"q"', "EMPTY": ""}
    handle, _ = run(["sh", "-c", "pwd; env"], env=env, workdir="/work",
                    gpu_env={"NVIDIA_VISIBLE_DEVICES": "void"})
    assert _wait(handle)["exitCode"] == 0
    out = handle.stdout_path.read_text()
    assert out.startswith("/work\n")
    for k, v in {**env, "NVIDIA_VISIBLE_DEVICES": "void"}.items():
        assert f"\n{k}={v}\n" in out, (k, out)


@needs_podman
def test_entry_point_replaces_the_images(run):
    handle, _ = run(["one two", "three"], entry_point=["/bin/sh", "-c", 'echo "[$0] [$1]"'])
    assert _wait(handle)["exitCode"] == 0
    assert handle.stdout_path.read_text() == "[one two] [three]\n"


@needs_podman
def test_stop_kills_a_container_whose_pid1_ignores_sigterm(run):
    # `sleep` as a pid namespace's init ignores SIGTERM: only the SIGKILL after the stop timeout
    # ends it, and that must reach the container, not only `podman run`.
    handle, name = run(["sleep", "600"], stop_timeout=2.0)
    _wait_for(lambda: _podman("inspect", "--format", "{{.State.Running}}",
                              podman.container_name(name)).stdout.strip() == "true", 30, "running")
    started = time.monotonic()
    handle.stop()
    status = _wait(handle, timeout=2.0 + 5.0)
    took = time.monotonic() - started
    assert status["exitCode"] == 137 and status["stopRequested"], status
    assert not status["killed"], "the shim's backstop SIGKILL should not have been needed"
    assert 1.5 <= took <= 2.0 + 5.0, took
    assert not _exists(name)


@needs_podman
@pytest.mark.parametrize("attempt", range(3))
def test_stop_sends_sigterm_to_the_workload_first(run, attempt):
    # Stopping right after the first output once found `podman run` before its signal proxy was
    # set up (it then exited and left the container): the supervisor now signals the container.
    handle, name = run(["sh", "-c", "trap 'echo got TERM; exit 7' TERM; echo ready; "
                                    "while :; do sleep 0.1; done"], stop_timeout=10.0)
    _wait_for(lambda: "ready" in handle.stdout_path.read_text(), 30, "ready")
    started = time.monotonic()
    handle.stop()
    status = _wait(handle, timeout=10.0)
    assert status["exitCode"] == 7 and status["stopRequested"] and not status["killed"], status
    assert time.monotonic() - started < 5.0
    assert handle.stdout_path.read_text() == "ready\ngot TERM\n"
    assert not _exists(name)


@needs_podman
def test_memory_limit_is_applied(run):
    script = ("cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || "
              "cat /sys/fs/cgroup/memory.max; echo ready; exec sleep 600")
    handle, name = run(["sh", "-c", script], memory_mib=64, memory_reservation_mib=32,
                       cpu_units=512)
    _wait_for(lambda: "ready" in handle.stdout_path.read_text(), 30, "ready")
    assert handle.stdout_path.read_text().splitlines()[0] == str(64 * 1024 * 1024)
    info = json.loads(_podman("inspect", podman.container_name(name), check=True).stdout)[0]
    host = info["HostConfig"]
    assert host["Memory"] == 64 * 1024 * 1024
    assert host["MemoryReservation"] == 32 * 1024 * 1024
    assert host["CpuShares"] == 512
    handle.stop()
    assert _wait(handle, timeout=10)["stopRequested"]


@needs_podman
def test_remove_cleans_up_after_the_shim_and_podman_are_killed(run):
    handle, name = run(["sleep", "600"])
    cname = podman.container_name(name)
    _wait_for(lambda: _podman("inspect", "--format", "{{.State.Running}}", cname)
              .stdout.strip() == "true", 30, "running")
    os.kill(handle.shim_pid(), signal.SIGKILL)
    os.killpg(handle.pid(), signal.SIGKILL)  # the supervisor; `podman run` follows (PDEATHSIG)
    _wait_for(lambda: not handle.workload_alive(), 10, "podman run to die")
    assert _exists(name), "conmon keeps the container when podman run is killed"
    podman.remove(name)
    assert not _exists(name)
    podman.remove(name)  # idempotent


@needs_podman
def test_a_missing_image_is_not_pulled(run):
    handle, _ = run(["true"], image="localhost/shoal-test/no-such-image:latest")
    status = _wait(handle)
    assert status["exitCode"] == 125, status
    assert "no-such-image" in handle.stderr_path.read_text()


@needs_podman
def test_stop_right_after_launch_leaves_no_container(run):
    # The stop may come before podman has created the container or set up its signal proxy.
    handle, name = run(["sleep", "600"], stop_timeout=2.0)
    handle.stop()
    status = _wait(handle, timeout=2.0 + 5.0)
    assert status["stopRequested"] and not status["killed"], status
    assert status["exitCode"] in (137, 143), status
    _wait_for(lambda: not _exists(name), 10, "the container to be gone")


# --- the agent's runtime class -------------------------------------------------------------------

def _runner_and_container(tmp_path, definition, gpu_ids=()):
    from types import SimpleNamespace
    task_id = uuid.uuid4().hex
    runner = SimpleNamespace(arn=f"arn:aws:ecs:us-east-1:000000000000:task/c1/{task_id}",
                             dir=tmp_path / task_id)
    c = SimpleNamespace(name=definition["name"], definition=definition, gpu_ids=list(gpu_ids),
                        arn=f"arn:aws:ecs:us-east-1:000000000000:container/c1/{task_id}/x")
    return runner, c


def test_runtime_gpu_environment_uses_uuids_and_cdi_indices(tmp_path):
    rt = podman.PodmanRuntime(gpu_index={"GPU-a": 0, "GPU-b": 3})
    runner, c = _runner_and_container(tmp_path, {"name": "Web", "image": "img"}, ["GPU-b"])
    env = rt.env(runner, c)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-b" and "CUDA_VISIBLE_DEVICES" not in env
    assert env["ECS_CONTAINER_NAME"] == "Web" and "PATH" not in env
    assert rt.gpu_devices(c) == ["3"]
    assert podman._NAME_OK.fullmatch(rt.container_name(runner, c))


def test_runtime_refuses_a_container_without_image(tmp_path):
    rt = podman.PodmanRuntime(gpu_index={})
    runner, c = _runner_and_container(tmp_path, {"name": "web", "command": ["true"]})
    with pytest.raises(ValueError, match="no image"):
        rt.prepare(runner, c)


@needs_podman
def test_runtime_prepare_runs_under_a_shim_like_the_task_runner(tmp_path, image):
    rt = podman.PodmanRuntime(gpu_index={})
    definition = {"name": "web", "image": image, "entryPoint": ["sh", "-c"],
                  "command": ["echo $ECS_CONTAINER_NAME $A; pwd; echo ready; exec sleep 600"],
                  "environment": [{"name": "A", "value": "b c"}], "workingDirectory": "/tmp",
                  "memory": 64, "cpu": 128, "stopTimeout": 2}
    runner, c = _runner_and_container(tmp_path, definition)
    argv, env, cwd, cgroup = rt.prepare(runner, c)
    assert cgroup is None and cwd is None and "A" not in env
    # As the task runner does: the shim gets the definition's stopTimeout itself.
    handle = shims.launch(runner.dir / c.name, argv, env, cwd, 2.0)
    try:
        _wait_for(lambda: "ready" in handle.stdout_path.read_text(), 30, "ready")
        assert handle.stdout_path.read_text() == "web b c\n/tmp\nready\n"
        probe = subprocess.run(rt.exec_argv(runner, c, ["cat", "/" + build_image.MARKER_PATH]),
                               capture_output=True, text=True, timeout=30)
        assert probe.returncode == 0 and probe.stdout == build_image.MARKER_TEXT
        started = time.monotonic()
        handle.stop()
        status = _wait(handle, timeout=2.0 + 3.0)
        assert status["exitCode"] == 137 and not status["killed"], status
        assert time.monotonic() - started < 2.0 + 1.0
        assert not _exists(rt.container_name(runner, c))
    finally:
        rt.cleanup(runner, c)
