"""The agent's side of the per-container shims: `launch` a container under a new shim, `attach`
to one after a restart, and read or stop it through a `ShimHandle`. What a shim does, and the
files it keeps, is described in `shoal.agent.runtime.shim`."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from shoal.agent.runtime.files import (
    EXIT, PID, PROC_START, SHIM_LOG, SHIM_PID, SHIM_START, SPEC, STARTED_AT, STDERR_LOG, STDOUT_LOG, have_proc, killpg,
    proc_stat, read_int, read_text, write_atomic,
)

LAUNCH_DEADLINE = 5.0
POLL_INTERVAL = 0.01
LAUNCH_POLL_INTERVAL = 0.001  # a launch waits a few milliseconds at most: look often


class ShimError(RuntimeError):
    """The shim could not be started or did not come up."""


class AlreadyLaunched(FileExistsError):
    """The container directory already has (or had) a shim: a container is never started twice."""


@dataclass
class ShimHandle:
    """The agent's view of one container's shim, made from the files in its directory alone."""

    dir: Path

    @property
    def stdout_path(self) -> Path:
        return self.dir / STDOUT_LOG

    @property
    def stderr_path(self) -> Path:
        return self.dir / STDERR_LOG

    def shim_pid(self) -> int | None:
        return read_int(self.dir / SHIM_PID)

    def pid(self) -> int | None:
        """The workload's pid, once it has been started."""
        return read_int(self.dir / PID)

    def started_at(self) -> float | None:
        text = read_text(self.dir / STARTED_AT)
        return float(text) if text else None

    def exit_status(self) -> dict | None:
        """The parsed exit.json, or None while the workload runs (or if its shim died unrecorded)."""
        text = read_text(self.dir / EXIT)
        return json.loads(text) if text else None

    def _is_our_shim(self, pid: int) -> bool:
        """Whether `pid` is a live (not zombie) shim for this directory, not a process reusing its pid."""
        fields = _live_stat(pid)
        if fields is None:
            return False
        if not fields:  # no /proc to tell by
            return True
        recorded = read_int(self.dir / SHIM_START)
        if recorded is not None:  # a shim forked from the launcher has the launcher's command line
            return int(fields[19]) == recorded
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            return False
        return os.fsencode(str(self.dir)) in cmdline.split(b"\0")

    def alive(self) -> bool:
        """Whether the shim is running (guarded against pid reuse by its start time or command line)."""
        pid = self.shim_pid()
        return pid is not None and self._is_our_shim(pid)

    def workload_alive(self) -> bool:
        """Whether the workload process itself still runs (it may, orphaned, if its shim was killed).

        The pid is trusted only if the process's start time matches the one the shim recorded."""
        pid = self.pid()
        fields = None if pid is None else _live_stat(pid)
        if fields is None:
            return False
        if not fields:  # no /proc to tell by
            return True
        recorded = read_int(self.dir / PROC_START)
        return recorded is not None and int(fields[19]) == recorded

    def _signal_shim(self, sig: int) -> bool:
        pid = self.shim_pid()
        if pid is None:
            return False
        pidfd = None
        try:
            pidfd = os.pidfd_open(pid)  # pins the process: the check below cannot go stale
        except ProcessLookupError:
            return False
        except (AttributeError, OSError):
            pass
        try:
            if not self._is_our_shim(pid):
                return False
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            else:
                os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def stop(self) -> None:
        """Ask the shim to stop the workload (SIGTERM, then SIGKILL after stop_timeout).

        Returns at once; `wait()` for the exit. A no-op once the workload has ended. If the shim is
        gone but the workload runs on orphaned, nothing could record a graceful stop, so its
        process group gets SIGKILL."""
        if self._signal_shim(signal.SIGTERM):
            return
        if self.exit_status() is None and self.workload_alive():
            killpg(self.pid(), signal.SIGKILL)

    def wait(self, timeout: float) -> dict | None:
        """Wait up to `timeout` seconds for exit.json and return it; None if it has not come.

        Returns None early when the shim has died without writing one."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.exit_status()
            if status is not None:
                return status
            if not self.alive():
                # The shim writes exit.json before it exits: read once more to close the race.
                return self.exit_status()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(POLL_INTERVAL, remaining))


def _live_stat(pid: int) -> list[str] | None:
    """None if `pid` is gone or a zombie; else its /proc stat fields ([] where there is no /proc)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    if not have_proc():
        return []
    fields = proc_stat(pid)
    return fields if fields and fields[0] not in ("Z", "X", "x") else None


