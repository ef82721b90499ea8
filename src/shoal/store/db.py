"""The store: one SQLAlchemy engine, a single writer thread, and a pool of readers.

Writes run one at a time on a dedicated thread, each in its own transaction, so an API call
that returns 200 has committed. On SQLite that single writer is what makes the event sequence
follow commit order; on PostgreSQL several server processes may write at once, and row locks,
optimistic versions (`StaleWrite`) and unique constraints catch the races, after which the whole
unit of work is retried from scratch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, TypeVar

from sqlalchemy import Connection, Table, create_engine, event, exc, update
from sqlalchemy.engine import make_url

from shoal.domain.errors import ServerError

T = TypeVar("T")
log = logging.getLogger(__name__)

WRITE_ATTEMPTS = 8


class StaleWrite(Exception):
    """A row changed between our read and our write; the unit of work is retried."""


def update_versioned(conn: Connection, table: Table, key: dict, version: int, **values) -> int:
    """Write `values` only if the row still has `version`; return the new version."""
    stmt = update(table).values(version=version + 1, **values)
    for col, val in key.items():
        stmt = stmt.where(table.c[col] == val)
    if conn.execute(stmt.where(table.c.version == version)).rowcount != 1:
        raise StaleWrite(f"{table.name} {key} changed concurrently")
    return version + 1


def _sqlite_engine(url: str, synchronous: str, immediate: bool):
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy's begin event issue BEGIN itself (pysqlite's implicit BEGIN is deferred
        # and would upgrade to a write lock mid-transaction, which can deadlock two processes).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


class Store:
    def __init__(self, url: str, *, sqlite_synchronous: str = "FULL", readers: int = 4):
        self.url = url
        self.dialect = make_url(url).get_backend_name()
        if self.dialect == "sqlite":
            db_path = make_url(url).database
            if db_path and db_path != ":memory:":
                Path(db_path).parent.mkdir(parents=True, exist_ok=True)
            self.write_engine = _sqlite_engine(url, sqlite_synchronous, immediate=True)
            self.read_engine = _sqlite_engine(url, sqlite_synchronous, immediate=False)
        else:
            self.write_engine = create_engine(url, pool_pre_ping=True, pool_size=2)
            self.read_engine = create_engine(url, pool_pre_ping=True, pool_size=readers)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="shoal-writer")
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="shoal-reader")

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    def migrate(self) -> None:
        from shoal.store.migrate import upgrade

        upgrade(self.write_engine)

    # -- synchronous units of work ------------------------------------------------------
    def write_sync(self, fn: Callable[[Connection], T]) -> T:
        delay = 0.005
        for attempt in range(WRITE_ATTEMPTS):
            try:
                with self.write_engine.begin() as conn:
                    return fn(conn)
            except (StaleWrite, exc.IntegrityError, exc.OperationalError) as err:
                if not self._retryable(err) or attempt == WRITE_ATTEMPTS - 1:
                    raise
                log.debug("retrying unit of work after %s", err)
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        raise ServerError("unreachable")

    def read_sync(self, fn: Callable[[Connection], T]) -> T:
        with self.read_engine.connect() as conn:
            return fn(conn)

    def _retryable(self, err: Exception) -> bool:
        if isinstance(err, StaleWrite | exc.IntegrityError):
            return True
        # PostgreSQL serialization failure / deadlock; SQLite "database is locked".
        code = getattr(getattr(err, "orig", None), "sqlstate", None)
        return code in ("40001", "40P01") or "database is locked" in str(err)

    # -- asynchronous front doors for the ASGI app --------------------------------------
    async def write(self, fn: Callable[[Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._writer, self.write_sync, fn)

    async def read(self, fn: Callable[[Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._readers, self.read_sync, fn)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        self.write_engine.dispose()
        self.read_engine.dispose()
