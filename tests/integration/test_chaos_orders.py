"""Chaos orders on the server (`POST /v1/chaos`, shoal.control.chaos), with hosts registered by
the test itself: an order reaches the host's agent in its poll answers like a task change (a
long-poll wakes for it, a cursor past it no longer carries it), is settled once by the agent's
report, and lands in the action log. A real host needs `really`; bad orders name the field and
store nothing.
"""

from __future__ import annotations

import json

import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shoal.sim import HostSpec, SimFleet
from tests.integration.test_agent_protocol import join_token, make_cluster, poll, register_host, report
from tests.support import wait_for

SIMULATED = [{"name": "shoal.simulated", "value": "true"}, {"name": "ecs.capability.gpu-sharing-mps"}]


def post(server, body: dict) -> httpx.Response:
    url = f"{server.endpoint}/v1/chaos"
    data = json.dumps(body).encode()
    request = AWSRequest(method="POST", url=url, data=data, headers={"Content-Type": "application/json"})
    creds = server.credentials
    SigV4Auth(Credentials(creds["accessKeyId"], creds["secretAccessKey"]), "ecs", "local").add_auth(request)
    return httpx.post(url, content=data, headers=dict(request.headers.items()), timeout=30)


def order(server, body: dict) -> dict:
    resp = post(server, body)
    assert resp.status_code == 200, resp.text
    return resp.json()["order"]


def refused(server, body: dict, field: str) -> str:
    resp = post(server, body)
    assert resp.status_code == 400 and resp.json()["__type"] == "InvalidParameterException", resp.text
    assert f"'{field}'" in resp.json()["message"], resp.json()
    return resp.json()["message"]


def test_an_order_travels_in_the_poll_answers_until_the_agent_settles_it(server, ecs, unique):
    cluster, _ = make_cluster(ecs, unique)
    arn, token = register_host(server, cluster, gpus=2, attributes=SIMULATED)
    first = poll(server, token).json()
    assert "orders" not in first

    placed = order(server, {"cluster": cluster, "host": arn, "action": "mps", "mode": "hang", "gpu": 1})
    assert placed["status"] == "PENDING" and placed["gpu"] == 1 and placed["simulated"] is True
    # the long-poll wakes for it, and the answer after the agent's cursor carries it
    woke = poll(server, token, since=first["version"], cursor=first["cursor"], wait=10).json()
    assert [o["orderId"] for o in woke["orders"]] == [placed["orderId"]]
    assert woke["orders"][0]["gpuId"] == ecs.describe_container_instances(
        cluster=cluster, containerInstances=[arn])["containerInstances"][0]["gpuDevices"][1]["gpuId"]
    # a full answer (an agent restarted) carries it while it is pending; a later cursor does not
    assert [o["orderId"] for o in poll(server, token).json()["orders"]] == [placed["orderId"]]
    assert "orders" not in poll(server, token, cursor=woke["cursor"]).json()

    ack = {"orderId": placed["orderId"], "status": "DONE", "result": "hung"}
    assert httpx.post(f"{server.endpoint}/v1/agent/report", json={"orders": [ack]},
                      headers={"Authorization": f"Bearer {token}"}).status_code == 200
    # settled once: a repeated report changes nothing
    httpx.post(f"{server.endpoint}/v1/agent/report", json={"orders": [{**ack, "status": "FAILED", "result": "x"}]},
               headers={"Authorization": f"Bearer {token}"})
    done = server.get(f"/v1/chaos/{placed['orderId']}", {}).json()["order"]
    assert (done["status"], done["result"]) == ("DONE", "hung") and done["doneAt"]
    assert "orders" not in poll(server, token).json()
    entries = server.get("/v1/action-logs", {"cluster": cluster}).json()["entries"]
    assert [e["eventName"] for e in entries if e["eventName"].startswith("CHAOS")] == ["CHAOS_REQUESTED", "CHAOS_DONE"]
    assert report(server, token).status_code == 200


def test_a_real_host_needs_really(server, ecs, unique):
    cluster, _ = make_cluster(ecs, unique)
    arn, _token = register_host(server, cluster, gpus=1, attributes=[{"name": "ecs.capability.gpu-sharing-mps"}])
    assert "real host" in refused(server, {"cluster": cluster, "host": arn, "action": "xid", "gpu": 0, "xid": 79},
                                  "really")
    assert order(server, {"cluster": cluster, "host": arn, "action": "xid", "gpu": 0, "xid": 79,
                          "really": True})["simulated"] is False


