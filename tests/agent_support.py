"""Test helpers for real `shoal agent` processes: start one against a `ServerProcess`, kill it
(kill -9 included), restart it on the same data dir, read its container directories, and leave
nothing behind (agent, shims, workloads, cgroups) when a test is done.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from shoal.agent import cgroups
from shoal.agent.runtime import shims
from shoal.agent.runtime.files import killpg
from tests.support import ServerProcess, wait_for


class AgentProcess:
    """`shoal agent` as a child process, joined to `server`'s cluster with the server's join token."""

    def __init__(self, server: ServerProcess, data_dir: Path, extra_args: tuple[str, ...] = (),
                 cluster: str = "default"):
        self.server, self.data_dir, self.extra_args, self.cluster = server, Path(data_dir), extra_args, cluster
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def tasks_dir(self) -> Path:
        return self.data_dir / "tasks"

    @property
    def identity(self) -> dict:
        """agent.json: {containerInstanceArn, cluster, hostId, token}, written once registered."""
        return json.loads((self.data_dir / "agent.json").read_text())

    @property
    def arn(self) -> str:
        return self.identity["containerInstanceArn"]

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}-agent.log"

    def start(self) -> "AgentProcess":
        """Start the agent and return once it has registered (agent.json exists)."""
        assert self.proc is None or self.proc.poll() is not None, "the agent is already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        token = (self.server.data_dir / "join-token").read_text().strip()
        cmd = [sys.executable, "-m", "shoal", "agent", "--server", self.server.endpoint,
               "--cluster", self.cluster, "--data-dir", str(self.data_dir), *self.extra_args]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "SHOAL_JOIN_TOKEN": token})
        self.starts += 1
        wait_for(self._registered, timeout=30, message=f"the agent to register (log: {self.log_path})")
        return self

    def _registered(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited with {self.proc.returncode}; log:\n{self.log_tail()}")
        return (self.data_dir / "agent.json").exists()

    def wait_active(self, ecs, timeout: float = 30) -> dict:
        """The agent's container instance once it is ACTIVE with its agent connected."""
        def active():
            self._registered()  # fails fast if the agent died
            ci = ecs.describe_container_instances(cluster=self.cluster,
                                                  containerInstances=[self.arn])["containerInstances"][0]
            return ci if ci["status"] == "ACTIVE" and ci["agentConnected"] else None
        return wait_for(active, timeout=timeout, interval=0.05, message=f"host {self.arn} to be ACTIVE")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the agent process alone (its shims live in sessions of their own)."""
        self.proc.send_signal(sig)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text()[-limit:]
        except FileNotFoundError:
            return "(no agent log)"

    # -- container directories ---------------------------------------------------------------
    def container_dir(self, task_arn: str, container: str) -> Path:
        return self.tasks_dir / task_arn.rsplit("/", 1)[-1] / container

    def container_dirs(self) -> list[Path]:
        """Every container directory this agent ever made (a shim was started in each)."""
        return sorted(p.parent for p in self.tasks_dir.glob("*/*/spec.json"))

    def kill_leftovers(self) -> None:
        """SIGKILL every shim and workload still running under the data dir and remove the host's
        cgroups, so nothing outlives the test. Pids are trusted only as `ShimHandle` verifies them
        (the shim by its command line, the workload by its recorded start time)."""
        for cdir in self.container_dirs():
            try:
                handle = shims.attach(cdir)
            except FileNotFoundError:  # spec written, shim never came up: nothing runs there
                continue
            if handle.workload_alive():
                killpg(handle.pid(), signal.SIGKILL)
            if handle.alive():
                os.kill(handle.shim_pid(), signal.SIGKILL)
        try:
            host = self.identity["hostId"]
        except FileNotFoundError:
            return
        layout = cgroups.detect(parent_name=f"shoal-{host}", probe=False)
        for hierarchy in {layout.v2_mount, *layout.v1_mounts.values()} - {None}:
            parent = hierarchy / f"shoal-{host}"
            if parent.is_dir():
                for leaf in parent.iterdir():
                    if leaf.is_dir():
                        _rmdir_when_empty(leaf)
                _rmdir_when_empty(parent)


def _rmdir_when_empty(path: Path, timeout: float = 5.0) -> None:
    """rmdir a cgroup once the processes just killed in it are gone (EBUSY until then)."""
    try:
        wait_for(lambda: cgroups.remove_dir(path), timeout=timeout, message=f"cgroup {path} to empty")
    except AssertionError:
        pass  # best effort: a stuck cgroup must not hide the test's own result
