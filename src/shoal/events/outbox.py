"""The transactional outbox: events are rows written in the transaction of the change they
report, and read back in a commit-consistent order with a resumable cursor.

Ordering. A reader that pages by a plain auto-increment id can skip a row: with concurrent
writers, id 7 may commit after id 8 has been read. So each row also records the id of the
transaction that wrote it (`txid`, PostgreSQL's xid8; 0 on SQLite, whose single writer commits in
`seq` order anyway). Readers order by (txid, seq) and only return rows whose transaction id is
below the oldest transaction still in flight (`pg_snapshot_xmin`). Every transaction that could
still add rows has a txid at or above that horizon, so nothing can appear behind the cursor.

The cursor is the string "<txid>.<seq>" of the last event returned.
"""

from __future__ import annotations


from sqlalchemy import Connection, and_, insert, or_, select, text

from shoal import jsonio
from shoal.domain.errors import InvalidParameter
from shoal.events.envelope import envelope
from shoal.store.prepared import Prepared
from shoal.store.tables import events

_INSERT = Prepared(insert(events))  # every state change writes one: see shoal.store.prepared


def append(conn: Connection, detail_type: str, resources: list[str], detail: dict, *,
           region: str, account: str, now: float, **fields) -> dict:
    env = envelope(detail_type, resources, detail, region=region, account=account, now=now, **fields)
    _INSERT.run(conn, {"event_id": env["id"], "detail_type": detail_type, "time": env["time"],
                           "envelope": jsonio.dumps(env)})
    return env


def append_many(conn: Connection, detail_type: str, items: list[tuple[list[str], dict]], *,
                region: str, account: str, now: float) -> list[dict]:
    """`append` for several events of one type (resources, detail), in order, in one statement."""
    envs = [envelope(detail_type, resources, detail, region=region, account=account, now=now)
            for resources, detail in items]
    _INSERT.run_many(conn, [{"event_id": env["id"], "detail_type": detail_type, "time": env["time"],
                             "envelope": jsonio.dumps(env)} for env in envs])
    return envs


def parse_cursor(cursor: str | None) -> tuple[int, int]:
    if not cursor:
        return (0, 0)
    try:
        txid, seq = cursor.split(".")
        return int(txid), int(seq)
    except ValueError:
        raise InvalidParameter(f"Invalid cursor '{cursor}': expected '<txid>.<seq>'.") from None


def cursor_of_event(conn: Connection, event_id: str) -> str:
    row = conn.execute(select(events.c.txid, events.c.seq).where(events.c.event_id == event_id)).first()
    if row is None:
        raise InvalidParameter(f"No event with id '{event_id}'.")
    return f"{row.txid}.{row.seq}"


def _horizon(conn: Connection) -> int:
    """The oldest transaction still in flight (PostgreSQL): rows below it can no longer appear."""
    return conn.execute(text("SELECT (pg_snapshot_xmin(pg_current_snapshot())::text)::bigint")).scalar_one()


def end_cursor(conn: Connection) -> str:
    """A cursor after every event that is already settled: a reader starting there misses nothing
    committed later."""
    stmt = select(events.c.txid, events.c.seq)
    if conn.dialect.name == "postgresql":
        stmt = stmt.where(events.c.txid < _horizon(conn))
    row = conn.execute(stmt.order_by(events.c.txid.desc(), events.c.seq.desc()).limit(1)).first()
    return f"{row.txid}.{row.seq}" if row else "0.0"


def read(conn: Connection, after: str | None, limit: int) -> tuple[list[dict], str]:
    """Events after the cursor, oldest first, and the cursor to resume from."""
    txid, seq = parse_cursor(after)
    stmt = select(events.c.txid, events.c.seq, events.c.envelope).where(
        or_(events.c.txid > txid, and_(events.c.txid == txid, events.c.seq > seq))
    )
    if conn.dialect.name == "postgresql":
        stmt = stmt.where(events.c.txid < _horizon(conn))
    rows = conn.execute(stmt.order_by(events.c.txid, events.c.seq).limit(limit)).all()
    next_cursor = f"{rows[-1].txid}.{rows[-1].seq}" if rows else f"{txid}.{seq}"
    return [jsonio.loads(r.envelope) for r in rows], next_cursor