def test_bad_orders_name_the_field_and_store_nothing(server, ecs, unique):
    cluster, _ = make_cluster(ecs, unique)
    arn, token = register_host(server, cluster, gpus=1, attributes=SIMULATED)
    plain, _ = register_host(server, cluster, attributes=[{"name": "shoal.simulated", "value": "true"}])
    base = {"cluster": cluster, "host": arn}
    for body, field in [({**base, "action": "melt"}, "action"),
                        ({"cluster": cluster, "action": "xid"}, "host"),
                        ({**base, "host": "i-none", "action": "xid", "gpu": 0, "xid": 79}, "host"),
                        ({**base, "action": "mps", "mode": "explode"}, "mode"),
                        ({**base, "action": "mps", "mode": "crash", "gpu": 1}, "gpu"),
                        ({**base, "action": "mps", "mode": "crash", "gpu": -1}, "gpu"),
                        ({**base, "host": plain, "action": "mps", "mode": "crash"}, "host"),
                        ({**base, "action": "xid", "gpu": 0}, "xid"),
                        ({**base, "action": "xid", "gpu": 0, "xid": "79"}, "xid"),
                        ({**base, "action": "daemon", "daemon": "logd", "kill": True}, "daemon"),
                        ({**base, "action": "daemon", "daemon": "logd"}, "kill"),
                        ({**base, "action": "xid", "gpu": 0, "xid": 79, "really": "yes"}, "really"),
                        ({**base, "action": "xid", "gpu": 0, "xid": 79, "force": True}, "force")]:
        refused(server, body, field)
    assert "orders" not in poll(server, token).json()
    assert server.get("/v1/chaos/nope", {}).status_code == 404
    resp = post(server, {**base, "cluster": "no-such-cluster", "action": "xid", "gpu": 0, "xid": 79})
    assert resp.status_code == 400 and resp.json()["__type"] == "ClusterNotFoundException", resp.text


def test_the_fleet_emulator_models_the_faults_at_scale_as_an_agent_reports_them(server, ecs, unique):
    """`shoal chaos` on `shoal sim` hosts: the fleet emulator answers orders as a real agent's GPU
    health would (shoal.sim.faults), through the same protocol."""
    cluster, _ = make_cluster(ecs, unique)
    specs = [HostSpec("p5en.48xlarge", 20)]
    with SimFleet(server.endpoint, join_token(server), cluster, specs, poll_wait=5, mps_probe_interval=0.3) as sim:
        sim.wait_active_blocking(timeout=60)
        arn = sim.arns[7]

        def drill(**body) -> dict:
            placed = order(server, {"cluster": cluster, "host": arn, **body})
            return wait_for(lambda: (lambda o: o if o["status"] != "PENDING" else None)(
                server.get(f"/v1/chaos/{placed['orderId']}", {}).json()["order"]), timeout=10, message="an answer")

        def accelerated() -> dict:
            host = ecs.describe_container_instances(cluster=cluster, containerInstances=[arn],
                                                    include=["CONTAINER_INSTANCE_HEALTH"])["containerInstances"][0]
            return next(d for d in host["healthStatus"]["details"] if d["type"] == "ACCELERATED_COMPUTE")

        def becomes(status: str) -> dict:
            return wait_for(lambda: (lambda c: c if c["status"] == status else None)(accelerated()), timeout=10,
                            message=f"ACCELERATED_COMPUTE {status}")

        hang = drill(action="mps", mode="hang", gpu=2)
        assert hang["status"] == "DONE" and "never answers" in hang["result"]
        assert "no answer to" in becomes("IMPAIRED")["statusReason"]
        assert drill(action="mps", mode="recover", gpu=2)["status"] == "DONE"
        becomes("OK")

        # a crash fails the MPS tasks of that GPU (their clients lost the server); the daemon comes back
        family = unique("mps")
        ecs.register_task_definition(family=family, containerDefinitions=[{
            "name": "c", "image": "x", "memory": 64, "resourceRequirements": [
                {"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 4096}}}]}])
        [task] = ecs.start_task(cluster=cluster, taskDefinition=family, containerInstances=[arn])["tasks"]
        wait_for(lambda: ecs.describe_tasks(cluster=cluster, tasks=[task["taskArn"]])["tasks"][0]["lastStatus"]
                 == "RUNNING", timeout=10, message="the MPS task RUNNING")
        gpus = next(r["stringSetValue"] for r in ecs.describe_container_instances(
            cluster=cluster, containerInstances=[arn])["containerInstances"][0]["registeredResources"] if r["name"] == "GPU")
        crash = drill(action="mps", mode="crash", gpu=gpus.index(task["containers"][0]["gpuIds"][0]))
        assert crash["status"] == "DONE" and "1 MPS task(s) lost their server" in crash["result"], crash
        stopped = wait_for(lambda: (lambda t: t if t["lastStatus"] == "STOPPED" else None)(
            ecs.describe_tasks(cluster=cluster, tasks=[task["taskArn"]])["tasks"][0]), timeout=10, message="STOPPED")
        assert "lost their MPS server" in stopped["stoppedReason"], stopped
        becomes("OK")  # restarted
        changes = [c["status"] for e in server.events() if e["detail-type"] == "ECS Container Instance Health Change"
                   and e["detail"]["containerInstanceArn"] == arn
                   for c in e["detail"]["healthChecks"] if c["type"] == "ACCELERATED_COMPUTE"]
        transitions = [c for i, c in enumerate(changes) if i == 0 or changes[i - 1] != c]
        assert transitions[-4:] == ["IMPAIRED", "OK", "IMPAIRED", "OK"], changes  # the hang, then the crash

        assert "logged only" in drill(action="xid", gpu=1, xid=13)["result"]
        assert accelerated()["status"] == "OK"
        assert drill(action="xid", gpu=1, xid=79)["status"] == "DONE"
        assert becomes("IMPAIRED")["statusReason"] == "XID_79"
