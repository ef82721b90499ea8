"""`shoal alarm …`: set and list the named alarms that daemon deployments watch."""

from __future__ import annotations

import json
import re
from typing import Annotated, Optional

import typer

from shoal.cli import client
from shoal.cli.client import fail

STATES = ("ALARM", "OK", "INSUFFICIENT_DATA")  # as shoal.control.alarms.STATES
NAME = re.compile(r"[A-Za-z0-9._:-]{1,255}")  # as shoal.control.alarms.NAME (it goes into the URL path)
app = typer.Typer(no_args_is_help=True, help="Named alarms that daemon deployments watch (roll back on ALARM).")


def _line(alarm: dict) -> str:
    return f"{alarm['name']:<32} {alarm['state']:<17} {alarm['updatedAt']}  {alarm['reason']}".rstrip()


@app.command("set")
def set_alarm(
    name: Annotated[str, typer.Argument(help="The alarm's name (created on its first set).")],
    state: Annotated[str, typer.Argument(help=f"The new state: {', '.join(STATES)}.")],
    reason: Annotated[Optional[str], typer.Option(help="Why (shown by `shoal alarm list`).")] = None,
) -> None:
    """Set an alarm's state; print the alarm."""
    if not NAME.fullmatch(name):
        fail(f"invalid alarm name {name!r}: 1 to 255 letters, digits, '.', '_', ':' or '-'", 2)
    if state.upper() not in STATES:
        fail(f"invalid state {state!r}: one of {', '.join(STATES)}", 2)
    body = {"state": state.upper(), **({"reason": reason} if reason is not None else {})}
    typer.echo(_line(client.call("PUT", f"/v1/alarms/{name}", body=body)["alarm"]))


@app.command("list")
def list_alarms(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON array of alarms.")] = False,
) -> None:
    """List the alarms, by name."""
    found = client.call("GET", "/v1/alarms")["alarms"]
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    for alarm in found:
        typer.echo(_line(alarm))
