"""Story: events and rules from the `shoal` command line.

A user tests a pattern locally before using it (`shoal events test-pattern`), manages a rule and
its targets with `shoal rules …` (and sees the same state through boto3), routes events put with
PutEvents to a durable queue and reads them with `shoal events consume`, and watches matching
events live with `shoal events tail --pattern`.

The CLI runs as real subprocesses with only the server's endpoint, credentials and region in its
environment.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tests.support import ServerProcess, wait_for

SHOAL = [sys.executable, "-m", "shoal"]


def _env(server, home: Path) -> dict:
    creds = server.credentials
    return {
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "HOME": str(home),
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_ACCESS_KEY_ID": creds["accessKeyId"],
        "AWS_SECRET_ACCESS_KEY": creds["secretAccessKey"],
        "AWS_DEFAULT_REGION": "local",
        "AWS_EC2_METADATA_DISABLED": "true",
        "SHOAL_ENDPOINT": server.endpoint,
    }


def shoal(env: dict, *args: str, code: int = 0, timeout: float = 30) -> subprocess.CompletedProcess:
    proc = subprocess.run([*SHOAL, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == code, (f"shoal {' '.join(args)} exited {proc.returncode}, not {code}:\n"
                                     f"{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The CLI is a client of the API, which the integration tests run on both databases: one
    backend is enough here."""
    srv = ServerProcess(tmp_path_factory.mktemp("shoal-cli")).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def events(server):
    return server.client("events")


@pytest.fixture
def env(server, tmp_path):
    return _env(server, tmp_path)


def test_test_pattern_is_local_and_says_true_false_or_why_not(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no server, no credentials
    event = json.dumps({"source": "custom.app", "detail-type": "alert", "detail": {"level": "error", "n": 7}})
    pattern = {"source": ["custom.app"], "detail": {"level": ["error"], "n": [{"numeric": [">", 5]}]}}
    assert shoal(env, "events", "test-pattern", "--pattern", json.dumps(pattern), "--event", event).stdout == "true\n"
    (tmp_path / "p.json").write_text(json.dumps({**pattern, "source": ["other"]}))
    (tmp_path / "e.json").write_text(event)
    assert shoal(env, "events", "test-pattern", "--pattern", f"@{tmp_path / 'p.json'}",
                 "--event", f"@{tmp_path / 'e.json'}").stdout == "false\n"

    bad = shoal(env, "events", "test-pattern", "--pattern", '{"source": "custom.app"}', "--event", event, code=2)
    assert bad.stdout == ""
    assert bad.stderr.strip() == ('error: InvalidEventPatternException: Event pattern is not valid. '
                                  'Reason: "source" must be an object or an array')
    not_json = shoal(env, "events", "test-pattern", "--pattern", json.dumps(pattern), "--event", "{nope", code=2)
    assert not_json.stdout == "" and "the event is not valid JSON" in not_json.stderr
    not_object = shoal(env, "events", "test-pattern", "--pattern", json.dumps(pattern), "--event", "[1]", code=2)
    assert "the event must be a JSON object" in not_object.stderr


def test_rule_and_target_round_trip(env, events, unique):
    name = unique("rule")
    pattern = json.dumps({"source": ["custom.app"], "detail-type": ["deploy"]})
    arn = shoal(env, "rules", "put", name, "--pattern", pattern, "--description", "deploys").stdout.strip()
    assert arn.endswith(f":rule/{name}")
    described = events.describe_rule(Name=name)
    assert (described["Arn"], described["State"], described["Description"]) == (arn, "ENABLED", "deploys")
    assert json.loads(described["EventPattern"]) == json.loads(pattern)

    listed = shoal(env, "rules", "list", "--prefix", name).stdout.splitlines()
    assert len(listed) == 1 and listed[0].split()[:2] == [name, "ENABLED"]
    assert [r["Name"] for r in json.loads(shoal(env, "rules", "list", "--prefix", name, "--json").stdout)] == [name]
    doc = json.loads(shoal(env, "rules", "describe", name).stdout)
    assert doc["Arn"] == arn and doc["EventPattern"] == pattern and "ResponseMetadata" not in doc

    transformer = {"InputPathsMap": {"svc": "$.detail.service"}, "InputTemplate": '{"deployed": <svc>}'}
    shoal(env, "rules", "put-target", name, "--id", "hook", "--arn", "webhook+https://example.test/hook",
          "--input-transformer", json.dumps(transformer), "--max-attempts", "3", "--max-age", "600",
          "--dlq", "queue:dead")
    shoal(env, "rules", "put-target", name, "--id", "log", "--arn", "file:/tmp/shoal-deploys.jsonl",
          "--input-path", "$.detail")
    targets = {t["Id"]: t for t in events.list_targets_by_rule(Rule=name)["Targets"]}
    assert targets["hook"] == {"Id": "hook", "Arn": "webhook+https://example.test/hook",
                               "InputTransformer": transformer,
                               "RetryPolicy": {"MaximumRetryAttempts": 3, "MaximumEventAgeInSeconds": 600},
                               "DeadLetterConfig": {"Arn": "queue:dead"}}
    assert targets["log"] == {"Id": "log", "Arn": "file:/tmp/shoal-deploys.jsonl", "InputPath": "$.detail"}
    assert json.loads(shoal(env, "rules", "targets", name, "--json").stdout) == [targets["hook"], targets["log"]]
    lines = shoal(env, "rules", "targets", name).stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["hook", "webhook+https://example.test/hook"],
                                                    ["log", "file:/tmp/shoal-deploys.jsonl"]]

    shoal(env, "rules", "disable", name)
    assert events.describe_rule(Name=name)["State"] == "DISABLED"
    shoal(env, "rules", "enable", name)
    assert events.describe_rule(Name=name)["State"] == "ENABLED"

    refused = shoal(env, "rules", "delete", name, code=1)
    assert refused.stderr.strip() == "error: ValidationException: Rule can't be deleted since it has targets."
    shoal(env, "rules", "remove-target", name, "hook", "log")
    assert events.list_targets_by_rule(Rule=name)["Targets"] == []
    shoal(env, "rules", "delete", name)
    with pytest.raises(ClientError) as err:
        events.describe_rule(Name=name)
    assert err.value.response["Error"]["Code"] == "ResourceNotFoundException"

    missing = shoal(env, "rules", "describe", name, code=1)
    assert missing.stderr.strip() == (f"error: ResourceNotFoundException: Rule {name} does not exist "
                                      "on EventBus default.")
    invalid = shoal(env, "rules", "put", name, "--pattern", '{"source": []}', code=1)
    assert invalid.stderr.startswith("error: InvalidEventPatternException: Event pattern is not valid.")
    refused = shoal(env, "rules", "put-target", unique("nope"), "--id", "x", "--arn", "queue:q", code=1)
    assert refused.stderr.startswith("error: ResourceNotFoundException: Rule ")


