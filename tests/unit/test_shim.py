"""The per-container shim, with real processes: exits and logs recorded, env and cwd honoured,
the stop sequence, start failures, and a workload that outlives the process that launched it."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shoal.agent.runtime.shims import AlreadyLaunched, attach, launch
from tests.support import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shim tests read /proc")

ENV = {"PATH": os.environ.get("PATH", os.defpath)}




def gone(pid: int) -> bool:
    """No process, not even a zombie, has this pid."""
    return not Path(f"/proc/{pid}").exists()


def set_child_subreaper(on: bool) -> bool:
    return ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER


def reap_if_our_zombie(pid: int | None) -> None:
    """Reap `pid` if it is an exited child of this process (waiting briefly for it to exit)."""
    stat = Path(f"/proc/{pid}/stat") if pid else None
    deadline = time.monotonic() + 5
    while stat and time.monotonic() < deadline:
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            return
        if int(fields[1]) != os.getpid():
            return
        if fields[0] == "Z":
            os.waitpid(pid, 0)
            return
        time.sleep(0.01)


@pytest.fixture
def containers(tmp_path):
    """A factory of fresh container directories; whatever is still running at the end is killed.

    While a test runs, this process is a child subreaper, the way an agent may run: the shims
    (detached from their launchers) become its children, and it reaps them at the end, so the
    tests leave no zombies even where PID 1 does not reap orphans."""
    made: list[Path] = []
    subreaper = set_child_subreaper(True)

    def new(name: str = "c") -> Path:
        path = tmp_path / f"{name}-{len(made)}"
        made.append(path)
        return path

    yield new
    for path in made:
        if (path / "shim.pid").exists():
            handle = attach(path)
            if handle.alive() or handle.workload_alive():
                handle.stop()
                if handle.wait(5) is None and handle.workload_alive():
                    os.killpg(handle.pid(), signal.SIGKILL)
    if subreaper:
        set_child_subreaper(False)
        for path in made:
            if (path / "shim.pid").exists():
                handle = attach(path)
                reap_if_our_zombie(handle.shim_pid())
                reap_if_our_zombie(handle.pid())


def test_exit_code_and_both_logs_are_recorded(containers):
    handle = launch(containers(), ["sh", "-c", "echo out; echo err >&2; exit 3"], ENV, None, 5)
    status = handle.wait(10)
    assert status is not None
    assert status["exitCode"] == 3 and status["signal"] is None
    assert status["stopRequested"] is False and status["killed"] is False
    assert handle.stdout_path.read_text() == "out\n"
    assert handle.stderr_path.read_text() == "err\n"
    assert isinstance(handle.pid(), int) and isinstance(handle.shim_pid(), int)
    assert handle.started_at() <= status["finishedAt"] <= time.time()
    # The workload was reaped by the shim (no zombie), and the shim goes away once it has recorded.
    assert gone(handle.pid())
    wait_for(lambda: not handle.alive(), 5, message="the shim to exit")
    assert not handle.workload_alive()


def test_env_is_exactly_the_spec_and_cwd_is_honoured(containers, tmp_path):
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    script = 'echo "$GREETING"; pwd; echo "${SHOAL_SHOULD_NOT_LEAK-unset}"'
    os.environ["SHOAL_SHOULD_NOT_LEAK"] = "leaked"
    try:
        handle = launch(containers(), ["sh", "-c", script], {**ENV, "GREETING": "hello world"},
                        str(workdir), 5)
    finally:
        del os.environ["SHOAL_SHOULD_NOT_LEAK"]
    assert handle.wait(10)["exitCode"] == 0
    assert handle.stdout_path.read_text().splitlines() == ["hello world", str(workdir.resolve()), "unset"]

    default = launch(containers(), ["pwd"], ENV, None, 5)
    assert default.wait(10)["exitCode"] == 0
    assert default.stdout_path.read_text() == "/\n"


def test_stop_sends_sigterm_to_the_workload(containers):
    handle = launch(containers(), ["sleep", "30"], ENV, None, 5)
    assert handle.alive() and handle.workload_alive() and handle.exit_status() is None
    handle.stop()
    status = handle.wait(5)
    assert status is not None
    assert (status["exitCode"], status["signal"]) == (128 + signal.SIGTERM, signal.SIGTERM)
    assert status["stopRequested"] is True and status["killed"] is False
    handle.stop()  # a no-op once the workload has ended
    assert handle.exit_status() == status


def test_a_workload_ignoring_sigterm_is_killed_after_the_stop_timeout(containers):
    handle = launch(containers(), ["sh", "-c", 'trap "" TERM; echo ready; sleep 30'], ENV, None, 0.5)
    wait_for(lambda: handle.stdout_path.read_text() == "ready\n", 5, message="the trap to be set")
    started = time.monotonic()
    handle.stop()
    status = handle.wait(10)
    elapsed = time.monotonic() - started
    assert status is not None
    assert status["signal"] == signal.SIGKILL and status["exitCode"] == 137
    assert status["stopRequested"] is True and status["killed"] is True
    assert 0.5 <= elapsed < 5
    assert gone(handle.pid())


@pytest.mark.parametrize("argv, cwd, message", [
    (["/nonexistent"], None, "No such file or directory"),
    (["{tmp}/not-executable"], None, "Permission denied"),
    (["true"], "{tmp}/no-such-dir", "No such file or directory"),
])
def test_a_workload_that_cannot_start_records_an_error(containers, tmp_path, argv, cwd, message):
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    argv = [a.format(tmp=tmp_path) for a in argv]
    cwd = cwd.format(tmp=tmp_path) if cwd else None
    handle = launch(containers(), argv, ENV, cwd, 5)
    status = handle.wait(5)
    assert status is not None
    assert status["exitCode"] is None and status["signal"] is None
    assert message in status["error"]
    assert handle.pid() is None


def test_the_workload_outlives_its_launcher_and_a_new_agent_attaches(containers, tmp_path):
    cdir, workdir = containers(), tmp_path / "work"
    workdir.mkdir()
    script = "echo started; while [ ! -e go ]; do sleep 0.02; done; echo done; exit 7"
    launcher_code = textwrap.dedent(f"""
        import sys, time
        from shoal.agent.runtime.shims import launch
        handle = launch({str(cdir)!r}, ["sh", "-c", {script!r}], {ENV!r}, {str(workdir)!r}, 5)
        print(handle.pid(), flush=True)
        time.sleep(60)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", launcher_code], stdout=subprocess.PIPE,
                                start_new_session=True)
    pid = int(launcher.stdout.readline())
    # kill -9 the launcher's whole process group: nothing of the shim or workload is in it.
    os.killpg(launcher.pid, signal.SIGKILL)
    # The launcher's stdout reaches EOF: the shim holds none of the launcher's stdio.
    launcher.communicate(timeout=5)
    assert launcher.returncode == -signal.SIGKILL

    handle = attach(cdir)
    assert handle.pid() == pid
    time.sleep(0.2)
    assert handle.alive() and handle.workload_alive() and handle.exit_status() is None
    assert handle.wait(0.1) is None

    (workdir / "go").touch()
    status = handle.wait(10)
    assert status is not None and status["exitCode"] == 7 and status["signal"] is None
    assert (cdir / "stdout.log").read_text() == "started\ndone\n"
    assert attach(cdir).exit_status() == status


