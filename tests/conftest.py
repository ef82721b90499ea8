"""Shared fixtures: real server processes on real databases, and real clients.

`backend` runs each test that uses it against SQLite and against PostgreSQL (from
SHOAL_TEST_POSTGRES_URL). Without that variable the PostgreSQL cases are skipped and say why.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine

from shoal.store.db import Store
from tests.support import POSTGRES_URL, ServerProcess, database_url_for

BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.skipif(
        not POSTGRES_URL, reason="SHOAL_TEST_POSTGRES_URL is not set (.ci/run starts a PostgreSQL and sets it)")),
]


@pytest.fixture(params=BACKENDS, scope="module")
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    """One server per test module and backend; tests use their own cluster names."""
    data_dir = tmp_path_factory.mktemp(f"shoal-{backend}")
    srv = ServerProcess(data_dir, database_url_for(backend)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def ecs(server):
    return server.client("ecs")


@pytest.fixture
def unique():
    return lambda prefix="c": f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def db(server):
    """A Store on the server's own database: units of work for what only a reconciler writes
    (action-log entries, alarms), run the way the server runs them."""
    store = Store(server.database_url)
    yield store
    store.close()


@pytest.fixture(scope="module")
def engine(server):
    """The server's own database, for rows only a reconciler or an agent would write."""
    eng = create_engine(server.database_url, connect_args={"timeout": 30} if not server.db_url else {})
    yield eng
    eng.dispose()
