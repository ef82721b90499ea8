"""How long a simulated task takes to start, how long it runs, and how it ends.

The model replaces the process runtime of a real host. Every task's outcome is drawn from a
random generator seeded with the model's seed and the task's ARN, so a task's fate does not
depend on the order in which tasks reach their hosts: the same seed and the same task ARN give
the same start delay, run time and exit code on every run.

A task definition can override the model for its own tasks through the environment of its
first essential container (RunTask's containerOverrides included):

  SHOAL_SIM_RUN_TIME   seconds, or "forever" (runs until it is stopped)
  SHOAL_SIM_EXIT_CODE  the exit code it ends with when it ends on its own

so one fleet can run long-lived services next to short batch jobs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

DISTRIBUTIONS = ("fixed", "exponential", "uniform")
RUN_TIME_ENV, EXIT_CODE_ENV = "SHOAL_SIM_RUN_TIME", "SHOAL_SIM_EXIT_CODE"
FOREVER = ("forever", "inf", "infinity", "none", "")


@dataclass(frozen=True)
class Outcome:
    """One task's fate on a simulated host."""
    start_delay: float           # seconds from placement to RUNNING ("pull and start")
    run_time: float | None       # seconds from RUNNING to exit; None: runs until stopped
    exit_code: int               # of the essential container when it ends on its own
    fails_to_start: bool = False  # ends as TaskFailedToStart instead of reaching RUNNING


@dataclass(frozen=True)
class TaskModel:
    """Run times of simulated tasks.

    `run_time` is the mean run time in seconds (None: tasks run until stopped), drawn from
    `distribution`: "fixed" (exactly run_time), "exponential" (mean run_time) or "uniform"
    (between half and one and a half times run_time). `failure_rate` is the probability that a
    task ends with `failure_exit_code` instead of 0; `start_failure_rate` the probability that
    it never starts. A stopped task's containers exit with `stop_exit_code` (143: SIGTERM, as
    the process runtime reports a stopped container) `stop_delay` seconds after the stop.
    """
    run_time: float | None = None
    distribution: str = "fixed"
    start_delay: tuple[float, float] = (0.0, 0.2)
    failure_rate: float = 0.0
    failure_exit_code: int = 1
    start_failure_rate: float = 0.0
    stop_delay: float = 0.0
    stop_exit_code: int = 143
    seed: int = 0

    def __post_init__(self):
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution: expected one of {DISTRIBUTIONS}, got {self.distribution!r}")
        if self.run_time is not None and self.run_time < 0:
            raise ValueError("run_time: expected seconds >= 0, or None (run until stopped)")
        lo, hi = self.start_delay
        if not 0 <= lo <= hi:
            raise ValueError("start_delay: expected (min, max) seconds with 0 <= min <= max")
        for name in ("failure_rate", "start_failure_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: expected a probability between 0 and 1")
        if self.stop_delay < 0:
            raise ValueError("stop_delay: expected seconds >= 0")

    def _run_time(self, rng: random.Random, mean: float | None) -> float | None:
        if mean is None:
            return None
        if self.distribution == "exponential":
            return rng.expovariate(1.0 / mean) if mean > 0 else 0.0
        if self.distribution == "uniform":
            return rng.uniform(0.5 * mean, 1.5 * mean)
        return mean

    def outcome(self, task_arn: str, environment: dict[str, str] | None = None) -> Outcome:
        """The fate of the task `task_arn`; `environment` is its essential container's."""
        rng = random.Random(f"{self.seed}/{task_arn}")  # str seeds hash with SHA-512: stable across runs
        # Draw every number whatever the overrides, so an override never shifts the others.
        delay = rng.uniform(*self.start_delay)
        run_time = self._run_time(rng, self.run_time)
        failed = rng.random() < self.failure_rate
        no_start = rng.random() < self.start_failure_rate
        exit_code = self.failure_exit_code if failed else 0
        env = environment or {}
        if RUN_TIME_ENV in env:
            run_time = _seconds(env[RUN_TIME_ENV])
        if EXIT_CODE_ENV in env:
            try:
                exit_code = int(env[EXIT_CODE_ENV])
            except ValueError:
                pass  # a task definition's typo is not the emulator's crash: keep the model's
        return Outcome(start_delay=delay, run_time=run_time, exit_code=exit_code, fails_to_start=no_start)


def _seconds(text: str) -> float | None:
    if text.strip().lower() in FOREVER:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
