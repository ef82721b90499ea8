"""Concurrent writers must not corrupt state, and the event cursor must never skip.

Two server processes share one database (the SQLite file, or one PostgreSQL database) and are
hammered by concurrent clients, the way several control-plane replicas would be.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support import ServerProcess, database_url_for

THREADS = 8


@pytest.fixture
def two_servers(backend, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    url = database_url_for(backend) or f"sqlite:///{data / 'shared.db'}"
    first = ServerProcess(data, url).start()
    second = ServerProcess(data, url).start()
    yield first, second
    first.stop()
    second.stop()


def _hammer(servers, fn, calls: int):
    """Run fn(client, i) for i in range(calls), spread over threads and both servers."""
    clients = [servers[t % len(servers)].client() for t in range(THREADS)]
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(lambda i: fn(clients[i % THREADS], i), range(calls)))


def test_concurrent_registrations_of_one_family_get_distinct_gapless_revisions(two_servers):
    revisions = _hammer(two_servers, lambda ecs, i: ecs.register_task_definition(
        family="racy", containerDefinitions=[{"name": "c", "image": f"img-{i}", "memory": 64}]
    )["taskDefinition"]["revision"], 60)
    assert sorted(revisions) == list(range(1, 61))
    listed = two_servers[0].client().list_task_definitions(familyPrefix="racy", maxResults=100)
    assert len(listed["taskDefinitionArns"]) == 60


def test_concurrent_tagging_of_one_cluster_loses_no_update(two_servers):
    ecs = two_servers[0].client()
    arn = ecs.create_cluster(clusterName="tagged")["cluster"]["clusterArn"]
    _hammer(two_servers, lambda c, i: c.tag_resource(resourceArn=arn, tags=[{"key": f"k{i}", "value": "v"}]), 40)
    tags = ecs.list_tags_for_resource(resourceArn=arn)["tags"]
    assert sorted(t["key"] for t in tags) == sorted(f"k{i}" for i in range(40))


def test_concurrent_stops_of_one_task_stop_it_once(two_servers):
    ecs = two_servers[0].client()
    ecs.create_cluster(clusterName="stops")
    ecs.register_task_definition(family="stops", containerDefinitions=[{"name": "c", "image": "x", "memory": 64}])
    arn = ecs.run_task(cluster="stops", taskDefinition="stops")["tasks"][0]["taskArn"]
    _hammer(two_servers, lambda c, i: c.stop_task(cluster="stops", task=arn), 24)
    states = [e["detail"]["lastStatus"] for e in two_servers[1].events() if e["resources"] == [arn]]
    assert states == ["PENDING", "STOPPED"]


def test_a_tailing_reader_sees_every_event_exactly_once_while_writers_race(two_servers):
    ecs = two_servers[0].client()
    ecs.create_cluster(clusterName="tail")
    ecs.register_task_definition(family="tail", containerDefinitions=[{"name": "c", "image": "x", "memory": 64}])
    start = two_servers[0].events()
    cursor = start[-1]["id"] if start else None  # `after` takes an event id or a cursor

    seen: list[str] = []
    done = threading.Event()

    def tail():
        nonlocal cursor
        reader = two_servers[1]
        while True:
            finished = done.is_set()
            page = reader.events_page(cursor, limit=50)
            seen.extend(e["id"] for e in page["events"])
            cursor = page["cursor"]
            if finished and not page["events"]:
                return

    reader = threading.Thread(target=tail)
    reader.start()
    _hammer(two_servers, lambda c, i: c.run_task(cluster="tail", taskDefinition="tail", count=2), 120)
    done.set()
    reader.join(60)

    all_events = [e["id"] for e in two_servers[0].events()][len(start):]
    assert len(all_events) == 240
    assert len(seen) == len(set(seen)), "no event twice"
    assert set(seen) == set(all_events), "no event skipped"


def test_one_client_token_sent_to_both_servers_at_once_makes_one_task(two_servers):
    ecs = two_servers[0].client()
    ecs.create_cluster(clusterName="token")
    ecs.register_task_definition(family="token", containerDefinitions=[{"name": "c", "image": "x", "memory": 64}])
    arns = _hammer(two_servers, lambda c, i: c.run_task(cluster="token", taskDefinition="token",
                                                        clientToken="same-token")["tasks"][0]["taskArn"], 16)
    assert len(set(arns)) == 1
    assert ecs.list_tasks(cluster="token")["taskArns"] == arns[:1]
