"""Named alarms: set through `PUT /v1/alarms/<name>` and `shoal alarm set`, listed through the API
and the CLI, and read by what daemon deployments will call (`states`, `tripped`) on the server's
own database. Bad input is refused naming the field, and leaves no trace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shoal.api.operations import Context
from shoal.control import alarms
from shoal.domain.arns import ArnFactory
from shoal.domain.errors import InvalidParameter


def put(server, name: str, body, *, raw: bytes | None = None) -> httpx.Response:
    """A SigV4-signed PUT, as the CLI sends it."""
    url = f"{server.endpoint}/v1/alarms/{name}"
    data = raw if raw is not None else json.dumps(body).encode()
    request = AWSRequest(method="PUT", url=url, data=data, headers={"Content-Type": "application/json"})
    creds = server.credentials
    SigV4Auth(Credentials(creds["accessKeyId"], creds["secretAccessKey"]), "ecs", "local").add_auth(request)
    return httpx.put(url, content=data, headers=dict(request.headers.items()), timeout=30)


def set_alarm(server, name: str, state: str, reason: str | None = None) -> dict:
    resp = put(server, name, {"state": state, **({"reason": reason} if reason is not None else {})})
    assert resp.status_code == 200, resp.text
    return resp.json()["alarm"]


def get_alarm(server, name: str) -> dict:
    resp = server.get(f"/v1/alarms/{name}", {})
    assert resp.status_code == 200, resp.text
    return resp.json()["alarm"]


def listed(server) -> dict[str, dict]:
    resp = server.get("/v1/alarms", {})
    assert resp.status_code == 200, resp.text
    names = [a["name"] for a in resp.json()["alarms"]]
    assert names == sorted(names)
    return {a["name"]: a for a in resp.json()["alarms"]}


def test_the_first_set_creates_an_alarm_and_later_sets_change_it(server, unique):
    name = unique("gpu-xid-rate")
    created = set_alarm(server, name, "OK", "baseline")
    assert set(created) == {"name", "state", "reason", "updatedAt", "enteredAlarmAt"}
    assert (created["name"], created["state"], created["reason"], created["enteredAlarmAt"]) == \
        (name, "OK", "baseline", None)
    assert get_alarm(server, name) == created == listed(server)[name]

    alarmed = set_alarm(server, name, "ALARM", "xid 79 on 3 hosts")
    assert alarmed["state"] == "ALARM" and alarmed["enteredAlarmAt"] == alarmed["updatedAt"]
    # ALARM again: a new reason, but it did not enter ALARM again.
    again = set_alarm(server, name, "ALARM", "xid 79 on 4 hosts")
    assert again["reason"] == "xid 79 on 4 hosts" and again["enteredAlarmAt"] == alarmed["enteredAlarmAt"]
    cleared = set_alarm(server, name, "OK")
    assert (cleared["state"], cleared["reason"], cleared["enteredAlarmAt"]) == ("OK", "", alarmed["enteredAlarmAt"])
    assert get_alarm(server, name) == cleared


def test_states_and_tripped_are_what_a_deployment_reads(server, db, unique):
    before, quiet, late, never = unique("before"), unique("quiet"), unique("late"), unique("never")
    set_alarm(server, before, "ALARM", "already firing")
    set_alarm(server, quiet, "OK")
    set_alarm(server, late, "OK")
    time.sleep(0.01)
    started = time.time()  # a deployment starts
    time.sleep(0.01)
    names = [before, quiet, late, never]
    assert db.read_sync(lambda conn: alarms.states(conn, names)) == {
        before: "ALARM", quiet: "OK", late: "OK", never: "INSUFFICIENT_DATA"}
    assert db.read_sync(lambda conn: alarms.tripped(conn, names, started)) == []  # `before` is ignored

    set_alarm(server, late, "ALARM")
    set_alarm(server, late, "OK")  # back to OK before anyone looked: it still tripped
    set_alarm(server, before, "ALARM", "still firing")  # no new ALARM episode
    assert db.read_sync(lambda conn: alarms.tripped(conn, names, started)) == [late]
    set_alarm(server, before, "OK")
    set_alarm(server, before, "ALARM", "firing again")  # a new episode after the start counts
    assert db.read_sync(lambda conn: alarms.tripped(conn, names, started)) == sorted([before, late])
    assert db.read_sync(lambda conn: alarms.states(conn, [])) == {}


def test_set_state_through_a_unit_of_work_checks_its_input(db, unique):
    name = unique("direct")
    doc = db.submit(lambda conn: alarms.set_state(Context(conn, ArnFactory(), now=1_750_000_000.0),
                                                  name, "ALARM", "set by a test")).result(10)
    assert (doc["state"], doc["updatedAt"], doc["enteredAlarmAt"]) == \
        ("ALARM", "2025-06-15T15:06:40.000Z", "2025-06-15T15:06:40.000Z")
    with pytest.raises(InvalidParameter, match="'state'"):
        db.submit(lambda conn: alarms.set_state(Context(conn, ArnFactory()), name, "RED", "")).result(10)
    assert db.read_sync(lambda conn: alarms.states(conn, [name])) == {name: "ALARM"}


def test_bad_input_is_refused_naming_the_field_and_leaves_no_trace(server, unique):
    name = unique("bad")
    before = listed(server)
    for body, field in [({"state": "RED"}, "'state'"), ({"state": "alarm"}, "'state'"), ({}, "'state'"),
                        ({"state": None}, "'state'"), ({"state": ["ALARM"]}, "'state'"),
                        ({"state": "OK", "reason": 5}, "'reason'"), ({"state": "OK", "reason": "r" * 1024}, "'reason'"),
                        ({"state": "OK", "color": "red"}, "'color'"), (["OK"], "request body")]:
        resp = put(server, name, body)
        assert resp.status_code == 400, (body, resp.text)
        assert resp.json()["__type"] == "InvalidParameterException" and field in resp.json()["message"], resp.text
    not_json = put(server, name, None, raw=b"{state: OK")
    assert not_json.status_code == 400 and "request body" in not_json.json()["message"]
    too_long = put(server, "n" * 256, {"state": "OK"})
    assert too_long.status_code == 400 and "'name'" in too_long.json()["message"]
    assert listed(server) == before

    missing = server.get(f"/v1/alarms/{name}", {})
    assert missing.status_code == 404 and missing.json()["__type"] == "ResourceNotFoundException"
    unsigned = httpx.put(f"{server.endpoint}/v1/alarms/{name}", json={"state": "OK"}, timeout=10)
    assert unsigned.status_code == 403
    assert httpx.get(f"{server.endpoint}/v1/alarms", timeout=10).status_code == 403


def test_concurrent_first_sets_all_succeed(server, unique):
    name = unique("race")
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: put(server, name, {"state": "ALARM" if i % 2 else "OK",
                                                               "reason": f"writer {i}"}), range(16)))
    assert [r.status_code for r in responses] == [200] * 16, [r.text for r in responses if r.status_code != 200]
    assert get_alarm(server, name)["reason"].startswith("writer ")


# --- the CLI ------------------------------------------------------------------------------------


def shoal(server, home: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess:
    creds = server.credentials
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "HOME": str(home),
           "AWS_ACCESS_KEY_ID": creds["accessKeyId"], "AWS_SECRET_ACCESS_KEY": creds["secretAccessKey"],
           "AWS_DEFAULT_REGION": "local", "SHOAL_ENDPOINT": server.endpoint}
    proc = subprocess.run([sys.executable, "-m", "shoal", *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, f"shoal {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_cli_sets_and_lists_alarms(server, unique, tmp_path, backend):
    if backend != "sqlite":
        pytest.skip("the CLI is a client of the API: one backend is enough")
    name = unique("cli-alarm")
    out = shoal(server, tmp_path, "alarm", "set", name, "ALARM", "--reason", "p95 latency over 2 s").stdout
    assert out.split()[:2] == [name, "ALARM"] and out.rstrip().endswith("p95 latency over 2 s")
    assert get_alarm(server, name)["reason"] == "p95 latency over 2 s"
    shoal(server, tmp_path, "alarm", "set", name, "ok")  # any case
    doc = json.loads(shoal(server, tmp_path, "alarm", "list", "--json").stdout)
    assert isinstance(doc, list) and {a["name"]: a["state"] for a in doc}[name] == "OK"
    assert doc == list(listed(server).values())
    table = [line.split()[:2] for line in shoal(server, tmp_path, "alarm", "list").stdout.splitlines()]
    assert [name, "OK"] in table

    bad_state = shoal(server, tmp_path, "alarm", "set", name, "RED", code=2)
    assert "invalid state 'RED'" in bad_state.stderr
    bad_name = shoal(server, tmp_path, "alarm", "set", "a/b", "OK", code=2)
    assert "invalid alarm name" in bad_name.stderr
    assert get_alarm(server, name)["state"] == "OK"
