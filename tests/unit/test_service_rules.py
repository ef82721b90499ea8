"""The pure rules of the service scheduler: configuration, rounding, the circuit breaker, and the
rolling-update plan, step by step."""

import pytest

from shoal.domain import services as s
from shoal.domain.errors import InvalidParameter

DEFAULTS = s.deployment_configuration(None)


def task(arn, deployment="new", healthy=True, wanted=True, **kw):
    return s.TaskView(arn=arn, deployment=deployment, wanted=wanted, healthy=healthy, **kw)


def config(low, high):
    return {"minimumHealthyPercent": low, "maximumPercent": high}


# --- configuration ---------------------------------------------------------------------------


def test_defaults_are_ecs_defaults():
    assert DEFAULTS == {"maximumPercent": 200, "minimumHealthyPercent": 100,
                        "deploymentCircuitBreaker": {"enable": False, "rollback": False}}


def test_update_keeps_what_it_does_not_name():
    current = s.deployment_configuration({"minimumHealthyPercent": 50, "deploymentCircuitBreaker":
                                          {"enable": True, "rollback": True}})
    merged = s.deployment_configuration({"maximumPercent": 150}, current)
    assert merged["minimumHealthyPercent"] == 50 and merged["maximumPercent"] == 150
    assert merged["deploymentCircuitBreaker"] == {"enable": True, "rollback": True}


@pytest.mark.parametrize("given, field", [
    ({"minimumHealthyPercent": 101}, "deploymentConfiguration.minimumHealthyPercent"),
    ({"minimumHealthyPercent": -1}, "deploymentConfiguration.minimumHealthyPercent"),
    ({"maximumPercent": 99}, "deploymentConfiguration.maximumPercent"),
    ({"strategy": "BLUE_GREEN"}, "deploymentConfiguration.strategy"),
    ({"alarms": {"alarmNames": ["a"], "enable": True, "rollback": False}}, "deploymentConfiguration.alarms.enable"),
    ({"lifecycleHooks": [{"hookTargetArn": "x"}]}, "deploymentConfiguration.lifecycleHooks"),
])
def test_bad_configuration_names_the_field(given, field):
    with pytest.raises(InvalidParameter, match=f"'{field}'"):
        s.deployment_configuration(given)


def test_desired_count_range():
    assert s.check_desired_count(0) == 0
    with pytest.raises(InvalidParameter, match="'desiredCount'"):
        s.check_desired_count(-1)
    with pytest.raises(InvalidParameter, match="'desiredCount'"):
        s.check_desired_count(s.MAX_DESIRED + 1)


@pytest.mark.parametrize("desired, low, high, expected", [
    (4, 50, 200, (2, 8)), (3, 50, 150, (2, 4)),  # min rounds up, max rounds down
    (1, 100, 150, (1, 1)), (5, 0, 100, (0, 5)), (0, 100, 200, (0, 0)),
])
def test_bounds_round_as_ecs_does(desired, low, high, expected):
    assert s.bounds(desired, config(low, high)) == expected


@pytest.mark.parametrize("desired, expected", [(1, 3), (2, 3), (6, 3), (7, 4), (10, 5), (399, 200), (1000, 200)])
def test_breaker_threshold_is_half_the_desired_count_clamped_to_3_and_200(desired, expected):
    assert s.breaker_threshold(desired) == expected


def test_breaker_threshold_configured():
    assert s.breaker_threshold(10, {"thresholdConfiguration": {"type": "COUNT", "value": 7}}) == 7
    assert s.breaker_threshold(10, {"thresholdConfiguration": {"type": "UNBOUNDED_PERCENT", "value": 10}}) == 1
    assert s.breaker_threshold(10, {"thresholdConfiguration": {"type": "BOUNDED_PERCENT", "value": 100}}) == 10


def test_backoff_starts_at_the_threshold_and_doubles_to_a_cap():
    assert [s.launch_backoff(n, 3) for n in (0, 2, 3, 4, 5)] == [0, 0, 1, 2, 4]
    assert s.launch_backoff(100, 3) == s.BACKOFF_MAX


def test_what_counts_as_a_failure():
    crash = {"lastStatus": "STOPPED", "stopCode": "EssentialContainerExited", "startedAt": 100.0, "stoppedAt": 100.2}
    assert s.is_failure(crash, has_health_check=False, steady_after=40)
    assert not s.is_failure({**crash, "stoppedAt": 150.0}, has_health_check=False, steady_after=40), \
        "a task that had run steadily for 40 s did not fail to start"
    assert s.is_failure({**crash, "stoppedAt": 150.0}, has_health_check=True, steady_after=40)
    assert s.is_failure({"lastStatus": "STOPPED", "stopCode": "TaskFailedToStart"}, False, 40)
    assert s.is_failure({"lastStatus": "STOPPED", "stopCode": "ServiceSchedulerInitiated",
                         "stoppedReason": s.HEALTH_CHECK_FAILED}, True, 40)
    for code in ("UserInitiated", "ServiceSchedulerInitiated", "TerminationNotice"):
        assert not s.is_failure({**crash, "stopCode": code}, False, 40)
    assert not s.is_failure({**crash, "lastStatus": "RUNNING"}, False, 40)


