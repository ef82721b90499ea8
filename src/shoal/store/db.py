"""The store: one SQLAlchemy engine, a single writer thread with group commit, and readers.

Writes are units of work (`fn(conn) -> result`) queued to one writer thread. The writer takes
every unit waiting, runs each inside its own SAVEPOINT of one transaction, commits once, and only
then answers the callers: an API call that returns 200 has committed, and one fsync covers the
whole batch. A unit that raises is rolled back to its savepoint and leaves no trace, without
disturbing its neighbours. On SQLite that single writer is also what makes the event sequence
follow commit order. On PostgreSQL several server processes may write at once: row locks,
optimistic versions (`StaleWrite`) and unique constraints catch the races, and the losing unit
is run again from scratch in the next batch.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from sqlalchemy import Connection, Table, create_engine, event, update
from sqlalchemy.engine import make_url

from shoal.domain.errors import ServerError


T = TypeVar("T")
log = logging.getLogger(__name__)

WRITE_ATTEMPTS = 8
READERS = 4  # reader threads (PostgreSQL only; SQLite reads run inline)
MAX_BATCH = 64
CACHE_KIB = 32 * 1024  # SQLite: page cache per connection, in KiB
# SQLite: the writer copies the write-ahead log into the database once it holds this many pages
# (default 1000, 4 MiB). Less often means fewer copies of the pages every unit rewrites (hosts,
# index pages, the end of the event table).
WAL_CHECKPOINT_PAGES = 10_000


@dataclass
class _Unit:
    fn: Callable[[Connection], object]
    future: Future
    attempts: int = 0


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


def _sqlite_engine(url: str, immediate: bool):
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy's begin event issue BEGIN itself (pysqlite's implicit BEGIN is deferred
        # and would upgrade to a write lock mid-transaction, which can deadlock two processes).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")  # a commit that answered 200 survives a power cut
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        # Placement compares every host's version with its table every 2 s, and polls and
        # reports read hosts and tasks all over the file: with SQLite's default 2 MiB page cache
        # a fleet of 10,000 hosts was read back from the OS one page (one pread) at a time.
        # (Mapping the file into memory instead did no better and doubled the RSS.)
        cur.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        cur.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        cur.close()

    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        # On the DBAPI connection itself: through `exec_driver_sql` this statement cost a third
        # of a whole read transaction (execution context, result set-up, events), and every
        # agent poll and every read API call begins one.
        conn.connection.dbapi_connection.execute(begin).close()

    return engine


def _direct_savepoints(engine) -> None:
    """The writer runs every unit of work in a savepoint: issue SAVEPOINT, RELEASE and ROLLBACK
    TO on the DBAPI connection rather than through `Connection.execute` (a compiled statement
    and its result machinery, twice a unit, for three words of SQL). SQLAlchemy still tracks the
    savepoints and fires its events; only the statement's way to the driver changes."""

    def run(conn: Connection, sql: str) -> None:
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            cursor.execute(sql)
        finally:
            cursor.close()

    dialect = engine.dialect  # each engine has its own dialect object
    dialect.do_savepoint = lambda conn, name: run(conn, f"SAVEPOINT {name}")
    dialect.do_release_savepoint = lambda conn, name: run(conn, f"RELEASE SAVEPOINT {name}")
    dialect.do_rollback_to_savepoint = lambda conn, name: run(conn, f"ROLLBACK TO SAVEPOINT {name}")


