"""The action log's rules that need no server: which stops are expected (and so not recorded),
and how a `since` time is read by the server and by `shoal actions list --since`."""

import pytest

from shoal.cli.actions import since_epoch
from shoal.events.action_log import EXPECTED_STOP_CODES, is_expected_stop, parse_time


def test_only_user_initiated_stops_are_expected():
    assert EXPECTED_STOP_CODES == {"UserInitiated"}
    assert is_expected_stop({"stopCode": "UserInitiated", "statusReason": "Task stopped by user"})
    for code in ("EssentialContainerExited", "TaskFailedToStart", "ServiceSchedulerInitiated",
                 "SpotInterruption", "TerminationNotice"):
        assert not is_expected_stop({"stopCode": code})
    assert not is_expected_stop({"statusReason": "no stop code at all"})


@pytest.mark.parametrize("value, epoch", [
    ("1750000000.25", 1750000000.25),
    ("2025-06-15T15:06:40.250Z", 1750000000.25),
    ("2025-06-15T17:06:40.250+02:00", 1750000000.25),
    ("2025-06-15T15:06:40.250", 1750000000.25),  # no offset: UTC, not the local zone
    ("2025-06-15 15:06:40", 1750000000.0),
])
def test_server_and_cli_read_absolute_times_alike(value, epoch):
    assert parse_time(value) == since_epoch(value) == epoch


@pytest.mark.parametrize("value", ["yesterday", "nan", "inf", "", "10 minutes"])
def test_what_is_not_a_time_is_refused(value):
    with pytest.raises(ValueError):
        parse_time(value)
    with pytest.raises(ValueError):
        since_epoch(value)


def test_the_cli_reads_durations_back_from_now():
    now = 1_750_000_000.0
    assert [since_epoch(v, now=now) for v in ("90s", "10m", "1.5h", "2d")] == \
        [now - 90, now - 600, now - 5400, now - 172800]
