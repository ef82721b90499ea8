"""`shoal events …`: read the event log of a running server."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from shoal.cli import client

app = typer.Typer(no_args_is_help=True, help="Read shoal's event log.")
PAGE = 500


@app.command("list")
def list_events(
    since: Annotated[Optional[str], typer.Option(help="Start after this event id (or cursor).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many events.", min=1)] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON array of full envelopes.")] = False,
) -> None:
    """List events, oldest first."""
    found: list[dict] = []
    after = since
    while len(found) < limit:
        resp = client.get("/v1/events", {"after": after, "limit": min(PAGE, limit - len(found))})
        if resp.status_code != 200:
            body = resp.json() if resp.headers.get("content-type", "").startswith("application/") else {}
            typer.echo(f"error: {body.get('__type', resp.status_code)}: {body.get('message', resp.text)}", err=True)
            raise typer.Exit(1)
        page = resp.json()
        found.extend(page["events"])
        if len(page["events"]) == 0 or page["cursor"] == after:
            break
        after = page["cursor"]
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    for env in found:
        detail = env["detail"]
        state = detail.get("lastStatus") or detail.get("status") or detail.get("eventName") or ""
        resource = env["resources"][0] if env["resources"] else ""
        typer.echo(f"{env['time']}  {env['id']}  {env['detail-type']:<36} {state:<12} {resource}")
