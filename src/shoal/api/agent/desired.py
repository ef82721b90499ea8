"""The desired-state sequence of each host: what lets an agent's poll carry only what changed.

Each host row has a counter, `desired_seq`. A unit of work that changes what a host's agent
should run (a task placed there, a task asked to stop) moves the counter once, under the host's
row lock, and stamps the new value on each task it changed (`tasks.host_seq`). A poll that says
"I have seen up to N" gets the tasks stamped above N. The row lock orders the stamps the way the
commits are ordered, so an agent that reads the counter before the tasks never skips a change
(it may see one twice, which its reconcile ignores).

Tasks created by placement (RunTask, a service starting tasks) get theirs another way: the
counter moves when placement writes the host's allocations (same row lock), and the new rows
are inserted with it (shoal.scheduler.placement.Placer.flush).
"""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, select, update

from shoal.store.prepared import Prepared
from shoal.store.tables import container_instances as cis, tasks

_ADVANCE = Prepared(update(cis).where(cis.c.arn == bindparam("host"))
                    .values(desired_seq=cis.c.desired_seq + 1))
_READ = Prepared(select(cis.c.desired_seq).where(cis.c.arn == bindparam("host")))
_STAMP = Prepared(update(tasks).where(tasks.c.arn == bindparam("task")).values(host_seq=bindparam("seq")))


def advance(conn: Connection, host: str) -> int | None:
    """Move the host's counter; its new value, or None if the host row is gone."""
    if _ADVANCE.run(conn, {"host": host}) != 1:
        return None
    return _READ.first(conn, {"host": host}).desired_seq


def record(conn: Connection, changes: dict[str, set[str]]) -> None:
    """Stamp the changed tasks of each host with the host's next sequence number. Hosts in
    ARN order, as placement locks them."""
    for host in sorted(changes):
        seq = advance(conn, host)
        if seq is None:
            continue  # the host row is gone: no agent will ask
        _STAMP.run_many(conn, [{"task": task, "seq": seq} for task in sorted(changes[host])])
