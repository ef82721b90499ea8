"""The per-container shim: the process that owns one workload so the workload can outlive the agent.

Every container process runs under a small shim, the pattern of conmon and containerd-shim. The
agent starts the shim with `launch()`; the shim detaches from the agent, starts the workload in a
session of its own, holds its log files, waits for it and records how it ended. An agent that
restarts, even after kill -9, calls `attach()` on each container directory, re-attaches to the
shim that is still running or reads the exit it missed, and never starts the task twice.

Entry point::

    python -m shoal.agent.runtime.shim /abs/path/to/container_dir

The container directory (an absolute path) holds these files. Every file the shim writes is
written atomically (a temporary file, then a rename), so a reader sees all of a file or none:

    spec.json    written by the caller before the shim starts:
                 {"argv": [...], "env": {...}, "cwd": "..." | null, "stop_timeout": seconds,
                  "cgroups": ["/sys/fs/cgroup/…", …]}: the workload joins these cgroup
                 directories before it execs (see shoal.agent.cgroups).
                 `env` is the workload's whole environment (nothing is inherited from the agent
                 or the shim); argv[0] without a slash is looked up on that environment's PATH
                 (or the default path when it has none). `cwd` null means "/".
    shim.pid     the shim's pid. It is claimed exclusively (a hard link), so two shims can
                 never run in one directory.
    shim_start   the shim's start time in clock ticks, written just before shim.pid: with it the
                 agent tells the shim apart from a later process that reuses its pid (a shim
                 forked from the agent's launcher has the launcher's command line).
    shim.log     the shim's own stdout and stderr (its stdin is /dev/null): what it did and why.
    stdout.log   the workload's stdout and stderr, opened by the shim in append mode and handed
    stderr.log   to the workload directly, so logging goes on whether or not an agent runs.
    started_at   epoch seconds (float) at which the workload was started.
    proc_start   the workload's start time in clock ticks since boot (/proc/<pid>/stat field
                 22), which tells the workload apart from a later process that reuses its pid.
    pid          the workload's pid; written after started_at and proc_start, so once it
                 exists they do too.
    exit.json    how the workload ended; written once, after which the shim exits.

Exit status convention (exit.json), following ECS and docker:

    {"exitCode": int | null, "signal": int | null, "finishedAt": epoch float,
     "stopRequested": bool, "killed": bool}

- The workload exited with status N: exitCode N, signal null.
- The workload was killed by signal N: exitCode 128 + N and signal N, so SIGKILL reads
  exitCode 137 and SIGTERM 143, as DescribeTasks reports them; the agent can pass exitCode
  through unchanged. `signal` tells a signal death apart from a process that called exit(137).
- exitCode is null only when the workload never ran. Then exit.json also holds "error", a
  message (e.g. "[Errno 2] No such file or directory: '/nonexistent'"), and signal is null.
- stopRequested: the shim got a stop request (SIGTERM) before the workload ended.
  killed: the stop timeout ran out and the shim sent SIGKILL.

Stopping: SIGTERM (or SIGINT) to the shim is a stop request. The shim sends SIGTERM to the
workload's process group, waits up to `stop_timeout` seconds, then sends SIGKILL to the group; the
exit is recorded as usual. Further stop requests while stopping change nothing. SIGHUP is ignored.

Process hygiene:

- The shim forks once at start and the first process exits at once, so the launcher only has a
  short-lived child to reap and the shim is reparented to init (or to the nearest child subreaper:
  an agent that makes itself a subreaper must reap the shims that exit). The shim calls setsid()
  and chdir("/"), so it belongs to no terminal, no session and no directory of the agent's.
- The workload runs in a new session (and so a new process group) of its own: signals to the
  agent's process group never reach the shim or the workload.
- The shim makes itself a child subreaper (Linux), so the workload's orphaned descendants become
  its children and it reaps them: the shim leaves no zombies.
- When the workload's main process ends, the container ends: the shim sends SIGKILL to what is
  left of the workload's process group (as docker does when a container's init exits), reaps it,
  and waits up to a few seconds for the group to be gone before it writes exit.json.

Limits: a signal that reaches the shim in the few milliseconds between its start and its
installing its handlers kills it with the default action, but no stop request can come that early
through `ShimHandle.stop()`, which needs shim.pid, written after the handlers. A shim killed with
SIGKILL records nothing: `ShimHandle.alive()` is then False with no `exit_status()`, while the
workload may still run orphaned (`ShimHandle.workload_alive()`); `ShimHandle.stop()` then kills the
workload's process group outright.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from shoal.agent.cgroups import preexec_join
from shoal.agent.runtime.files import (
    EXIT, PID, PROC_START, SHIM_LOG, SHIM_PID, SHIM_START, SPEC, STARTED_AT, STDERR_LOG, STDOUT_LOG, killpg,
    proc_start_ticks, write_atomic,
)

DEFAULT_STOP_TIMEOUT = 30.0
# How long the shim waits, after the main process ended and the group got SIGKILL, for the rest of
# the group to be gone (a process in uninterruptible sleep, e.g. in a GPU driver, can take a while).
GROUP_GRACE = 3.0
_PR_SET_CHILD_SUBREAPER = 36


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    print(f"{stamp} shim[{os.getpid()}] {message}", file=sys.stderr, flush=True)


def _load_spec(path: Path) -> tuple[list[str], dict[str, str], str, float, list[str]]:
    spec = json.loads(path.read_text())
    cgroups = spec.get("cgroups") or []
    if not isinstance(cgroups, list) or not all(isinstance(c, str) for c in cgroups):
        raise ValueError("cgroups must be a list of cgroup directories")
    argv, env = spec.get("argv"), spec.get("env") or {}
    cwd, stop_timeout = spec.get("cwd"), spec.get("stop_timeout", DEFAULT_STOP_TIMEOUT)
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a non-empty list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in env.items()):
        raise ValueError("env must map strings to strings")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError("cwd must be a string or null")
    if stop_timeout is None:
        stop_timeout = DEFAULT_STOP_TIMEOUT
    if isinstance(stop_timeout, bool) or not isinstance(stop_timeout, (int, float)) or stop_timeout < 0:
        raise ValueError("stop_timeout must be a number of seconds >= 0")
    return argv, env, cwd or "/", float(stop_timeout), cgroups


def _write_exit(cdir: Path, record: dict) -> None:
    record.setdefault("finishedAt", time.time())
    write_atomic(cdir / EXIT, json.dumps(record).encode())
    _log(f"exit recorded: {json.dumps(record)}")


class _Shim:
    def __init__(self, cdir: Path):
        self.dir = cdir
        self.stop_requested = False
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def _on_stop(self, signum, frame) -> None:
        self.stop_requested = True

    def install_signals(self) -> None:
        # Caught (not ignored) signals go back to their defaults in the workload on exec. The wakeup
        # fd is written by the C-level handler, so a signal that lands just before select() still
        # wakes it.
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, lambda s, f: None)
        signal.signal(signal.SIGCHLD, lambda s, f: None)

    def sleep(self, timeout: float | None) -> None:
        """Sleep until a signal arrives or `timeout` seconds pass (None: until a signal)."""
        select.select([self.wake_r], [], [], timeout)
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    @staticmethod
    def reap(main: int) -> int | None:
        """Reap every exited child; return the main process's wait status once it has exited.

        The main process is first only peeked at (WNOWAIT): while it is an unreaped zombie its pid
        is still its process group's id, so the SIGKILL to the rest of the group cannot hit a
        group that reused the id."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return None
            if info is None:
                return None
            if info.si_pid == main:
                killpg(main, signal.SIGKILL)
                return os.waitpid(main, 0)[1]
            os.waitpid(info.si_pid, 0)

    @staticmethod
    def reap_others() -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def run(self) -> int:
        cdir = self.dir
        try:
            argv, env, cwd, stop_timeout, cgroups = _load_spec(cdir / SPEC)
        except (OSError, ValueError) as e:
            _write_exit(cdir, {"exitCode": None, "signal": None, "error": f"bad spec: {e}",
                               "stopRequested": self.stop_requested, "killed": False})
            return 1
        if self.stop_requested:
            _write_exit(cdir, {"exitCode": None, "signal": None,
                               "error": "stop requested before the process started",
                               "stopRequested": True, "killed": False})
            return 0

        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                    _log(f"prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}")
            except OSError as e:
                _log(f"cannot become a child subreaper: {e}")

        out = open(cdir / STDOUT_LOG, "ab")
        err = open(cdir / STDERR_LOG, "ab")
        try:
            # The workload joins its cgroups between fork and exec, so its limits hold from its
            # first instruction; if it cannot join, it does not run (no silent loss of limits).
            proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=err, start_new_session=True, close_fds=True,
                                    preexec_fn=preexec_join(cgroups) if cgroups else None)
        except (OSError, ValueError, TypeError, subprocess.SubprocessError) as e:
            _write_exit(cdir, {"exitCode": None, "signal": None, "error": str(e),
                               "stopRequested": self.stop_requested, "killed": False})
            return 0
        main = proc.pid
        started = time.time()
        write_atomic(cdir / STARTED_AT, repr(started).encode())
        ticks = proc_start_ticks(main)  # the child is ours and not reaped yet: /proc has it
        if ticks is not None:
            write_atomic(cdir / PROC_START, str(ticks).encode())
        write_atomic(cdir / PID, str(main).encode())
        _log(f"started pid {main}: {argv!r} in {cwd}")

        forwarded = killed = False
        deadline = None
        while True:
            if self.stop_requested and not forwarded:
                forwarded = True
                deadline = time.monotonic() + stop_timeout
                _log(f"stop requested: SIGTERM to group {main}, SIGKILL in {stop_timeout:g}s")
                killpg(main, signal.SIGTERM)
            if deadline is not None and not killed and time.monotonic() >= deadline:
                killed = True
                _log(f"stop timeout: SIGKILL to group {main}")
                killpg(main, signal.SIGKILL)
            status = self.reap(main)
            if status is not None:
                break
            self.sleep(None if deadline is None or killed else max(0.0, deadline - time.monotonic()))
        proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen never waits for it itself

        # The container is over: make sure nothing of its process group is left, reaping as we go.
        grace_end = time.monotonic() + GROUP_GRACE
        while True:
            self.reap_others()
            if not killpg(main, 0):
                break
            if time.monotonic() >= grace_end:
                _log(f"process group {main} still has members after {GROUP_GRACE:g}s")
                break
            killpg(main, signal.SIGKILL)
            self.sleep(0.02)

        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            record = {"exitCode": 128 + sig, "signal": sig}
        else:
            record = {"exitCode": os.WEXITSTATUS(status), "signal": None}
        record.update(finishedAt=time.time(), stopRequested=forwarded, killed=killed)
        _write_exit(cdir, record)
        out.close()
        err.close()
        return 0


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    if len(args) != 1 or not os.path.isabs(args[0]) or not os.path.isdir(args[0]):
        print("usage: python -m shoal.agent.runtime.shim <absolute container_dir>", file=sys.stderr)
        return 2
    cdir = Path(args[0])
    if (cdir / SHIM_PID).exists():
        print(f"{cdir} already has a shim", file=sys.stderr)
        return 1

    # Detach: the first process exits at once, the second leads a session of its own.
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    os.chdir("/")

    shim = _Shim(cdir)
    shim.install_signals()
    # Our own stdio: nothing of the launcher's, everything said goes to shim.log.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    logfd = os.open(cdir / SHIM_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(logfd, 1)
    os.dup2(logfd, 2)
    os.close(logfd)

    try:
        write_atomic(cdir / SHIM_START, str(proc_start_ticks(os.getpid())).encode())
        write_atomic(cdir / SHIM_PID, str(os.getpid()).encode(), exclusive=True)
    except FileExistsError:
        _log("another shim owns this directory; exiting")
        return 1
    try:
        return shim.run()
    except BaseException as e:  # leave a trace for the agent rather than die silently
        _log(f"shim failed: {e!r}")
        if not (cdir / EXIT).exists() and not (cdir / PID).exists():
            _write_exit(cdir, {"exitCode": None, "signal": None, "error": f"shim failed: {e!r}",
                               "stopRequested": shim.stop_requested, "killed": False})
        raise


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit now: interpreter teardown takes ~20 ms, and the agent sees the exit when we are gone.
    os._exit(code if isinstance(code, int) else 1)
