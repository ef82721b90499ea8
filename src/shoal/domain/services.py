"""Services: the pure rules of the REPLICA service scheduler.

Validation and defaults of a service's deployment configuration, the rolling-update arithmetic
(maximumPercent rounds down, minimumHealthyPercent rounds up), the circuit breaker's threshold
and what counts as a failure, and `plan`: given the tasks a service has, how many to start and
which to stop. No store, no HTTP: the scheduler (shoal.control.services) observes, calls these,
and acts.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from shoal.domain.errors import InvalidParameter

DEFAULT_MIN_HEALTHY = 100
DEFAULT_MAX_PERCENT = 200
MAX_DESIRED = 5000  # ECS's quota of tasks per service
# ECS's default: spread over zones, then over hosts.
DEFAULT_PLACEMENT_STRATEGY = [{"type": "spread", "field": "attribute:ecs.availability-zone"},
                              {"type": "spread", "field": "instanceId"}]
# A task stopped on its own (not by the scheduler, a user or its host's end).
FAILURE_STOP_CODES = ("EssentialContainerExited", "TaskFailedToStart")
HEALTH_CHECK_FAILED = "Task failed container health checks"
BACKOFF_BASE, BACKOFF_MAX = 1.0, 300.0  # seconds between launches once a deployment keeps failing


def deployment_id() -> str:
    return f"ecs-svc/{random.randrange(10 ** 18, 10 ** 19)}"


# --- configuration ---------------------------------------------------------------------------


def _percent(value, field_: str, low: int, high: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise InvalidParameter(f"Invalid parameter '{field_}': must be {bound}, got {value!r}.")
    return value


def deployment_configuration(given: dict | None, current: dict | None = None) -> dict:
    """The DeploymentConfiguration a service runs with: `given` over `current` (UpdateService
    keeps what it does not name) over ECS's defaults. Raises for what shoal cannot honour."""
    given = given or {}
    out = dict(current or {"maximumPercent": DEFAULT_MAX_PERCENT, "minimumHealthyPercent": DEFAULT_MIN_HEALTHY,
                           "deploymentCircuitBreaker": {"enable": False, "rollback": False}})
    prefix = "deploymentConfiguration"
    if "minimumHealthyPercent" in given:
        out["minimumHealthyPercent"] = _percent(given["minimumHealthyPercent"], f"{prefix}.minimumHealthyPercent",
                                                0, 100)
    if "maximumPercent" in given:
        # Below 100 the service could not even run its desired count.
        out["maximumPercent"] = _percent(given["maximumPercent"], f"{prefix}.maximumPercent", 100, None)
    strategy = given.get("strategy")
    if strategy not in (None, "ROLLING"):
        raise InvalidParameter(f"Invalid parameter '{prefix}.strategy': shoal runs ROLLING deployments, not "
                               f"{strategy}.")
    if strategy:
        out["strategy"] = strategy
    for key in ("lifecycleHooks", "linearConfiguration", "canaryConfiguration"):
        if given.get(key):
            raise InvalidParameter(f"Invalid parameter '{prefix}.{key}': only ROLLING deployments are supported, "
                                   "which take none.")
    alarms = given.get("alarms")
    if alarms is not None:
        if alarms.get("enable"):
            raise InvalidParameter(f"Invalid parameter '{prefix}.alarms.enable': shoal has no CloudWatch alarms "
                                   "to watch; use the deployment circuit breaker.")
        out["alarms"] = alarms
    if given.get("bakeTimeInMinutes") is not None:
        out["bakeTimeInMinutes"] = _percent(given["bakeTimeInMinutes"], f"{prefix}.bakeTimeInMinutes", 0, 1440)
    breaker = given.get("deploymentCircuitBreaker")
    if breaker is not None:
        threshold = breaker.get("thresholdConfiguration")
        if threshold is not None:
            kind = threshold.get("type", "BOUNDED_PERCENT")
            _percent(threshold.get("value", 50), f"{prefix}.deploymentCircuitBreaker.thresholdConfiguration.value",
                     1 if kind == "COUNT" else 0, None)
        out["deploymentCircuitBreaker"] = {k: breaker[k] for k in
                                           ("enable", "rollback", "resetOnHealthyTask", "thresholdConfiguration")
                                           if k in breaker}
    return out


def check_desired_count(value, field_: str = "desiredCount") -> int:
    return _percent(value, field_, 0, MAX_DESIRED)


def bounds(desired: int, config: dict) -> tuple[int, int]:
    """(fewest healthy tasks, most tasks) while a service replaces tasks: minimumHealthyPercent
    of desired rounded up, maximumPercent of desired rounded down."""
    low = math.ceil(desired * config.get("minimumHealthyPercent", DEFAULT_MIN_HEALTHY) / 100)
    high = desired * config.get("maximumPercent", DEFAULT_MAX_PERCENT) // 100
    return low, high


def breaker_threshold(desired: int, breaker: dict | None = None) -> int:
    """Failures that fail a deployment. Default BOUNDED_PERCENT 50: clamp(ceil(0.5 × desired), 3, 200)."""
    threshold = (breaker or {}).get("thresholdConfiguration") or {}
    kind, value = threshold.get("type", "BOUNDED_PERCENT"), threshold.get("value", 50)
    if kind == "COUNT":
        return max(value, 1)
    count = math.ceil(value * desired / 100)
    return min(max(count, 3), 200) if kind == "BOUNDED_PERCENT" else max(count, 1)


