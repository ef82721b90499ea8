"""`shoal actions list`: a cluster's action log (what shoal did and why), oldest first."""

from __future__ import annotations

import json
import math
import re
import time
from datetime import datetime, timezone
from typing import Annotated, Optional

import typer

from shoal.cli import client
from shoal.cli.client import fail

app = typer.Typer(no_args_is_help=True, help="Read a cluster's action log: what shoal did and why.")
RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
PAGE = 1000  # the largest page the server gives (shoal.events.action_log.MAX_PAGE)


def since_epoch(value: str, now: float | None = None) -> float:
    """`--since`: a duration back from now (`90s`, `10m`, `1h`, `2d`, by this machine's clock), an
    ISO 8601 time (UTC unless it has an offset) or epoch seconds; ValueError if none of those.
    The server gets epoch seconds: an ISO time's `+` or space would need query escaping."""
    m = RELATIVE.match(value.strip())
    if m:
        return (time.time() if now is None else now) - float(m.group(1)) * UNIT_S[m.group(2)]
    try:
        epoch = float(value)
    except ValueError:
        moment = datetime.fromisoformat(value.strip())
        return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    if not math.isfinite(epoch):
        raise ValueError(value)
    return epoch


def _line(entry: dict) -> str:
    detail = json.dumps(entry["detail"], separators=(",", ":"))
    return (f"{entry['timestamp']}  {entry['logLevel']:<5}  {entry['eventName']:<36} "
            f"{entry['actionSourceId']}  {detail}")


@app.command("list")
def list_actions(
    cluster: Annotated[str, typer.Option(help="The cluster (name or ARN).")],
    daemon: Annotated[Optional[str], typer.Option(help="Only the entries about this daemon (name or ARN).")] = None,
    since: Annotated[Optional[str], typer.Option(
        help="Only entries from this time on: ISO 8601 (e.g. 2025-06-01T12:00:00Z) or a duration back "
             "from now (30s, 10m, 1h, 2d).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON array of entries, oldest first.")] = False,
) -> None:
    """List a cluster's action-log entries, oldest first."""
    params = {"cluster": cluster, "daemon": daemon, "limit": PAGE}
    if since is not None:
        try:
            params["since"] = repr(since_epoch(since))
        except ValueError:
            fail(f"invalid --since {since!r}: an ISO 8601 time, epoch seconds, or a duration such as 10m or 1h", 2)
    entries: list[dict] = []
    while True:
        page = client.call("GET", "/v1/action-logs", params)
        entries.extend(page["entries"])
        if page["next"] is None:
            break
        params["after"] = page["next"]
    if as_json:
        typer.echo(json.dumps(entries, indent=2))
        return
    for entry in entries:
        typer.echo(_line(entry))
