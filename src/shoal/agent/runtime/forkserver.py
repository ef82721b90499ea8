"""A pre-started shim launcher (a fork server).

Starting each container's shim as a fresh interpreter costs ~60 ms here (interpreter start and
imports), most of the time from RunTask to RUNNING. The agent instead keeps one launcher process
that has imported the shim already; each shim is forked from it in about a millisecond, then
detaches exactly as one started from the command line does (`shim.main`). Shims do not depend on
the launcher or on the agent: if either dies, running shims carry on, and a restarted agent
starts a new launcher.

Protocol, over the launcher's stdin and stdout: the agent writes one absolute container directory
per line; the launcher answers each with one line, the exit status of the shim's first process
(0 once the shim has detached). End of input stops the launcher.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from shoal.agent.runtime import shim


def serve() -> int:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    for line in stdin:
        cdir = line.decode().strip()
        pid = os.fork()
        if pid == 0:  # the shim's first process: shim.main forks again and exits at once
            try:
                code = shim.main([cdir])
            except BaseException:
                code = 1
            os._exit(code if isinstance(code, int) else 1)
        _, status = os.waitpid(pid, 0)
        stdout.write(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        stdout.flush()
    return 0


class ForkServer:
    """The agent's handle on its launcher; thread-safe (launches run on worker threads)."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-m", "shoal.agent.runtime.forkserver"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, cwd="/", env=self.env,
                                          start_new_session=True, close_fds=True)
        return self._proc

    def spawn(self, cdir: Path, timeout: float) -> int:
        """Start the shim for `cdir`; return the exit status of its first process."""
        with self._lock:
            proc = self._ensure()
            try:
                proc.stdin.write(f"{cdir}\n".encode())
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], timeout)
                answer = proc.stdout.readline() if ready else b""
            except (BrokenPipeError, OSError):
                answer = b""
            if not answer.strip():
                self._kill(proc)
                raise OSError(f"the shim launcher did not answer for {cdir}")
            return int(answer)

    def _kill(self, proc: subprocess.Popen) -> None:
        proc.kill()
        proc.wait()
        self._proc = None

    def close(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.stdin.close()
                deadline = time.monotonic() + 2
                while self._proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                if self._proc.poll() is None:
                    self._kill(self._proc)
            self._proc = None


if __name__ == "__main__":
    sys.exit(serve())
