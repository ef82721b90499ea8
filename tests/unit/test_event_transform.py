"""Target input (Input, InputPath, InputTransformer) against the examples AWS documents
(eb-transform-target-input: the EC2 event and its template table) and the AWS-recorded results in
LocalStack's `test_events_inputs.snapshot.json` (missing paths, predefined variables, the
validation messages of PutTargets)."""

from __future__ import annotations

import json

import pytest

from shoal.events.transform import render, retry_limits, select, validate_target

# The example event of eb-transform-target-input.
EC2 = {
    "version": "0",
    "id": "7bf73129-1428-4cd3-a780-95db273d1602",
    "detail-type": "EC2 Instance State-change Notification",
    "source": "aws.ec2",
    "account": "123456789012",
    "time": "2015-11-11T21:29:54Z",
    "region": "us-east-1",
    "resources": ["arn:aws:ec2:us-east-1:123456789012:instance/i-abcd1111"],
    "detail": {"instance-id": "i-0123456789", "state": "RUNNING"},
}
EC2_PATHS = {"timestamp": "$.time", "instance": "$.detail.instance-id", "state": "$.detail.state"}

# The event of LocalStack's AWS-validated input tests.
CORE = {
    "version": "0", "id": "1c1d1a9e-7f59-4e2c-9d5b-8a4c1e3f2b10",
    "detail-type": "core.update-account-command", "source": "core.update-account-command",
    "account": "111111111111", "time": "2024-06-11T08:33:04Z", "region": "us-east-1",
    "resources": [],
    "detail": {"command": "update-account", "payload": {"acc_id": "0a787ecb-4015", "sf_id": "baz"}},
}
CORE_PATHS = {"detail-type": "$.detail-type", "timestamp": "$.time", "command": "$.detail.command"}
CORE_MISSING = {**CORE_PATHS, "command": "$.detail.notinmessage"}

RULE = {"rule_name": "example", "rule_arn": "arn:shoal:events:local:000000000000:rule/example"}


def transformer(template: str, paths: dict | None = None) -> dict:
    tr = {"InputTemplate": template}
    if paths is not None:
        tr["InputPathsMap"] = paths
    return {"Id": "t1", "Arn": "queue:q", "InputTransformer": tr}


# (name, event, target, expected bytes)
TEXT_CASES = [
    # AWS table: "Simple string"
    ("simple string", EC2, transformer('"instance <instance> is in <state>"', EC2_PATHS),
     '"instance i-0123456789 is in RUNNING"'),
    # AWS table: "String with escaped quotes" (console behaviour)
    ("string with escaped quotes", EC2,
     transformer(r'"instance \"<instance>\" is in <state>"', EC2_PATHS),
     r'"instance \"i-0123456789\" is in RUNNING"'),
    # AWS table: "Including reserved variables in a string"
    ("reserved variable in a string", EC2, transformer('"<aws.events.rule-name> triggered"'),
     '"example triggered"'),
    # API reference: a template that is not JSON at all is plain text
    ("plain text template", EC2, transformer("<instance> is in state <state>", EC2_PATHS),
     "i-0123456789 is in state RUNNING"),
    # LocalStack AWS snapshot: string template, all paths present / one missing
    ("string, all present", CORE,
     transformer('"Event of <detail-type> type, at time <timestamp>, info extracted from detail '
                 '<command>"', CORE_PATHS),
     '"Event of core.update-account-command type, at time 2024-06-11T08:33:04Z, info extracted '
     'from detail update-account"'),
    ("string, missing path is empty", CORE,
     transformer('"Event of <detail-type> type, at time <timestamp>, info extracted from detail '
                 '<command>"', CORE_MISSING),
     '"Event of core.update-account-command type, at time 2024-06-11T08:33:04Z, info extracted '
     'from detail "'),
    ("string with special starting characters", CORE,
     transformer('"{[/Check with special starting characters for event of <detail-type> type"',
                 CORE_PATHS),
     '"{[/Check with special starting characters for event of core.update-account-command type"'),
    # LocalStack AWS snapshot: predefined variables in a string
    ("predefined variables in a string", CORE,
     transformer('"Message containing all pre defined variables <aws.events.rule-arn> '
                 '<aws.events.rule-name> <aws.events.event.ingestion-time>"'),
     '"Message containing all pre defined variables '
     'arn:shoal:events:local:000000000000:rule/example example 2024-06-11T08:33:04Z"'),
    # Input: the constant text, byte for byte (whitespace included)
    ("Input constant", EC2, {"Id": "t", "Arn": "queue:q", "Input": '{ "fixed": [1, 2] }'},
     '{ "fixed": [1, 2] }'),
    # InputPath selecting a string gives a JSON string (AWS snapshot: "\"baz\"")
    ("InputPath to a string", CORE, {"Id": "t", "Arn": "queue:q",
                                      "InputPath": "$.detail.payload.sf_id"}, '"baz"'),
    ("InputPath with an index", EC2, {"Id": "t", "Arn": "queue:q", "InputPath": "$.resources[0]"},
     '"arn:aws:ec2:us-east-1:123456789012:instance/i-abcd1111"'),
    ("InputPath in bracket notation", EC2,
     {"Id": "t", "Arn": "queue:q", "InputPath": "$['detail']['instance-id']"}, '"i-0123456789"'),
    ("InputPath that selects nothing", EC2,
     {"Id": "t", "Arn": "queue:q", "InputPath": "$.detail.nope"}, "null"),
    ("InputPath with a wildcard", EC2, {"Id": "t", "Arn": "queue:q", "InputPath": "$.detail.*"},
     '["i-0123456789","RUNNING"]'),
]