def test_launching_twice_into_one_directory_raises(containers):
    cdir = containers()
    handle = launch(cdir, ["true"], ENV, None, 5)
    with pytest.raises(AlreadyLaunched):
        launch(cdir, ["true"], ENV, None, 5)
    assert handle.wait(5)["exitCode"] == 0
    with pytest.raises(FileExistsError):
        launch(cdir, ["true"], ENV, None, 5)
    assert handle.shim_pid() == attach(cdir).shim_pid()


def test_attach_to_a_directory_without_a_shim_raises(containers):
    cdir = containers()
    cdir.mkdir()
    with pytest.raises(FileNotFoundError):
        attach(cdir)


def test_what_the_workload_leaves_behind_is_killed_and_reaped(containers, tmp_path):
    handle = launch(containers(), ["sh", "-c", "sleep 30 & echo $! > bg.pid; exit 0"], ENV,
                    str(tmp_path), 5)
    status = handle.wait(10)
    assert status is not None and status["exitCode"] == 0
    background = int((tmp_path / "bg.pid").read_text())
    assert gone(background)


def test_a_killed_shim_leaves_an_orphan_that_stop_still_kills(containers):
    handle = launch(containers(), ["sleep", "30"], ENV, None, 5)
    os.kill(handle.shim_pid(), signal.SIGKILL)
    wait_for(lambda: not handle.alive(), 5, message="the shim to die")
    assert handle.wait(1) is None  # returns early: nobody is left to write exit.json
    assert handle.workload_alive()
    handle.stop()
    wait_for(lambda: not handle.workload_alive(), 5, message="the orphaned workload to die")
    assert handle.exit_status() is None


