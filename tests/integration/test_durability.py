"""kill -9 the server in the middle of a burst of RunTask calls, then restart it.

Every call that got a 200 must be there with its event. Nothing may appear that no call asked
for, and a call that was in flight at the kill (committed or not, the client cannot know) is
settled by retrying it with the same clientToken: it then exists exactly once.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support import ServerProcess, database_url_for, wait_for

CALLS = 500
CLIENTS = 4
KILL_AFTER = 150


@pytest.fixture
def durable_server(backend, tmp_path):
    srv = ServerProcess(tmp_path / "data", database_url_for(backend))
    srv.data_dir.mkdir()
    yield srv.start()
    srv.stop()


def _all_tasks(ecs, cluster):
    arns, token = [], None
    while True:
        page = ecs.list_tasks(cluster=cluster, maxResults=100, **({"nextToken": token} if token else {}))
        arns += page["taskArns"]
        token = page.get("nextToken")
        if not token:
            break
    docs = []
    for i in range(0, len(arns), 100):
        docs += ecs.describe_tasks(cluster=cluster, tasks=arns[i:i + 100])["tasks"]
    return docs


def test_kill_9_mid_burst_loses_no_acknowledged_task_and_invents_none(durable_server):
    srv = durable_server
    setup = srv.client()
    setup.create_cluster(clusterName="burst")
    setup.register_task_definition(family="burst", containerDefinitions=[{"name": "c", "image": "x", "memory": 64}])

    acked: dict[int, str] = {}
    attempted: set[int] = set()
    lock = threading.Lock()
    next_call = iter(range(CALLS))

    def worker():
        ecs = srv.client()
        while True:
            with lock:
                i = next(next_call, None)
                if i is None:
                    return
                attempted.add(i)
            try:
                task = ecs.run_task(cluster="burst", taskDefinition="burst", startedBy=f"call-{i}",
                                    clientToken=f"token-{i}")["tasks"][0]
            except Exception:
                return  # the server is gone
            with lock:
                acked[i] = task["taskArn"]

    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(worker) for _ in range(CLIENTS)]
        wait_for(lambda: len(acked) >= KILL_AFTER, timeout=60, message=f"{KILL_AFTER} acknowledged calls")
        srv.kill()
        for f in futures:
            f.result()
    assert KILL_AFTER <= len(acked) < CALLS, "the kill must land mid-burst"

    srv.start()
    ecs = srv.client()
    tasks = _all_tasks(ecs, "burst")
    by_call = {int(t["startedBy"].split("-")[1]): t for t in tasks}
    assert len(by_call) == len(tasks), "one task per call"

    # Every acknowledged call is present, as the task it was told about.
    for i, arn in acked.items():
        assert by_call[i]["taskArn"] == arn
    # Nothing that no call asked for; at most the calls in flight at the kill are unacknowledged.
    unacked = set(by_call) - set(acked)
    assert unacked <= attempted and len(unacked) <= CLIENTS

    # Each present task has exactly its creation event, and no event names a missing task.
    events = [e for e in srv.events() if e["detail-type"] == "ECS Task State Change"]
    per_task: dict[str, list] = {}
    for e in events:
        per_task.setdefault(e["resources"][0], []).append(e["detail"]["lastStatus"])
    assert per_task == {t["taskArn"]: ["PENDING"] for t in tasks}

    # A client retrying its in-flight calls with the same token gets one task each, never two.
    for i in attempted - set(acked):
        again = ecs.run_task(cluster="burst", taskDefinition="burst", startedBy=f"call-{i}",
                             clientToken=f"token-{i}")["tasks"][0]
        if i in by_call:
            assert again["taskArn"] == by_call[i]["taskArn"]
    after = _all_tasks(ecs, "burst")
    assert len(after) == len(tasks) + len((attempted - set(acked)) - set(by_call))