@pytest.mark.parametrize("event,target,expected", [c[1:] for c in TEXT_CASES],
                         ids=[c[0] for c in TEXT_CASES])
def test_rendered_text(event, target, expected):
    validate_target(target)
    assert render(event, target, **RULE) == expected.encode()


# (name, event, target, expected JSON value): JSON templates, compared as values, and checked to
# be minified.
JSON_CASES = [
    # AWS table: "Simple JSON"
    ("simple JSON", EC2, transformer('{\n  "instance" : <instance>,\n  "state": <state>\n}',
                                     EC2_PATHS),
     {"instance": "i-0123456789", "state": "RUNNING"}),
    # AWS table: "JSON with strings and variables"
    ("JSON with strings and variables", EC2,
     transformer('{\n "instance" : <instance>,\n "state": "<state>",\n "instanceStatus": '
                 '"instance \\"<instance>\\" is in <state>"\n}', EC2_PATHS),
     {"instance": "i-0123456789", "state": "RUNNING",
      "instanceStatus": 'instance "i-0123456789" is in RUNNING'}),
    # AWS table: "JSON with a mix of variables and static information"
    ("JSON mixed with static values", EC2,
     transformer('{\n  "instance" : <instance>,\n  "state": [ 9, <state>, true ],\n  '
                 '"Transformed" : "Yes"\n}', EC2_PATHS),
     {"instance": "i-0123456789", "state": [9, "RUNNING", True], "Transformed": "Yes"}),
    # AWS table: "Including reserved variables in JSON"; aws.events.event as AWS records it
    ("reserved variables in JSON", EC2,
     transformer('{"instance": <instance>, "state": <state>, "ruleArn": <aws.events.rule-arn>, '
                 '"ruleName": <aws.events.rule-name>, "originalEvent": <aws.events.event>}',
                 EC2_PATHS),
     {"instance": "i-0123456789", "state": "RUNNING", "ruleArn": RULE["rule_arn"],
      "ruleName": "example",
      "originalEvent": {k if k != "detail-type" else "detailType": v for k, v in EC2.items()
                        if k != "detail"}}),
    # LocalStack AWS snapshot: JSON template, all present / one missing (missing gives "")
    ("JSON, all present", CORE,
     transformer('{"detailType": <detail-type>,  "time": <timestamp>, "command": <command>}',
                 CORE_PATHS),
     {"detailType": "core.update-account-command", "time": "2024-06-11T08:33:04Z",
      "command": "update-account"}),
    ("JSON, missing path gives an empty string", CORE,
     transformer('{"detailType": <detail-type>,  "time": <timestamp>, "command": <command>}',
                 CORE_MISSING),
     {"detailType": "core.update-account-command", "time": "2024-06-11T08:33:04Z",
      "command": ""}),
    ("JSON, missing path inside quotes", CORE,
     transformer('{"c": "cmd=<command>"}', CORE_MISSING), {"c": "cmd="}),
    # LocalStack AWS snapshot: the whole event through aws.events.event.json
    ("aws.events.event.json", CORE,
     transformer('{"originalEvent": <aws.events.event>, "originalEventJson": '
                 '<aws.events.event.json>}'),
     {"originalEvent": {k if k != "detail-type" else "detailType": v for k, v in CORE.items()
                        if k != "detail"},
      "originalEventJson": CORE}),
    # quoting rules for values that are not strings
    ("object and number outside quotes", CORE,
     transformer('{"p": <payload>, "n": <n>}', {"payload": "$.detail.payload", "n": "$.n"}),
     {"p": CORE["detail"]["payload"], "n": ""}),
    ("object inside quotes is its raw JSON text", {**CORE, "detail": {"n": 5, "ok": True}},
     transformer('{"s": "n=<n> ok=<ok>"}', {"n": "$.detail.n", "ok": "$.detail.ok"}),
     {"s": "n=5 ok=true"}),
    ("number outside quotes stays a number", {**CORE, "detail": {"n": 5, "x": None}},
     transformer('[<n>, <x>]', {"n": "$.detail.n", "x": "$.detail.x"}), [5, None]),
    ("ingestion time given by the caller", CORE,
     transformer('{"t": <aws.events.event.ingestion-time>}'), {"t": "2024-06-11T08:33:05.123Z"}),
    ("no Input at all: the whole event", EC2, {"Id": "t", "Arn": "queue:q"}, EC2),
    ("InputPath $", EC2, {"Id": "t", "Arn": "queue:q", "InputPath": "$"}, EC2),
    ("InputPath to an object", CORE, {"Id": "t", "Arn": "queue:q", "InputPath": "$.detail.payload"},
     {"acc_id": "0a787ecb-4015", "sf_id": "baz"}),
]


