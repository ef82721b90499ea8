"""The conformance cases again, end to end: through boto3's `events.test_event_pattern` against
a real server, as a user's existing patterns would arrive. Match cases give Result true, `_NEG`
cases false, `_EXC` cases InvalidEventPatternException (with AWS's message where recorded)."""

from __future__ import annotations

import json

import pytest

from tests.conformance.cases import load_cases
from tests.support import ServerProcess

CASES = load_cases()
# The array-consistency events are bare objects; TestEventPattern takes whole events.
ENVELOPE = {"id": "1", "source": "conformance", "detail-type": "case", "account": "123456789012",
            "region": "us-east-1", "time": "2024-01-01T00:00:00Z", "resources": []}


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    server = ServerProcess(tmp_path_factory.mktemp("conformance")).start()
    yield server.client("events")
    server.stop()


@pytest.mark.parametrize("case", CASES, ids=[f"{c.suite}:{c.name}" for c in CASES])
def test_case_through_the_api(events, case):
    event = case.event if case.suite == "localstack" else {**ENVELOPE, **case.event}
    if case.expected == "invalid":
        with pytest.raises(events.exceptions.InvalidEventPatternException) as raised:
            events.test_event_pattern(EventPattern=case.pattern_text, Event=json.dumps(event))
        if case.message:
            assert raised.value.response["Error"]["Message"].splitlines()[0] == case.message
        return
    result = events.test_event_pattern(EventPattern=case.pattern_text, Event=json.dumps(event))["Result"]
    assert result is (case.expected == "match")