def _put(events, detail_type: str, detail: dict, source: str = "custom.app") -> str:
    resp = events.put_events(Entries=[{"Source": source, "DetailType": detail_type, "Detail": json.dumps(detail)}])
    assert resp["FailedEntryCount"] == 0, resp
    return resp["Entries"][0]["EventId"]


def test_queue_target_and_consume(env, events, unique):
    rule = unique("alerts")
    shoal(env, "rules", "put", rule, "--pattern", json.dumps({"source": ["custom.app"], "detail-type": ["alert"]}))
    shoal(env, "rules", "put-target", rule, "--id", "q", "--arn", "queue:alerts")
    _put(events, "not-an-alert", {"level": "info"})
    event_id = _put(events, "alert", {"level": "error", "msg": "disk full"})

    # Waits for the dispatcher's delivery; without acknowledging, with no visibility timeout.
    first = shoal(env, "events", "consume", "alerts", "--follow", "--max", "1", "--no-ack", "--visibility", "0",
                  "--verbose", timeout=20).stdout.splitlines()
    assert len(first) == 1
    message = json.loads(first[0])
    assert message["eventId"] == event_id and message["receiveCount"] == 1 and "receipt" not in message
    assert message["body"]["id"] == event_id and message["body"]["detail"] == {"level": "error", "msg": "disk full"}

    # Not acknowledged, so it is there again; this time printed as its body alone and acknowledged.
    second = shoal(env, "events", "consume", "alerts", "--visibility", "0").stdout.splitlines()
    assert [json.loads(line) for line in second] == [message["body"]]
    assert shoal(env, "events", "consume", "alerts", "--visibility", "0").stdout == ""


def test_tail_prints_matching_events_as_they_happen(env, events, unique):
    source = "custom.tail"
    before = _put(events, "job", {"level": "error", "n": -1}, source)  # in the log before tail starts
    pattern = json.dumps({"source": [source], "detail": {"level": ["error"]}})
    proc = subprocess.Popen([*SHOAL, "events", "tail", "--pattern", pattern], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    put: dict[str, str] = {}  # event id -> which kind
    try:
        last = [0.0]

        def printed():
            if time.monotonic() - last[0] > 0.5:  # tail takes a moment to start: keep putting pairs
                last[0] = time.monotonic()
                put[_put(events, "job", {"level": "info"}, source)] = "other"
                put[_put(events, "job", {"level": "error"}, source)] = "match"
            return lines

        wait_for(printed, timeout=20, interval=0.05, message="`shoal events tail` to print an event")
        time.sleep(0.5)  # time to print anything else it would
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(10) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    ids = [line.split()[1] for line in lines]
    assert ids and all(put.get(i) == "match" for i in ids), (lines, put)
    assert before not in ids
    assert all(" job " in line for line in lines)
