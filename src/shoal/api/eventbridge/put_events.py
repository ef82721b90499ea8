"""PutEvents and TestEventPattern.

Events put by users go into the same outbox as shoal's own, in the same transaction as nothing
else, so they flow through the same rules with the same delivery guarantees. Each entry succeeds
or fails on its own, as on AWS; sources under `aws.` and `shoal.` are reserved, so nobody can
forge a shoal event.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from shoal.api.eventbridge.rules import check_pattern, invalid
from shoal.api.operations import Context, eventbridge
from shoal.events.patterns import compile_pattern

MAX_ENTRY_BYTES = 256 * 1024
RESERVED_SOURCES = ("aws.", "shoal.")


def _failure(code: str, message: str) -> dict:
    return {"ErrorCode": code, "ErrorMessage": message}


def _time(value) -> str | None:
    if value is None:
        return None
    when = datetime.fromtimestamp(value, tz=timezone.utc) if isinstance(value, (int, float)) else None
    return when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else None


def _put(ctx: Context, entry: dict) -> dict:
    for field in ("Source", "DetailType", "Detail"):
        if not entry.get(field):
            return _failure("InvalidArgument", f"Parameter {field} is not valid. Reason: {field} is a required "
                                               "argument.")
    if entry["Source"].startswith(RESERVED_SOURCES):
        return _failure("NotAuthorizedForSourceException", f"Not authorized for the source {entry['Source']}.")
    if entry.get("EventBusName") not in (None, "default"):
        return _failure("InvalidArgument", f"Event bus {entry['EventBusName']} does not exist.")
    if len(json.dumps(entry)) > MAX_ENTRY_BYTES:
        return _failure("InvalidArgument", "Event size exceeds 256 KB.")
    try:
        detail = json.loads(entry["Detail"])
    except ValueError:
        detail = None
    if not isinstance(detail, dict):
        return _failure("MalformedDetail", "Detail is malformed.")
    event = ctx.emit(entry["DetailType"], list(entry.get("Resources", [])), detail, source=entry["Source"],
                     time=_time(entry.get("Time")))
    return {"EventId": event["id"]}


@eventbridge.op("PutEvents")
def put_events(ctx: Context, req: dict) -> dict:
    results = [_put(ctx, entry) for entry in req["Entries"]]
    return {"FailedEntryCount": sum("ErrorCode" in r for r in results), "Entries": results}


@eventbridge.op("TestEventPattern", write=False)
def test_event_pattern(ctx: Context, req: dict) -> dict:
    check_pattern(req["EventPattern"])
    try:
        event = json.loads(req["Event"])
    except ValueError:
        event = None
    if not isinstance(event, dict):
        raise invalid("Parameter Event is not valid.")
    return {"Result": compile_pattern(req["EventPattern"]).matches(event)}
