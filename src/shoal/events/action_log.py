"""The action log: a per-cluster, durable record of what shoal did and why (ECS "action logs",
ecs-semantics §1.9): daemon starts, failures, restarts, drains, replacements, waits on the repair
rate limit, deployments.

Writing. `record(ctx, …)` inserts one entry in the caller's unit of work, like an event in the
outbox: the entry commits with the change it describes, or vanishes with it.

Expected stops are not recorded. ECS filters them out of its action logs, and so does shoal: an
entry whose `detail.stopCode` is in EXPECTED_STOP_CODES ("UserInitiated": someone asked for the
stop) says nothing an operator needs to act on, and would bury the entries that do.

Reading. `query` / `page` return entries oldest first (by id) in the API's shape; `page` also
gives the id to resume after. On PostgreSQL with several writers an id can commit after a higher
one was read, so a listing that pages while entries are being written may miss such an entry;
it shows up in the next listing. (The event outbox needs a never-skipping cursor because its
router must see every event; nothing follows the action log that way.)

The JSONL sink (`FileSink`, `shoal server --action-log-file`). Each committed entry is appended to
the file as one JSON line, and only once its transaction has committed: the store runs each unit
in a SAVEPOINT of a batch transaction, so `record` keeps the entry on the connection
(`conn.info`), a unit whose savepoint rolls back takes its entries with it, and a rollback of
the whole transaction discards them all. Lines are written by a thread of the sink's own: a slow
or stuck file never holds up the store's writer (ECS delivery is fire-and-forget too).
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import weakref
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, event, insert, select

from shoal.events.envelope import iso
from shoal.store.tables import action_logs

if TYPE_CHECKING:
    from shoal.api.operations import Context

log = logging.getLogger(__name__)

LEVELS = ("INFO", "WARN", "ERROR")
EXPECTED_STOP_CODES = frozenset({"UserInitiated"})
DEFAULT_PAGE = 100
MAX_PAGE = 1000

# conn.info keys: entries recorded in the open transaction, and for each open savepoint how many
# of them were recorded before it began.
_PENDING = "shoal.action_log"
_MARKS = "shoal.action_log.savepoints"

# Engines with a sink attached. Only their connections keep entries in conn.info: on any other
# engine nothing would ever take them away again.
_sinks: weakref.WeakKeyDictionary[Engine, FileSink] = weakref.WeakKeyDictionary()


def _dumps(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":"))


def is_expected_stop(detail: dict) -> bool:
    return detail.get("stopCode") in EXPECTED_STOP_CODES


def record(ctx: Context, *, cluster: str, level: str, resource_arn: str, source_id: str, event_name: str,
           detail: dict | None = None, daemon: str | None = None) -> int | None:
    """Append an entry to `cluster`'s action log in the caller's transaction (a write unit of
    work). Returns its id, or None when it is an expected stop and so is not recorded.

    level: INFO | WARN | ERROR; resource_arn: the cluster's ARN, as in ECS; source_id: what
    acted (a daemon's ARN, `service/<cluster>/<name>`); daemon: the daemon's name, for
    `--daemon` filtering."""
    if level not in LEVELS:
        raise ValueError(f"action log level {level!r} is not one of {', '.join(LEVELS)}")
    detail = detail or {}
    if is_expected_stop(detail):
        return None
    values = {"cluster_name": cluster, "timestamp": ctx.now, "log_level": level, "resource_arn": resource_arn,
              "action_source_id": source_id, "event_name": event_name, "detail": _dumps(detail),
              "daemon_name": daemon}
    entry_id = ctx.conn.execute(insert(action_logs).values(values)).inserted_primary_key[0]
    if ctx.conn.engine in _sinks:
        # A copy of what was stored, so that a caller reusing `detail` cannot change the line.
        line = {"cluster": cluster, **_entry(values, json.loads(values["detail"]))}
        ctx.conn.info.setdefault(_PENDING, []).append(line)
    return entry_id


def page(conn: Connection, cluster: str, *, daemon: str | None = None, since: float | None = None,
         limit: int = DEFAULT_PAGE, after_id: int | None = None) -> tuple[list[dict], int | None]:
    """Up to `limit` entries of `cluster` (only `daemon`'s, only from epoch `since` on, only after
    id `after_id`), oldest first, and the id to pass as `after_id` for the rest (None: no more)."""
    stmt = select(action_logs).where(action_logs.c.cluster_name == cluster)
    if daemon is not None:
        stmt = stmt.where(action_logs.c.daemon_name == daemon)
    if since is not None:
        stmt = stmt.where(action_logs.c.timestamp >= since)
    if after_id is not None:
        stmt = stmt.where(action_logs.c.id > after_id)
    rows = conn.execute(stmt.order_by(action_logs.c.id).limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    entries = [_entry(row._mapping, json.loads(row.detail)) for row in rows]
    return entries, (rows[-1].id if more else None)


def query(conn: Connection, cluster: str, daemon: str | None = None, since: float | None = None,
          limit: int = DEFAULT_PAGE, after_id: int | None = None) -> list[dict]:
    """The entries `page` returns, without the resume id."""
    return page(conn, cluster, daemon=daemon, since=since, limit=limit, after_id=after_id)[0]


def parse_time(value: str) -> float:
    """Epoch seconds from epoch seconds or an ISO 8601 time (UTC unless it names an offset);
    ValueError if it is neither."""
    try:
        epoch = float(value)
    except ValueError:
        moment = datetime.fromisoformat(value.strip())
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    if not math.isfinite(epoch):
        raise ValueError(value)
    return epoch


def _entry(values, detail: dict) -> dict:
    """An entry in the API's shape (ECS's action log schema, with an ISO 8601 timestamp)."""
    return {"timestamp": iso(values["timestamp"]), "logLevel": values["log_level"],
            "resourceArn": values["resource_arn"], "actionSourceId": values["action_source_id"],
            "eventName": values["event_name"], "detail": detail}


# -- the JSONL sink ----------------------------------------------------------------------------

class FileSink:
    """Appends committed entries to a JSONL file, one entry (plus its `cluster`) per line."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        # Opened now, so that an unwritable path stops the server at startup rather than losing
        # entries later.
        self._file = open(path, "a", encoding="utf-8")
        self._queue: queue.SimpleQueue[list[dict] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="shoal-action-log-sink", daemon=True)
        self._thread.start()

    def attach(self, engine: Engine) -> None:
        """Write here the entries that `engine`'s transactions record and commit."""
        _sinks[engine] = self
        event.listen(engine, "savepoint", _on_savepoint)
        event.listen(engine, "release_savepoint", _on_release_savepoint)
        event.listen(engine, "rollback_savepoint", _on_rollback_savepoint)
        event.listen(engine, "rollback", _on_rollback)
        # Whatever is still pending when a transaction begins belonged to one that never
        # committed (e.g. rolled back by the pool, which fires no rollback event): drop it.
        event.listen(engine, "begin", _on_rollback)
        # SQLAlchemy's `commit` event fires *before* the COMMIT, which may still fail, and Core
        # has no after-commit event; so the sink wraps this engine's own dialect's do_commit (each
        # engine has a dialect instance of its own). It takes the entries before the COMMIT, so
        # a COMMIT that fails leaves none behind, and hands them over only once it has returned.
        dialect = engine.dialect
        inner = dialect.do_commit

        def do_commit(dbapi_connection) -> None:
            info = getattr(dbapi_connection, "info", None)
            entries = info.pop(_PENDING, None) if info is not None else None
            if info is not None:
                info.pop(_MARKS, None)
            inner(dbapi_connection)
            if entries:
                self._queue.put(entries)

        dialect.do_commit = do_commit

    def close(self) -> None:
        """Write what is queued, then close the file."""
        self._queue.put(None)
        self._thread.join(10)
        self._file.close()

    def _run(self) -> None:
        while True:
            entries = self._queue.get()
            if entries is None:
                return
            try:
                self._file.write("".join(_dumps(e) + "\n" for e in entries))
                self._file.flush()
            except (OSError, ValueError) as err:  # the database has them; the file is a copy
                log.error("could not append %d action log entries to %s: %s", len(entries), self._file.name, err)


def _on_savepoint(conn: Connection, _name) -> None:
    conn.info.setdefault(_MARKS, []).append(len(conn.info.get(_PENDING, ())))


def _on_release_savepoint(conn: Connection, _name, _context) -> None:
    marks = conn.info.get(_MARKS)
    if marks:
        marks.pop()  # its entries now belong to the enclosing transaction


def _on_rollback_savepoint(conn: Connection, _name, _context) -> None:
    marks = conn.info.get(_MARKS)
    if marks:
        del conn.info.get(_PENDING, [])[marks.pop():]


def _on_rollback(conn: Connection) -> None:  # also on begin: see FileSink.attach
    conn.info.pop(_PENDING, None)
    conn.info.pop(_MARKS, None)