def shim_env() -> dict[str, str]:
    """The shim's own environment: the agent's, with this package importable for `-m`."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _shim_log_tail(cdir: Path, limit: int = 2000) -> str:
    text = read_text(cdir / SHIM_LOG) or ""
    return text[-limit:].strip() or "(shim.log is empty)"


def launch(container_dir: Path, argv: list[str], env: dict[str, str], cwd: str | None,
           stop_timeout: float, cgroups: list[Path] = (), launcher=None) -> ShimHandle:
    """Write spec.json, start a detached shim for it and return once the workload has started
    (`pid` exists) or failed to (exit.json exists). With a `launcher` (a ForkServer), the shim is
    forked from it rather than started as a new interpreter.

    Raises AlreadyLaunched if the directory already has a spec or a shim (never start twice), and
    ShimError if the shim does not come up within 5 seconds."""
    if not isinstance(argv, (list, tuple)) or not argv:
        raise ValueError("argv must be a non-empty list")
    cdir = Path(container_dir).resolve()
    cdir.mkdir(parents=True, exist_ok=True)
    if (cdir / SHIM_PID).exists():
        raise AlreadyLaunched(errno.EEXIST, "container directory already has a shim", str(cdir / SHIM_PID))
    spec = {"argv": list(argv), "env": dict(env), "cwd": cwd, "stop_timeout": stop_timeout,
            "cgroups": [str(c) for c in cgroups]}
    try:
        write_atomic(cdir / SPEC, json.dumps(spec).encode(), exclusive=True)
    except FileExistsError:
        raise AlreadyLaunched(errno.EEXIST, "container directory was already launched",
                              str(cdir / SPEC)) from None

    deadline = time.monotonic() + LAUNCH_DEADLINE
    handle = ShimHandle(cdir)
    if launcher is not None:
        try:
            rc = launcher.spawn(cdir, LAUNCH_DEADLINE)
        except OSError as err:
            raise ShimError(f"shim for {cdir} could not be forked: {err}") from None
    else:
        with open(cdir / SHIM_LOG, "ab") as log:
            first = subprocess.Popen([sys.executable, "-m", "shoal.agent.runtime.shim", str(cdir)],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/",
                                     env=shim_env(), start_new_session=True, close_fds=True)
        try:
            rc = first.wait(timeout=LAUNCH_DEADLINE)  # it forks and exits at once
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
            raise ShimError(f"shim for {cdir} did not detach: {_shim_log_tail(cdir)}") from None
    if rc != 0:
        raise ShimError(f"shim for {cdir} exited with {rc}: {_shim_log_tail(cdir)}")

    while time.monotonic() < deadline:
        if (cdir / PID).exists() or (cdir / EXIT).exists():
            return handle
        pid = handle.shim_pid()
        if pid is not None and not handle.alive():
            if (cdir / PID).exists() or (cdir / EXIT).exists():
                return handle
            raise ShimError(f"shim for {cdir} died before starting the workload: {_shim_log_tail(cdir)}")
        time.sleep(LAUNCH_POLL_INTERVAL)
    handle.stop()
    raise ShimError(f"shim for {cdir} did not start the workload within {LAUNCH_DEADLINE:g}s: "
                    f"{_shim_log_tail(cdir)}")


def attach(container_dir: Path) -> ShimHandle:
    """The handle of a container launched earlier (e.g. by this agent before it restarted).

    Raises FileNotFoundError if no shim was ever started there."""
    cdir = Path(container_dir).resolve()
    if not (cdir / SHIM_PID).exists():
        raise FileNotFoundError(errno.ENOENT, "no shim was started in this container directory",
                                str(cdir / SHIM_PID))
    return ShimHandle(cdir)