@pytest.mark.parametrize("event,target,expected", [c[1:] for c in JSON_CASES],
                         ids=[c[0] for c in JSON_CASES])
def test_rendered_json(event, target, expected):
    validate_target(target)
    kwargs = dict(RULE)
    if "ingestion" in json.dumps(target):
        kwargs["ingestion_time"] = "2024-06-11T08:33:05.123Z"
    out = render(event, target, **kwargs)
    assert json.loads(out) == expected
    assert b"\n" not in out and b": " not in out and b", " not in out  # minified


def test_raw_insertion_inside_quotes_is_not_escaped():
    # AWS: "EventBridge doesn't escape values extracted by Input Path". A value with a quote
    # therefore breaks a JSON template; the text goes out as is rather than being repaired.
    event = {**CORE, "detail": {"msg": 'say "hi"'}}
    out = render(event, transformer('{"m": "<msg>"}', {"msg": "$.detail.msg"}))
    assert out == b'{"m": "say "hi""}'


def test_non_ascii_is_kept_and_encoded_as_utf8():
    event = {**CORE, "detail": {"name": "café ☕"}}
    assert render(event, transformer('{"n": <n>}', {"n": "$.detail.name"})) == \
        '{"n":"café ☕"}'.encode()
    assert json.loads(render(event, {"Id": "t", "Arn": "queue:q"})) == event


def test_select_subset():
    doc = {"a": [{"b": 1}, {"b": 2}, {"c": 3}], "d-e": {"f/g": True}}
    assert select(doc, "$.a[1].b") == 2
    assert select(doc, "$.a[*].b") == [1, 2]
    assert select(doc, "$.d-e.f/g") is True
    assert select(doc, "$.a[9]") is select(doc, "$.zzz")  # both missing
    assert select(doc, "$.nope[*]") == []


