"""Hosts simulated on this machine: each one is a `shoal agent --simulate` process with a data
directory of its own, `root/<host_id>/`.

Everything the provisioner knows lives in that directory, so a server that restarts finds the
hosts an earlier one launched:

    host.json     hostId, instanceType, cluster, capacityProvider, launchedAt
    agent.pid     the agent's pid
    agent.start   its start time (/proc/<pid>/stat field 22), which tells it from a later process
                  that reuses the pid
    agent.log     the agent's stdout and stderr
    terminated    written last by terminate(); the directory stays so that its logs can be read

Terminating a host is the machine vanishing: the agent is killed, and so is every workload it
ran (each container's shim and the workload's process group), with no graceful stop recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from shoal.agent.runtime.files import (
    SHIM_PID, have_proc, killpg, proc_start_ticks, proc_stat, read_int, read_text, write_atomic,
)
from shoal.agent.runtime.shims import attach
from shoal.providers.base import HOST_ID, Host, LaunchRequest, ProvisionerError, new_host_id

HOST_JSON = "host.json"
AGENT_PID = "agent.pid"
AGENT_START = "agent.start"
AGENT_LOG = "agent.log"
TERMINATED = "terminated"
TASKS = "tasks"
STOP_TIMEOUT = 5.0
POLL_INTERVAL = 0.02


class LocalProvisioner:
    name = "local"

    def __init__(self, root: Path, agent_command: list[str] | None = None,
                 stop_timeout: float = STOP_TIMEOUT, env: dict[str, str] | None = None):
        self.root = Path(root).resolve()
        self.agent_command = list(agent_command or [sys.executable, "-m", "shoal", "agent"])
        self.stop_timeout = stop_timeout  # how long an agent gets to exit on SIGTERM before SIGKILL
        self.env = env  # the agents' environment (default: this process's)

    def launch(self, request: LaunchRequest) -> list[Host]:
        """Start `request.count` agents. If one cannot be started, the ones already started are
        terminated again before ProvisionerError is raised: a launch is all or nothing."""
        if request.count < 1:
            raise ValueError(f"count must be at least 1, not {request.count}")
        self.root.mkdir(parents=True, exist_ok=True)
        started: list[str] = []
        try:
            for _ in range(request.count):
                host_id = new_host_id()
                started.append(host_id)
                self._start(host_id, request)
        except OSError as exc:
            for host_id in started:
                self.terminate(host_id)
            raise ProvisionerError(f"local: could not start agent {self.agent_command!r}: {exc}") from exc
        return [Host(host_id, request.instance_type, "running") for host_id in started]

    def _start(self, host_id: str, request: LaunchRequest) -> None:
        hdir = self.root / host_id
        hdir.mkdir()
        record = {"hostId": host_id, "instanceType": request.instance_type, "cluster": request.cluster,
                  "capacityProvider": request.capacity_provider,
                  "launchedAt": datetime.now(timezone.utc).isoformat()}
        write_atomic(hdir / HOST_JSON, json.dumps(record).encode())
        argv = [*self.agent_command, "--server", request.server_url, "--cluster", request.cluster,
                "--capacity-provider", request.capacity_provider, "--data-dir", str(hdir),
                "--host-id", host_id, "--instance-type", request.instance_type, "--simulate"]
        # The token goes in the environment: a command line is readable by every user on the host.
        env = {**(os.environ if self.env is None else self.env), "SHOAL_JOIN_TOKEN": request.join_token}
        with open(hdir / AGENT_LOG, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=hdir,
                                    env=env, start_new_session=True, close_fds=True)
        # Read before anything waits on the child: until it is reaped, the pid is still its own.
        start = proc_start_ticks(proc.pid)
        # The server lives long; a thread per agent reaps it when it exits, so no zombie is left.
        threading.Thread(target=proc.wait, name=f"reap-agent-{host_id}", daemon=True).start()
        if start is not None:
            write_atomic(hdir / AGENT_START, str(start).encode())
        write_atomic(hdir / AGENT_PID, str(proc.pid).encode())

    def terminate(self, host_id: str) -> None:
        """Kill the host's agent (SIGTERM, then SIGKILL after stop_timeout), then every
        workload it ran, then mark the host terminated. Unknown or terminated hosts: a no-op."""
        hdir = self._host_dir(host_id)
        if hdir is None or (hdir / TERMINATED).exists():
            return
        if self._signal_agent(hdir, signal.SIGTERM):
            deadline = time.monotonic() + self.stop_timeout
            while self._agent_alive(hdir) and time.monotonic() < deadline:
                time.sleep(POLL_INTERVAL)
            self._signal_agent(hdir, signal.SIGKILL)
        self._kill_workloads(hdir)
        write_atomic(hdir / TERMINATED, datetime.now(timezone.utc).isoformat().encode())

    def list(self) -> list[Host]:
        """Hosts with a host.json and no terminated marker, oldest first; "running" while the
        agent process lives, "stopped" once it is gone."""
        hosts = []
        if not self.root.is_dir():
            return hosts
        for hdir in self.root.iterdir():
            text = read_text(hdir / HOST_JSON) if HOST_ID.fullmatch(hdir.name) else None
            if text is None or (hdir / TERMINATED).exists():
                continue
            record = json.loads(text)
            state = "running" if self._agent_alive(hdir) else "stopped"
            hosts.append((record["launchedAt"], Host(hdir.name, record["instanceType"], state)))
        return [host for _, host in sorted(hosts, key=lambda pair: pair[0])]

    def _host_dir(self, host_id: str) -> Path | None:
        """The host's directory, or None for an id that was never launched here. The id is checked
        against the EC2 shape first, so it can never name a path outside root."""
        if not HOST_ID.fullmatch(host_id):
            return None
        hdir = self.root / host_id
        return hdir if (hdir / HOST_JSON).exists() else None

    def _agent_alive(self, hdir: Path) -> bool:
        pid = read_int(hdir / AGENT_PID)
        return pid is not None and _is_process(pid, read_int(hdir / AGENT_START))

    def _signal_agent(self, hdir: Path, sig: int) -> bool:
        pid = read_int(hdir / AGENT_PID)
        start = read_int(hdir / AGENT_START)
        return pid is not None and _signal(pid, lambda: _is_process(pid, start), sig)

    def _kill_workloads(self, hdir: Path) -> None:
        """SIGKILL each container's shim first, so that no exit is recorded (the machine is gone,
        not stopped), then the workload's process group, which the shim started in its own session."""
        tasks = hdir / TASKS
        if not tasks.is_dir():
            return
        for shim_pid_file in tasks.rglob(SHIM_PID):
            handle = attach(shim_pid_file.parent)
            shim_pid = handle.shim_pid()
            if shim_pid is not None:
                _signal(shim_pid, handle.alive, signal.SIGKILL)
            if handle.workload_alive():
                killpg(handle.pid(), signal.SIGKILL)


def _is_process(pid: int, start: int | None) -> bool:
    """Whether `pid` is a live, non-zombie process that started at `start` (clock ticks after boot).

    Without /proc there is nothing to compare, and a signal 0 is the best test there is."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not have_proc():
        return True
    fields = proc_stat(pid)
    if not fields or fields[0] in ("Z", "X", "x"):
        return False
    return start is not None and int(fields[19]) == start


def _signal(pid: int, is_ours: Callable[[], bool], sig: int) -> bool:
    """Send `sig` to `pid` if `is_ours()` says the process there is still the one we mean.

    The pidfd is opened before the check and the signal goes through it, so a pid that is freed
    and reused in between cannot receive it. Without pidfds, a plain kill follows the check."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        fd = None
    try:
        if not is_ours():
            return False
        if fd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