def launch_backoff(failures: int, threshold: int) -> float:
    """Seconds to wait before the next launch of a deployment that keeps failing with no circuit
    breaker to stop it: nothing before the threshold, then doubling up to BACKOFF_MAX."""
    over = failures - threshold
    return 0.0 if over < 0 else min(BACKOFF_BASE * 2 ** over, BACKOFF_MAX)


def is_failure(task: dict, has_health_check: bool, steady_after: float) -> bool:
    """Whether a STOPPED task counts against its deployment's circuit breaker: it stopped on its
    own (an essential container exited, it could not start) or failed its health checks, before
    it was ever steady. A task without health checks that had run `steady_after` seconds was."""
    if task.get("lastStatus") != "STOPPED":
        return False
    own = task.get("stopCode") in FAILURE_STOP_CODES
    if not own and not (task.get("stoppedReason") or "").startswith(HEALTH_CHECK_FAILED):
        return False
    started, stopped = task.get("startedAt"), task.get("stoppedAt")
    if not has_health_check and started is not None and stopped is not None and stopped - started >= steady_after:
        return False
    return True


# --- the rolling update ----------------------------------------------------------------------


@dataclass(frozen=True)
class TaskView:
    """What the scheduler needs to know of one task of the service that has not STOPPED."""

    arn: str
    deployment: str  # its startedBy: the deployment that launched it
    wanted: bool  # desiredStatus RUNNING (False: being stopped already)
    healthy: bool  # RUNNING, steady, and HEALTHY if it has health checks: counts for minimumHealthyPercent
    unhealthy: bool = False  # failed its health checks (after the grace period): replace it
    draining: bool = False  # on a DRAINING host: replace it, then stop it
    created_at: float = 0.0


@dataclass
class Plan:
    start: int = 0
    stop: list[tuple[str, str]] = field(default_factory=list)  # (task ARN, reason)


SCALE_DOWN = "Service scheduler stopped the task"
REPLACED = "Task replaced by a newer deployment"
DRAINED = "Task stopped during instance draining"


def plan(desired: int, config: dict, primary: str, tasks: list[TaskView], *, may_start: bool = True,
         scale_down_old: bool = True) -> Plan:
    """One step of a rolling update (idempotent: the same tasks give the same plan).

    Start what the primary deployment lacks, within maximumPercent of desired counting every task
    that has not stopped; stop what is not wanted (older deployments' tasks, tasks on DRAINING
    hosts, the primary's surplus, unhealthy tasks), never taking the healthy count below
    minimumHealthyPercent of desired. Tasks that are not healthy are stopped first: that costs
    nothing. `may_start` False holds launches (a failed deployment, a backoff);
    `scale_down_old` False keeps older deployments' tasks (a failed deployment without rollback
    leaves the service on what still runs)."""
    fewest, most = bounds(desired, config)
    out = Plan()
    wanted = [t for t in tasks if t.wanted]
    for t in wanted:
        if t.unhealthy:
            out.stop.append((t.arn, HEALTH_CHECK_FAILED))
    keep = [t for t in wanted if not t.unhealthy]
    primary_tasks = [t for t in keep if t.deployment == primary and not t.draining]
    if may_start:
        out.start = max(0, min(desired - len(primary_tasks), most - len(tasks)))
    # What is not wanted, in the order it goes: older deployments, drained hosts, the surplus.
    surplus = sorted(primary_tasks, key=lambda t: (t.healthy, -t.created_at))[:max(len(primary_tasks) - desired, 0)]
    old = [t for t in keep if t.deployment != primary and not t.draining] if scale_down_old else []
    unwanted = [(t, REPLACED) for t in sorted(old, key=lambda t: t.created_at)]
    unwanted += [(t, DRAINED) for t in keep if t.draining]
    unwanted += [(t, SCALE_DOWN) for t in surplus]
    budget = sum(t.healthy for t in keep) - fewest
    for t, why in [u for u in unwanted if not u[0].healthy] + [u for u in unwanted if u[0].healthy]:
        if t.healthy:
            if budget <= 0:
                continue
            budget -= 1
        out.stop.append((t.arn, why))
    return out


def complete(desired: int, primary: str, tasks: list[TaskView]) -> bool:
    """A deployment is done when its desired tasks are all healthy and no other deployment has a
    task left that has not stopped."""
    mine = [t for t in tasks if t.deployment == primary and t.wanted and not t.draining]
    return (len(mine) == desired and all(t.healthy for t in mine)
            and not any(t.deployment != primary for t in tasks))


def steady(desired: int, primary: str, tasks: list[TaskView]) -> bool:
    """Steady state: exactly the desired tasks, all healthy, all the primary's, nothing stopping."""
    return len(tasks) == desired and all(t.wanted and t.healthy and not t.draining and t.deployment == primary
                                         for t in tasks)


def next_provider(strategy: list[dict], counts: dict[str, int]) -> str | None:
    """The capacity provider of the next task, by base then weight (ECS): the provider with a base
    gets tasks until it has that many; after that tasks go where count/weight is lowest."""
    for item in strategy:
        if item.get("base", 0) > counts.get(item["capacityProvider"], 0):
            return item["capacityProvider"]
    weighted = [i for i in strategy if i.get("weight", 0) > 0]
    if not weighted:
        return strategy[0]["capacityProvider"] if strategy else None

    def load(item: dict) -> float:
        beyond = counts.get(item["capacityProvider"], 0) - item.get("base", 0)
        return (max(beyond, 0) + 1) / item["weight"]

    return min(weighted, key=load)["capacityProvider"]