# (name, target, expected message fragment)
INVALID = [
    ("Input and InputPath", {"Id": "t", "Arn": "queue:q", "Input": "{}", "InputPath": "$"},
     "Targets[0]: only one of Input, InputPath or InputTransformer may be given"),
    ("InputPath and InputTransformer",
     {"Id": "t", "Arn": "queue:q", "InputPath": "$.detail", **transformer('"x"')},
     "Targets[0]: only one of Input, InputPath or InputTransformer"),
    ("Input that is not JSON", {"Id": "t", "Arn": "queue:q", "Input": "hello"},
     "Targets[0].Input: is not valid JSON"),
    ("recursive descent", {"Id": "t", "Arn": "queue:q", "InputPath": "$..detail"},
     "Targets[0].InputPath: '$..detail': recursive descent"),
    ("path without $", {"Id": "t", "Arn": "queue:q", "InputPath": "detail.state"},
     "Targets[0].InputPath: 'detail.state' is not a JSONPath"),
    ("negative index", {"Id": "t", "Arn": "queue:q", "InputPath": "$.resources[-1]"},
     "Targets[0].InputPath: '$.resources[-1]': unsupported selector"),
    ("filter", {"Id": "t", "Arn": "queue:q", "InputPath": "$.a[?(@.b)]"},
     "Targets[0].InputPath:"),
    ("unclosed bracket", {"Id": "t", "Arn": "queue:q", "InputPath": "$.a[0"},
     "Targets[0].InputPath: '$.a[0': '[' at position 3 is not closed"),
    ("trailing dot", {"Id": "t", "Arn": "queue:q", "InputPath": "$.a."},
     "Targets[0].InputPath: '$.a.': expected a field name"),
    ("path too long", {"Id": "t", "Arn": "queue:q", "InputPath": "$." + "a" * 255},
     "Targets[0].InputPath: at most 256 characters"),
    ("undefined placeholder (AWS: contains invalid placeholder notdefinedkey)",
     transformer('"Event of <detail-type> type, with not defined key <notdefinedkey>"',
                 CORE_PATHS),
     "Targets[0].InputTransformer.InputTemplate: contains invalid placeholder <notdefinedkey>"),
    ("101 map entries", transformer('"x"', {f"k{i}": "$.a" for i in range(101)}),
     "Targets[0].InputTransformer.InputPathsMap: at most 100 entries, got 101"),
    ("reserved name", transformer('"<aws.events.rule-name>"', {"aws.events.rule-name": "$.a"}),
     "Targets[0].InputTransformer.InputPathsMap: 'aws.events.rule-name' is reserved"),
    ("reserved prefix", transformer('"x"', {"AWS.mine": "$.a"}),
     "Targets[0].InputTransformer.InputPathsMap: 'AWS.mine' is reserved"),
    ("bad key", transformer('"x"', {"has space": "$.a"}),
     "Targets[0].InputTransformer.InputPathsMap: 'has space' must be 1 to 256 characters"),
    ("bracket notation in the map", transformer('"<a>"', {"a": "$['detail']"}),
     "Targets[0].InputTransformer.InputPathsMap.a: \"$['detail']\": use dot notation"),
    ("bad path in the map", transformer('"<a>"', {"a": "$.detail..x"}),
     "Targets[0].InputTransformer.InputPathsMap.a: '$.detail..x': recursive descent"),
    ("missing template", {"Id": "t", "Arn": "queue:q", "InputTransformer": {"InputPathsMap": {}}},
     "Targets[0].InputTransformer.InputTemplate: is required"),
    ("template too long", transformer('"' + "x" * 8192 + '"'),
     "Targets[0].InputTransformer.InputTemplate: at most 8192 characters"),
    ("placeholder as an object key (inside quotes)", transformer('{"<a>": 1}', {"a": "$.a"}),
     "Targets[0].InputTransformer.InputTemplate: a placeholder cannot be used as an object key"),
    ("placeholder as an object key (bare)", transformer('{<a>: 1}', {"a": "$.a"}),
     "Targets[0].InputTransformer.InputTemplate: looks like JSON but is not valid JSON"),
    ("retry attempts too many", {"Id": "t", "Arn": "queue:q",
                                 "RetryPolicy": {"MaximumRetryAttempts": 186}},
     "Targets[0].RetryPolicy.MaximumRetryAttempts: must be an integer from 0 to 185, got 186"),
    ("event age too short", {"Id": "t", "Arn": "queue:q",
                             "RetryPolicy": {"MaximumEventAgeInSeconds": 59}},
     "Targets[0].RetryPolicy.MaximumEventAgeInSeconds: must be an integer from 60 to 86400"),
    ("bad Arn", {"Id": "t", "Arn": "sqs:q"}, "Targets[0].Arn: unknown target kind"),
    ("bad dead-letter Arn", {"Id": "t", "Arn": "queue:q", "DeadLetterConfig": {"Arn": "file:x"}},
     "Targets[0].DeadLetterConfig.Arn: file target needs an absolute path"),
    ("bad Id", {"Id": "a b", "Arn": "queue:q"}, "Targets[0].Id: must be 1 to 64 characters"),
]


@pytest.mark.parametrize("target,message", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_targets(target, message):
    with pytest.raises(ValueError) as e:
        validate_target(target)
    assert message in str(e.value)


def test_index_names_the_entry():
    with pytest.raises(ValueError, match=r"^Targets\[3\]\.Input: "):
        validate_target({"Id": "t", "Arn": "queue:q", "Input": "{"}, index=3)


def test_valid_targets_pass():
    validate_target({"Id": "a.b-c_1", "Arn": "webhook+https://example.com/hook",
                     "RetryPolicy": {"MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60},
                     "DeadLetterConfig": {"Arn": "queue:dlq"}})
    validate_target(transformer('{"all": <aws.events.event.json>}'))
    validate_target(transformer('"x"', {f"k{i}": "$.detail.a[0].b" for i in range(100)}))
    validate_target(transformer("plain <a> text", {"a": "$.detail.*"}))


def test_retry_limits_defaults():
    assert retry_limits({"Id": "t", "Arn": "queue:q"}) == (185, 86400)
    assert retry_limits({"RetryPolicy": {"MaximumRetryAttempts": 0}}) == (0, 86400)
    assert retry_limits({"RetryPolicy": {"MaximumEventAgeInSeconds": 60}}) == (185, 60)
