"""`shoal daemons sli`: per daemon, its start success rate, restarts per hour, mean times to
repair and hosts without it (GET /v1/daemons/sli; definitions in shoal.control.daemon_sli)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from shoal.cli import client

app = typer.Typer(no_args_is_help=True, help="Managed daemons: service level indicators.")

COLUMNS = ("CLUSTER", "DAEMON", "STARTS", "START OK", "RESTARTS/H", "MTTR REPLACE", "MTTR RECOVER", "WITHOUT")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _row(d: dict) -> tuple[str, ...]:
    return (d["cluster"], d["daemonName"], str(d["starts"]), _percent(d["startSuccessRate"]),
            f"{d['restartsPerHour']:.2f}", _seconds(d["mttrReplaceSeconds"]), _seconds(d["mttrRecoverSeconds"]),
            str(d["hostsWithoutDaemon"]))


@app.command("sli")
def sli(
    cluster: Annotated[Optional[str], typer.Option(help="Only this cluster's daemons (name or ARN).")] = None,
    daemon: Annotated[Optional[str], typer.Option(
        help="Only this daemon (name or ARN; a name without --cluster matches it in every cluster).")] = None,
    window: Annotated[str, typer.Option(help="The window, ending now: 30m, 1h, 2d, or seconds.")] = "1h",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON array, a document per daemon.")] = False,
) -> None:
    """Start success rate, restart frequency, mean time to repair (host replaced / daemon recovered
    in place) and hosts without the daemon now, per daemon, over the window."""
    found = client.call("GET", "/v1/daemons/sli", {"cluster": cluster, "daemon": daemon, "window": window})["daemons"]
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    rows = [COLUMNS, *(_row(d) for d in found)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    for r in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
