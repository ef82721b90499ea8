import threading
import time

import pytest

from shoal.agent.health import (
    HEALTHY, UNHEALTHY, UNKNOWN, HealthChecker, HealthCheckSpec, HealthState, task_health,
)


def spec(cmd="exit 0", **kw):
    kw = {"interval": 0.2, "timeout": 1.0, "retries": 2, "start_period": 0, **kw}
    return HealthCheckSpec(["CMD-SHELL", cmd], **kw)


class Recorder:
    def __init__(self):
        self.calls = []
        self.cond = threading.Condition()

    def __call__(self, status, output):
        with self.cond:
            self.calls.append((status, output))
            self.cond.notify_all()

    def wait_for(self, n, timeout=5.0):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= n, timeout), self.calls
        return [s for s, _ in self.calls]


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# ---------------------------------------------------------------- state machine

def test_state_first_probe_after_interval_and_reschedule():
    st = HealthState(HealthCheckSpec(["CMD", "true"], interval=30), started_at=100.0)
    assert st.status == UNKNOWN and st.next_probe_at() == 130.0
    st.record(True, 131.0)
    assert st.next_probe_at() == 161.0


def test_state_start_period_success_is_healthy_immediately():
    st = HealthState(HealthCheckSpec(["CMD", "x"], interval=5, start_period=60), 0.0)
    assert st.record(True, 5.0) is True and st.status == HEALTHY


def test_state_start_period_failures_ignored():
    st = HealthState(HealthCheckSpec(["CMD", "x"], interval=5, retries=1, start_period=60), 0.0)
    for t in (5, 10, 15, 55):
        assert st.record(False, t) is False
    assert st.status == UNKNOWN and st.failing_streak == 0
    assert st.record(False, 61) is True and st.status == UNHEALTHY


def test_state_start_period_uses_probe_start_time():
    st = HealthState(HealthCheckSpec(["CMD", "x"], retries=1, start_period=10), 0.0)
    assert st.record(False, 12.0, probe_started=9.0) is False and st.status == UNKNOWN


def test_state_retries_then_recovery():
    st = HealthState(HealthCheckSpec(["CMD", "x"], retries=3), 0.0)
    assert [st.record(False, t) for t in (1, 2)] == [False, False]
    assert st.record(True, 3) is True and st.status == HEALTHY and st.failing_streak == 0
    assert [st.record(False, t) for t in (4, 5, 6)] == [False, False, True]
    assert st.status == UNHEALTHY
    assert st.record(False, 7) is False
    assert st.record(True, 8) is True and st.status == HEALTHY


def test_state_grace_ends_after_first_success():
    st = HealthState(HealthCheckSpec(["CMD", "x"], retries=1, start_period=100), 0.0)
    st.record(True, 1)
    assert st.record(False, 2) is True and st.status == UNHEALTHY


# ---------------------------------------------------------------- spec

def test_from_ecs_defaults_and_argv():
    s = HealthCheckSpec.from_ecs({"command": ["CMD-SHELL", "curl -f localhost || exit 1"]})
    assert (s.interval, s.timeout, s.retries, s.start_period) == (30, 5, 3, 0)
    assert s.argv() == ["/bin/sh", "-c", "curl -f localhost || exit 1"]
    s = HealthCheckSpec.from_ecs({"command": ["CMD", "/bin/check", "-v"], "interval": 10,
                                  "timeout": 2, "retries": 10, "startPeriod": 300})
    assert s.argv() == ["/bin/check", "-v"] and s.start_period == 300


@pytest.mark.parametrize("d,field", [
    ({"command": ["NONE"]}, "command"),
    ({"command": "exit 0"}, "command"),
    ({"command": ["CMD"]}, "command"),
    ({"command": ["CMD-SHELL", ""]}, "command"),
    ({"command": ["CMD", "x"], "interval": 4}, "interval"),
    ({"command": ["CMD", "x"], "interval": 301}, "interval"),
    ({"command": ["CMD", "x"], "timeout": 1}, "timeout"),
    ({"command": ["CMD", "x"], "timeout": 61}, "timeout"),
    ({"command": ["CMD", "x"], "retries": 0}, "retries"),
    ({"command": ["CMD", "x"], "retries": 11}, "retries"),
    ({"command": ["CMD", "x"], "retries": True}, "retries"),
    ({"command": ["CMD", "x"], "startPeriod": -1}, "startPeriod"),
    ({"command": ["CMD", "x"], "startPeriod": 301}, "startPeriod"),
    ({"command": ["CMD", "x"], "interval": "30"}, "interval"),
])
def test_from_ecs_validation_names_field(d, field):
    with pytest.raises(ValueError, match=field):
        HealthCheckSpec.from_ecs(d)


# ---------------------------------------------------------------- checker (real processes)