# --- the rolling update ----------------------------------------------------------------------


def test_a_new_service_starts_its_desired_count():
    assert s.plan(3, DEFAULTS, "new", []).start == 3


def test_rolling_update_min_100_max_200_starts_all_new_then_stops_the_old_once_new_are_healthy():
    old = [task(f"o{i}", "old") for i in range(2)]
    step = s.plan(2, DEFAULTS, "new", old)
    assert step.start == 2 and step.stop == [], "nothing old may stop before new tasks are healthy"
    pending = [task("n0", healthy=False), task("n1", healthy=False)]
    assert s.plan(2, DEFAULTS, "new", old + pending).stop == []
    step = s.plan(2, DEFAULTS, "new", old + [task("n0"), task("n1", healthy=False)])
    assert step.start == 0 and [a for a, _ in step.stop] == ["o0"], "one healthy new task lets one old one go"
    step = s.plan(2, DEFAULTS, "new", old + [task("n0"), task("n1")])
    assert sorted(a for a, _ in step.stop) == ["o0", "o1"]


def test_rolling_update_min_50_max_100_stops_first_then_starts():
    old = [task(f"o{i}", "old", created_at=i) for i in range(4)]
    step = s.plan(4, config(50, 100), "new", old)
    assert step.start == 0 and [a for a, _ in step.stop] == ["o0", "o1"], "within max, 2 may go: min is 2"
    stopping = [task("o0", "old", healthy=False, wanted=False), task("o1", "old", healthy=False, wanted=False)]
    assert s.plan(4, config(50, 100), "new", stopping + old[2:]).start == 0, "stopping tasks count against max"
    assert s.plan(4, config(50, 100), "new", old[2:]).start == 2


def test_max_percent_caps_every_task_that_has_not_stopped():
    old = [task(f"o{i}", "old") for i in range(3)]
    assert s.plan(3, config(100, 134), "new", old).start == 1  # floor(3 × 1.34) = 4


def test_unhealthy_old_or_pending_tasks_go_first_and_cost_nothing():
    tasks = [task("o0", "old"), task("o1", "old", healthy=False), task("n0", healthy=True)]
    step = s.plan(2, DEFAULTS, "new", tasks)
    assert [a for a, _ in step.stop][0] == "o1"


def test_tasks_that_fail_health_checks_are_replaced():
    tasks = [task("n0", unhealthy=True, healthy=False), task("n1")]
    step = s.plan(2, DEFAULTS, "new", tasks)
    assert step.stop == [("n0", s.HEALTH_CHECK_FAILED)] and step.start == 1


def test_draining_host_task_is_replaced_first_then_stopped():
    tasks = [task("a", draining=True), task("b")]
    step = s.plan(2, DEFAULTS, "new", tasks)
    assert step.start == 1 and step.stop == [], "min 100%: the drained task runs until its replacement is healthy"
    step = s.plan(2, DEFAULTS, "new", tasks + [task("c", healthy=False)])
    assert step.start == 0 and step.stop == []
    step = s.plan(2, DEFAULTS, "new", tasks + [task("c")])
    assert step.stop == [("a", s.DRAINED)]


def test_draining_with_max_100_and_min_100_never_moves():
    tasks = [task("a", draining=True), task("b")]
    step = s.plan(2, config(100, 100), "new", tasks)
    assert step.start == 0 and step.stop == []


def test_scaling_in_stops_the_surplus_pending_first_then_newest():
    tasks = [task("a", created_at=1), task("b", created_at=2), task("c", healthy=False, created_at=0)]
    step = s.plan(1, DEFAULTS, "new", tasks)
    assert [a for a, _ in step.stop] == ["c", "b"]


def test_a_failed_deployment_starts_nothing_and_keeps_the_old_tasks():
    tasks = [task("o0", "old"), task("o1", "old")]
    step = s.plan(2, DEFAULTS, "new", tasks, may_start=False, scale_down_old=False)
    assert step.start == 0 and step.stop == []


def test_deleting_stops_everything():
    step = s.plan(0, DEFAULTS, "new", [task("a"), task("b", "old")])
    assert sorted(a for a, _ in step.stop) == ["a", "b"] and step.start == 0


def test_complete_and_steady():
    assert s.complete(0, "new", [])
    assert not s.complete(2, "new", [task("n0"), task("n1", healthy=False)])
    assert not s.complete(2, "new", [task("n0"), task("n1"), task("o0", "old", wanted=False, healthy=False)])
    assert s.complete(2, "new", [task("n0"), task("n1")])
    assert s.steady(2, "new", [task("n0"), task("n1")])
    assert not s.steady(2, "new", [task("n0"), task("n1"), task("x", wanted=False, healthy=False)])


def test_capacity_provider_base_then_weight():
    strategy = [{"capacityProvider": "a", "base": 2, "weight": 1}, {"capacityProvider": "b", "weight": 3}]
    counts: dict[str, int] = {}
    picks = []
    for _ in range(10):
        p = s.next_provider(strategy, counts)
        counts[p] = counts.get(p, 0) + 1
        picks.append(p)
    assert picks[:2] == ["a", "a"], "the base first"
    assert counts == {"a": 4, "b": 6}, "then 1:3 beyond the base"
