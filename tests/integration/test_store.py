"""The store's writer: group commit with per-unit savepoints, retries, and the outbox order."""

import threading

import pytest
from sqlalchemy import func, insert, select

from shoal.domain.errors import InvalidParameter
from shoal.events import outbox
from shoal.store.db import StaleWrite, Store
from shoal.store.tables import clusters
from tests.support import database_url_for


@pytest.fixture
def store(backend, tmp_path):
    s = Store(database_url_for(backend) or f"sqlite:///{tmp_path / 'store.db'}")
    s.migrate()
    yield s
    s.close()


def _add_cluster(name: str, fail: bool = False):
    def unit(conn):
        conn.execute(insert(clusters).values(name=name, arn=f"arn:{name}", status="ACTIVE", version=1, doc="{}"))
        outbox.append(conn, "Test", [f"arn:{name}"], {}, region="local", account="0", now=0)
        if fail:
            raise InvalidParameter(f"{name} is rejected after writing")
        return name

    return unit


def test_a_failing_unit_leaves_no_trace_and_does_not_disturb_its_batch(store):
    # Hold the writer while the units queue up, so that they are taken as one batch.
    release = threading.Event()
    store.submit(lambda conn: release.wait(10))
    futures = [store.submit(_add_cluster(f"c{i}", fail=i % 3 == 0)) for i in range(30)]
    release.set()
    outcomes = []
    for f in futures:
        try:
            outcomes.append(f.result(10))
        except InvalidParameter:
            outcomes.append(None)
    assert outcomes == [None if i % 3 == 0 else f"c{i}" for i in range(30)]
    names = store.read_sync(lambda c: set(c.execute(select(clusters.c.name)).scalars()))
    assert names == {f"c{i}" for i in range(30) if i % 3}
    events, _ = store.read_sync(lambda c: outbox.read(c, None, 100))
    assert [e["resources"][0] for e in events] == [f"arn:c{i}" for i in range(30) if i % 3]


def test_a_unit_that_loses_a_race_is_run_again_from_scratch(store):
    attempts = []

    def flaky(conn):
        attempts.append(1)
        conn.execute(insert(clusters).values(name="flaky", arn="arn:flaky", status="ACTIVE", version=1, doc="{}"))
        if len(attempts) < 3:
            raise StaleWrite("someone else won")
        return "ok"

    assert store.submit(flaky).result(10) == "ok"
    assert len(attempts) == 3
    assert store.read_sync(lambda c: c.execute(select(func.count()).select_from(clusters)).scalar_one()) == 1


def test_concurrent_submitters_all_commit_and_events_follow_commit_order(store):
    def submit_many(t):
        for i in range(25):
            store.submit(_add_cluster(f"t{t}-{i}")).result(10)

    threads = [threading.Thread(target=submit_many, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events, cursor = store.read_sync(lambda c: outbox.read(c, None, 1000))
    assert len(events) == 100 and len({e["id"] for e in events}) == 100
    # Each submitter's events appear in the order its calls returned.
    for t in range(4):
        mine = [e["resources"][0] for e in events if e["resources"][0].startswith(f"arn:t{t}-")]
        assert mine == [f"arn:t{t}-{i}" for i in range(25)]
    assert store.read_sync(lambda c: outbox.read(c, cursor, 10))[0] == []
