"""Named shoal alarms: the stand-in for the CloudWatch alarms that ECS daemon deployments watch
(`DaemonAlarmConfiguration.alarmNames`, ecs-semantics §1.6). An operator or a monitoring system
sets an alarm's state through the API (`shoal alarm set NAME ALARM|OK`); a deployment that
watches it rolls back when it goes into ALARM.

An alarm exists from its first set. One never set is INSUFFICIENT_DATA, which never trips a
deployment. Alarms belong to no cluster, emit no event and write no action-log entry (that log
is per cluster); the deployment that trips on one logs that.

Alarms live here rather than in shoal.domain because they are stored state (domain code never
imports the store).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable

from sqlalchemy import Connection, insert, select

from shoal.domain.errors import InvalidParameter
from shoal.events.envelope import iso
from shoal.store.db import update_versioned
from shoal.store.tables import alarms

if TYPE_CHECKING:
    from shoal.api.operations import Context

ALARM, OK, INSUFFICIENT_DATA = "ALARM", "OK", "INSUFFICIENT_DATA"
STATES = (ALARM, OK, INSUFFICIENT_DATA)  # CloudWatch's SetAlarmState accepts the same three
NAME = re.compile(r"^[A-Za-z0-9._:-]{1,255}$")
MAX_REASON = 1023  # as CloudWatch's StateReason


def check(name: str, state: str, reason: str) -> None:
    """Raise InvalidParameter naming the field that is wrong."""
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidParameter("Invalid parameter 'name': an alarm name has 1 to 255 letters, digits, "
                               "'.', '_', ':' or '-'.")
    if state not in STATES:
        raise InvalidParameter(f"Invalid parameter 'state': {str(state)[:64]!r} is not one of "
                               f"{', '.join(STATES)}.")
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise InvalidParameter(f"Invalid parameter 'reason': a string of at most {MAX_REASON} characters.")


def set_state(ctx: Context, name: str, state: str, reason: str = "") -> dict:
    """Set alarm `name` to `state` (creating it on its first set); return it as `describe` does.

    Setting the state it already has only updates the reason: the alarm did not enter that
    state again, so `entered_alarm_at` stays."""
    check(name, state, reason)
    row = ctx.conn.execute(select(alarms).where(alarms.c.name == name).with_for_update()).first()
    if state == ALARM and (row is None or row.state != ALARM):
        entered = ctx.now  # it enters ALARM now
    else:
        entered = row.entered_alarm_at if row is not None else None
    values = {"state": state, "reason": reason, "updated_at": ctx.now, "entered_alarm_at": entered}
    if row is None:
        # Two first sets racing: the loser hits the primary key and the store runs it again.
        ctx.conn.execute(insert(alarms).values(name=name, version=1, **values))
    else:
        update_versioned(ctx.conn, alarms, {"name": name}, row.version, **values)
    return _doc({"name": name, **values})


def states(conn: Connection, names: Iterable[str]) -> dict[str, str]:
    """The state of each alarm named; INSUFFICIENT_DATA for one never set."""
    names = list(dict.fromkeys(names))
    found = dict(conn.execute(select(alarms.c.name, alarms.c.state).where(alarms.c.name.in_(names))).all()) \
        if names else {}
    return {name: found.get(name, INSUFFICIENT_DATA) for name in names}


def tripped(conn: Connection, names: Iterable[str], since: float) -> list[str]:
    """The alarms among `names` that went into ALARM at or after epoch `since` (a deployment's
    start), whatever their state now. One already in ALARM at `since` is ignored until it leaves
    ALARM and enters it again (ecs-semantics §1.6)."""
    names = list(dict.fromkeys(names))
    if not names:
        return []
    return list(conn.execute(select(alarms.c.name).where(alarms.c.name.in_(names),
                                                        alarms.c.entered_alarm_at >= since)
                             .order_by(alarms.c.name)).scalars())


def describe(conn: Connection, name: str | None = None) -> list[dict]:
    """Every alarm (or the one named), by name."""
    stmt = select(alarms).order_by(alarms.c.name)
    if name is not None:
        stmt = stmt.where(alarms.c.name == name)
    return [_doc(row._mapping) for row in conn.execute(stmt)]


def _doc(values) -> dict:
    entered = values["entered_alarm_at"]
    return {"name": values["name"], "state": values["state"], "reason": values["reason"],
            "updatedAt": iso(values["updated_at"]), "enteredAlarmAt": iso(entered) if entered is not None else None}