def test_pid_reuse_does_not_pass_for_a_live_shim_or_workload(tmp_path):
    # Files naming a live process that is not this directory's shim or workload: this test.
    cdir = tmp_path / "reused"
    cdir.mkdir()
    for name in ("shim.pid", "pid"):
        (cdir / name).write_text(str(os.getpid()))
    (cdir / "proc_start").write_text("1")
    handle = attach(cdir)
    assert not handle.alive() and not handle.workload_alive()
    handle.stop()  # must signal nothing, this process least of all


def test_the_workload_runs_inside_its_cgroups_from_the_start(tmp_path):
    from shoal.agent import cgroups

    parent = f"shoal-shim-test-{os.getpid()}"
    layout = cgroups.detect(parent_name=parent)
    if not layout.memory.writable:
        pytest.skip(f"the memory cgroup is not writable here ({layout.memory})")
    cg = cgroups.ContainerCgroup.create(layout, parent, "hog", memory_mib=64)
    try:
        argv = [sys.executable, "-c", "b = bytearray(200 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096])"]
        handle = launch(tmp_path / "c", argv, {}, None, 1.0, cgroups=cg.paths)
        status = handle.wait(20)
        assert (status["exitCode"], status["signal"]) == (137, 9)
        assert cg.oom_killed()
    finally:
        cg.remove()
        cgroups.remove_parent(layout, parent)


def test_a_workload_that_cannot_join_its_cgroup_does_not_run(tmp_path):
    handle = launch(tmp_path / "c", ["/bin/true"], {}, None, 1.0, cgroups=[tmp_path / "no-such-cgroup"])
    status = handle.wait(10)
    assert status["exitCode"] is None and "preexec" in status["error"]


def test_shims_forked_from_the_launcher_run_and_outlive_it(tmp_path):
    """The fork server starts shims like the command line does, and they do not need it."""
    from shoal.agent.runtime.forkserver import ForkServer
    from shoal.agent.runtime.shims import shim_env

    launcher = ForkServer(shim_env())
    try:
        quick = launch(tmp_path / "quick", ["sh", "-c", "echo forked; exit 5"], {}, None, 1,
                             launcher=launcher)
        assert quick.wait(10)["exitCode"] == 5
        assert (tmp_path / "quick" / "stdout.log").read_text() == "forked\n"
        slow = launch(tmp_path / "slow", ["sleep", "30"], {}, None, 1, launcher=launcher)
        launcher_pid = launcher._proc.pid
    finally:
        launcher.close()
    assert wait_for(lambda: gone(launcher_pid)), "closing stops the launcher"
    assert slow.alive() and slow.workload_alive(), "the shim and its workload carry on without it"
    slow.stop()
    assert slow.wait(10)["exitCode"] == 143