def test_cmd_shell_exit0_becomes_healthy():
    rec = Recorder()
    hc = HealthChecker(spec("echo hello; exit 0"), {}, None, rec)
    t0 = time.monotonic()
    hc.start()
    try:
        assert rec.wait_for(1) == [HEALTHY]
        assert time.monotonic() - t0 >= 0.2  # first probe waits one interval
        assert rec.calls[0][1].strip() == "hello" and hc.last_output.strip() == "hello"
        assert hc.status == HEALTHY and hc.last_exit_code == 0
    finally:
        hc.stop()


def test_cmd_exec_form_gets_env_and_cwd(tmp_path):
    rec = Recorder()
    s = HealthCheckSpec(["CMD", "/bin/sh", "-c", 'test "$FOO" = bar && test "$(pwd)" = "$1"', "sh",
                         str(tmp_path)], interval=0.1, timeout=1, retries=1)
    hc = HealthChecker(s, {"FOO": "bar"}, str(tmp_path), rec)
    hc.start()
    try:
        assert rec.wait_for(1) == [HEALTHY]
    finally:
        hc.stop()


def test_output_truncated_to_last_kib():
    rec = Recorder()
    hc = HealthChecker(spec("head -c 5000 /dev/zero | tr '\\0' a; echo END; exit 3", retries=1),
                       {}, None, rec)
    hc.start()
    try:
        assert rec.wait_for(1) == [UNHEALTHY]
        assert len(hc.last_output.encode()) == 1024 and hc.last_output.endswith("END\n")
        assert hc.last_exit_code == 3
    finally:
        hc.stop()


def test_missing_executable_is_failure():
    rec = Recorder()
    hc = HealthChecker(HealthCheckSpec(["CMD", "/nonexistent/probe"], interval=0.1, retries=1),
                       {}, None, rec)
    hc.start()
    try:
        assert rec.wait_for(1) == [UNHEALTHY]
        assert "failed to start" in hc.last_output
    finally:
        hc.stop()


def test_timeout_counts_as_failure_and_kills_probe_group(tmp_path):
    pidfile = tmp_path / "pids"
    rec = Recorder()
    cmd = f"sleep 30 & echo $$ $! > {pidfile}; wait"
    hc = HealthChecker(spec(cmd, timeout=0.3, retries=1, interval=0.1), {}, None, rec)
    t0 = time.monotonic()
    hc.start()
    try:
        assert rec.wait_for(1) == [UNHEALTHY]
        assert time.monotonic() - t0 < 3
        assert "timed out" in rec.calls[0][1] and hc.last_exit_code is None
    finally:
        hc.stop()
    pids = [int(p) for p in pidfile.read_text().split()]
    deadline = time.monotonic() + 2
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(_gone(p) for p in pids), pids


def test_pass_then_fail_via_flag_file(tmp_path):
    flag = tmp_path / "ok"
    flag.touch()
    rec = Recorder()
    hc = HealthChecker(spec(f"test -f {flag}", retries=2, interval=0.1), {}, None, rec)
    hc.start()
    try:
        assert rec.wait_for(1) == [HEALTHY]
        time.sleep(0.3)  # stays healthy: no further callbacks
        assert len(rec.calls) == 1
        flag.unlink()
        assert rec.wait_for(2) == [HEALTHY, UNHEALTHY]
        time.sleep(0.4)
        assert len(rec.calls) == 2
    finally:
        hc.stop()
    assert hc.status == UNHEALTHY


def test_stop_is_prompt_with_long_interval():
    hc = HealthChecker(spec(interval=30), {}, None, Recorder())
    hc.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    hc.stop()
    assert time.monotonic() - t0 < 0.5
    assert not hc._thread.is_alive()


def test_stop_during_running_probe_is_prompt():
    rec = Recorder()
    hc = HealthChecker(spec("sleep 30", interval=0.05, timeout=30), {}, None, rec)
    hc.start()
    time.sleep(0.3)  # probe is now running
    t0 = time.monotonic()
    hc.stop()
    assert time.monotonic() - t0 < 0.5 and not hc._thread.is_alive()
    assert rec.calls == []


# ---------------------------------------------------------------- task health

@pytest.mark.parametrize("containers,expected", [
    ([], UNKNOWN),
    ([(True, False, UNKNOWN), (False, True, HEALTHY)], UNKNOWN),
    ([(True, True, HEALTHY)], HEALTHY),
    ([(True, True, HEALTHY), (True, False, UNKNOWN)], HEALTHY),
    ([(True, True, HEALTHY), (True, True, UNKNOWN)], UNKNOWN),
    ([(True, True, UNKNOWN), (True, True, UNHEALTHY)], UNHEALTHY),
    ([(True, True, HEALTHY), (False, True, UNHEALTHY)], HEALTHY),
    ([(False, True, UNHEALTHY)], UNKNOWN),
])
def test_task_health(containers, expected):
    assert task_health(containers) == expected
