"""Bad input to the EventBridge API: an error naming the field, and nothing written."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from tests.support import ServerProcess


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    server = ServerProcess(tmp_path_factory.mktemp("events-api")).start()
    yield server.client("events")
    server.stop()


@pytest.mark.parametrize("target, field", [
    ({"Id": "t", "Arn": "webhook+http://127.0.0.1:9/x", "DeadLetterConfig": {"Arn": "file:/tmp/dlq.jsonl"}},
     "Targets[0].DeadLetterConfig.Arn"),
    ({"Id": "t", "Arn": "https://example.com/hook"}, "Targets[0].Arn"),
    ({"Id": "t", "Arn": "file:relative.jsonl"}, "Targets[0].Arn"),
    ({"Id": "t", "Arn": "queue:q", "Input": "{", }, "Targets[0].Input"),
])
def test_a_bad_target_is_refused_whole(events, target, field):
    events.put_rule(Name="r", EventPattern='{"source": ["custom.app"]}')
    good = {"Id": "ok", "Arn": "queue:fine"}
    with pytest.raises(ClientError) as raised:
        events.put_targets(Rule="r", Targets=[target, good])
    assert raised.value.response["Error"]["Code"] == "ValidationException"
    assert field in raised.value.response["Error"]["Message"]
    assert events.list_targets_by_rule(Rule="r")["Targets"] == [], "nothing of the request was written"


def test_an_invalid_pattern_names_the_reason_and_writes_no_rule(events):
    with pytest.raises(events.exceptions.InvalidEventPatternException) as raised:
        events.put_rule(Name="bad", EventPattern='{"source": "not-a-list"}')
    assert "Event pattern is not valid" in raised.value.response["Error"]["Message"]
    assert "bad" not in [r["Name"] for r in events.list_rules()["Rules"]]
    with pytest.raises(events.exceptions.ResourceNotFoundException):
        events.describe_rule(Name="bad")