class Store:
    def __init__(self, url: str):
        self.url = url
        self.dialect = make_url(url).get_backend_name()
        if self.dialect == "sqlite":
            db_path = make_url(url).database
            if db_path and db_path != ":memory:":
                Path(db_path).parent.mkdir(parents=True, exist_ok=True)
            self.write_engine = _sqlite_engine(url, immediate=True)
            self.read_engine = _sqlite_engine(url, immediate=False)
        else:
            self.write_engine = create_engine(url, pool_pre_ping=True, pool_size=2)
            self.read_engine = create_engine(url, pool_pre_ping=True, pool_size=READERS)
        _direct_savepoints(self.write_engine)
        self._queue: queue.SimpleQueue[_Unit | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._writer_loop, name="shoal-writer", daemon=True)
        self._writer.start()
        self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="shoal-reader")

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    def migrate(self) -> None:
        from shoal.store.migrate import upgrade

        upgrade(self.write_engine)

    # -- units of work -------------------------------------------------------------------
    def submit(self, fn: Callable[[Connection], T]) -> Future:
        future: Future = Future()
        self._queue.put(_Unit(fn, future))
        return future

    def read_sync(self, fn: Callable[[Connection], T], snapshot: bool = True) -> T:
        # One transaction per read: a single snapshot on SQLite (PostgreSQL's READ COMMITTED takes
        # one per statement, which is enough for a single describe or list).
        if not snapshot:
            with self.read_engine.connect() as conn:
                return fn(conn)
        with self.read_engine.connect() as conn, conn.begin():
            return fn(conn)

    def _writer_loop(self) -> None:
        conn = None  # the writer keeps one connection; a broken one is replaced
        while True:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(unit is None for unit in batch)  # close(): finish what was queued, then stop
            units = [u for u in batch if u is not None and self._still_wanted(u)]
            try:
                if conn is None or conn.invalidated or conn.closed:
                    conn = self.write_engine.connect()
                self._run_batch(conn, units)
            except Exception as err:  # e.g. the database is unreachable: fail these, keep serving
                log.error("write batch failed: %s", err)
                conn = None
                for unit in units:
                    if not unit.future.done():
                        unit.future.set_exception(err)
            if stop:
                if conn is not None:
                    conn.close()
                return

    def _run_batch(self, conn: Connection, batch: list[_Unit]) -> None:
        if not batch:
            return
        done: list[tuple[_Unit, object, BaseException | None]] = []
        again: list[_Unit] = []
        try:
            transaction = conn.begin()
            for unit in batch:
                savepoint = conn.begin_nested()
                try:
                    result = unit.fn(conn)
                    savepoint.commit()
                    done.append((unit, result, None))
                except Exception as err:
                    savepoint.rollback()
                    if self._retryable(err) and unit.attempts + 1 < WRITE_ATTEMPTS:
                        again.append(unit)
                    else:
                        done.append((unit, None, err))
        except Exception as err:  # before COMMIT: nothing applied, so every unit may run again
            log.warning("batch of %d writes failed before commit: %s", len(batch), err)
            self._rollback_quietly(conn)
            again = [u for u in batch if u.attempts + 1 < WRITE_ATTEMPTS]
            done = [(u, None, err) for u in batch if u.attempts + 1 >= WRITE_ATTEMPTS]
        else:
            try:
                transaction.commit()
            except Exception as err:
                # A connection lost during COMMIT leaves the outcome unknown: never apply a unit
                # twice on our own. Callers see a server error; a RunTask retried with its
                # clientToken is deduplicated.
                log.error("commit of %d writes failed: %s", len(batch), err)
                self._rollback_quietly(conn)
                failure = ServerError("The write could not be committed; it may or may not have applied.")
                done, again = [(u, None, failure) for u in batch], []
        for unit, result, err in done:
            if err is None:
                unit.future.set_result(result)
            else:
                unit.future.set_exception(err)
        if again:  # back off without holding up the writer for everyone else
            for unit in again:
                unit.attempts += 1
            timer = threading.Timer(min(0.005 * 2 ** again[0].attempts, 0.2),
                                    lambda: [self._queue.put(u) for u in again])
            timer.daemon = True
            timer.start()

    @staticmethod
    def _still_wanted(unit: _Unit) -> bool:
        """False for a unit whose caller went away (request cancelled) before it ran."""
        return unit.attempts > 0 or unit.future.set_running_or_notify_cancel()

    @staticmethod
    def _rollback_quietly(conn: Connection) -> None:
        try:
            conn.rollback()
            # A COMMIT the database refused (a deferred constraint) leaves the transaction open
            # in the driver while SQLAlchemy counts it as ended: end it there too, or the next
            # BEGIN (issued on the DBAPI connection: see _sqlite_engine) finds it still open.
            conn.connection.dbapi_connection.rollback()
        except Exception:  # the connection is gone; the writer loop replaces it
            conn.invalidate()

    def _retryable(self, err: Exception) -> bool:
        """A lost race: a stale version, a unique key taken meanwhile, a serialization failure
        or deadlock (PostgreSQL), a busy database (SQLite). Prepared statements raise the
        driver's own exceptions, so both SQLAlchemy's wrappers and the DBAPI's are recognised."""
        if isinstance(err, StaleWrite):
            return True
        orig = getattr(err, "orig", err)
        dbapi = self.write_engine.dialect.dbapi
        if isinstance(orig, dbapi.IntegrityError):
            return True
        return getattr(orig, "sqlstate", None) in ("40001", "40P01") or "database is locked" in str(orig)

    # -- asynchronous front doors for the ASGI app --------------------------------------
    async def write(self, fn: Callable[[Connection], T]) -> T:
        return await asyncio.wrap_future(self.submit(fn))

    async def read(self, fn: Callable[[Connection], T], *, snapshot: bool = True) -> T:
        """Run `fn(conn)` on a reader connection. `snapshot=False`: its statements need not see
        one state of the database (each sees the latest commit), so no transaction is begun
        around them when they are prepared statements (shoal.store.prepared); a statement run
        through SQLAlchemy still begins one, ended when the connection goes back to the pool."""
        if not self.is_postgres:
            # A SQLite read is in-process and takes well under a millisecond, and WAL readers
            # never wait for the writer: a hop to a reader thread costs more than the read.
            return self.read_sync(fn, snapshot)
        return await asyncio.get_running_loop().run_in_executor(self._readers, self.read_sync, fn, snapshot)

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join()
        self._readers.shutdown(wait=True)
        self.write_engine.dispose()
        self.read_engine.dispose()
