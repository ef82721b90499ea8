"""ECS container ``healthCheck`` runner (docker/ECS-agent semantics).

* The first probe runs ``interval`` seconds after the container starts; each
  following probe runs ``interval`` seconds after the previous one finished.
* A probe passes if it exits 0 within ``timeout``; anything else (non-zero exit,
  timeout, failure to start) is a failure.  On timeout the probe's whole process
  group is killed.
* Status starts UNKNOWN.  While no probe has passed yet and the probe started
  within ``startPeriod``, failures are not counted; a success makes it HEALTHY
  at once.  Otherwise ``retries`` consecutive failures make it UNHEALTHY and one
  success makes it HEALTHY again.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)

UNKNOWN, HEALTHY, UNHEALTHY = "UNKNOWN", "HEALTHY", "UNHEALTHY"
OUTPUT_LIMIT = 1024  # bytes of probe output (stdout+stderr) kept, like docker's 4 KiB cap


def _number(d: dict, key: str, default, lo, hi, integer: bool = False):
    v = d.get(key, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and v != int(v)):
        raise ValueError(f"healthCheck.{key} must be {'an integer' if integer else 'a number'}, got {v!r}")
    if not lo <= v <= hi:
        raise ValueError(f"healthCheck.{key} must be between {lo} and {hi}, got {v!r}")
    return int(v) if integer else v


@dataclass(frozen=True)
class HealthCheckSpec:
    command: list[str]
    interval: float = 30
    timeout: float = 5
    retries: int = 3
    start_period: float = 0

    def __post_init__(self) -> None:
        # Loose checks only: tests (and the agent) may use sub-ECS timings.
        c = self.command
        if not isinstance(c, (list, tuple)) or len(c) < 2 or c[0] not in ("CMD", "CMD-SHELL") \
                or not all(isinstance(x, str) for x in c) or (c[0] == "CMD-SHELL" and not "".join(c[1:]).strip()):
            raise ValueError(f"healthCheck.command must be ['CMD', exe, args...] or ['CMD-SHELL', script], got {c!r}")
        if self.interval <= 0 or self.timeout <= 0 or self.retries < 1 or self.start_period < 0:
            raise ValueError("healthCheck interval/timeout must be > 0, retries >= 1, startPeriod >= 0")

    @classmethod
    def from_ecs(cls, d: dict) -> "HealthCheckSpec":
        if not isinstance(d, dict):
            raise ValueError("healthCheck must be an object")
        cmd = d.get("command")
        if not isinstance(cmd, list) or not cmd or cmd[0] not in ("CMD", "CMD-SHELL"):
            raise ValueError(f"healthCheck.command must start with 'CMD' or 'CMD-SHELL', got {cmd!r}")
        if len(cmd) < 2 or not all(isinstance(x, str) and x for x in cmd[1:]):
            raise ValueError(f"healthCheck.command needs a non-empty command after {cmd[0]!r}, got {cmd!r}")
        return cls(
            command=list(cmd),
            interval=_number(d, "interval", 30, 5, 300, integer=True),
            timeout=_number(d, "timeout", 5, 2, 60, integer=True),
            retries=_number(d, "retries", 3, 1, 10, integer=True),
            start_period=_number(d, "startPeriod", 0, 0, 300, integer=True),
        )

    def argv(self) -> list[str]:
        if self.command[0] == "CMD-SHELL":
            return ["/bin/sh", "-c", " ".join(self.command[1:])]
        return list(self.command[1:])


class HealthState:
    """Pure health state machine driven by probe results and a monotonic clock."""

    def __init__(self, spec: HealthCheckSpec, started_at: float):
        self.spec = spec
        self.started_at = started_at
        self.status = UNKNOWN
        self.failing_streak = 0
        self._next = started_at + spec.interval

    def record(self, passed: bool, now: float, probe_started: float | None = None) -> bool:
        """Record a result finished at ``now``; ``probe_started`` (default ``now``)
        decides whether the failure fell inside the start period.  Returns True
        if the status changed."""
        old = self.status
        self._next = now + self.spec.interval
        if passed:
            self.failing_streak = 0
            self.status = HEALTHY
        else:
            t = now if probe_started is None else probe_started
            in_grace = self.status == UNKNOWN and t - self.started_at < self.spec.start_period
            if not in_grace:
                self.failing_streak += 1
                if self.failing_streak >= self.spec.retries:
                    self.status = UNHEALTHY
        return self.status != old

    def next_probe_at(self) -> float:
        return self._next


class HealthChecker:
    """Runs the probes of one container on a daemon thread."""

    def __init__(self, spec: HealthCheckSpec, env: dict[str, str], cwd: str | None,
                 on_change: Callable[[str, str], None], clock: Callable[[], float] = time.monotonic):
        self.spec, self.env, self.cwd, self.on_change, self.clock = spec, dict(env), cwd, on_change, clock
        self.env.setdefault("PATH", os.environ.get("PATH", os.defpath))
        self.state: HealthState | None = None
        self.last_output = ""
        self.last_exit_code: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    @property
    def status(self) -> str:
        return self.state.status if self.state else UNKNOWN

    def start(self, started_at: float | None = None) -> None:
        if self._thread is not None:
            return
        self.state = HealthState(self.spec, self.clock() if started_at is None else started_at)
        self._thread = threading.Thread(target=self._run, name="healthcheck", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        with self._lock:
            if self._proc is not None:
                _killpg(self._proc)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        assert self.state is not None
        while not self._stop.wait(max(0.0, self.state.next_probe_at() - self.clock())):
            started = self.clock()
            passed, output = self._probe()
            if self._stop.is_set():
                break
            self.last_output = output
            if self.state.record(passed, self.clock(), probe_started=started):
                try:
                    self.on_change(self.state.status, output)
                except Exception:  # a broken callback must not kill the checker
                    log.exception("healthcheck on_change callback failed")

    def _probe(self) -> tuple[bool, str]:
        with tempfile.TemporaryFile() as out:
            try:
                with self._lock:
                    if self._stop.is_set():
                        return False, ""
                    self._proc = proc = subprocess.Popen(
                        self.spec.argv(), env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as e:
                self.last_exit_code = None
                return False, f"health check failed to start: {e}"
            try:
                rc = proc.wait(self.spec.timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                _killpg(proc)
                rc, timed_out = proc.wait(), True
            finally:
                with self._lock:
                    self._proc = None
            self.last_exit_code = None if timed_out else rc
            out.seek(max(0, out.seek(0, os.SEEK_END) - OUTPUT_LIMIT))
            text = out.read().decode("utf-8", "replace")
        if timed_out:
            text += f"\nhealth check timed out after {self.spec.timeout}s"
        return (not timed_out and rc == 0), text


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # probe leads its own session/group
    except (ProcessLookupError, PermissionError):
        pass


def task_health(containers: list[tuple[bool, bool, str]]) -> str:
    """ECS task healthStatus from (essential, has_check, status) per container."""
    statuses = [s for essential, has_check, s in containers if essential and has_check]
    if not statuses:
        return UNKNOWN
    if UNHEALTHY in statuses:
        return UNHEALTHY
    if all(s == HEALTHY for s in statuses):
        return HEALTHY
    return UNKNOWN
