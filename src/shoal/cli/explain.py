"""`shoal explain recovery`: who detects a fault on each capacity provider's hosts, what is
done about it and by whom, the rate limits, and where task resumption ends — from the live
configuration (GET /v1/explain/recovery; shoal.control.recovery)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from shoal.cli import client

app = typer.Typer(no_args_is_help=True, help="Explain what shoal does, from the live configuration.")


@app.command("recovery")
def recovery(
    cluster: Annotated[str, typer.Option(help="The cluster (name or ARN).")] = "default",
    capacity_provider: Annotated[Optional[str], typer.Option(help="Only this capacity provider.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object keyed by capacity provider name.")] = False,
) -> None:
    """Per capacity provider: detectors and thresholds, the action and who takes it, rate limits,
    and where task resumption ends."""
    found = client.call("GET", "/v1/explain/recovery", {"cluster": cluster, "capacityProvider": capacity_provider})
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    for name, p in found.items():
        kind = "managed" if p["managed"] else "self-managed"
        typer.echo(f"{name}  ({kind}; auto repair {p['autoRepair']})")
        typer.echo("  DETECTS")
        for d in p["detectors"]:
            typer.echo(f"    {d['check']:<20} {d['fault']}")
            typer.echo(f"    {'':<20} by {d['detector']}; {d['threshold']}")
        daemons = ", ".join(f"{d['name']} ({'critical' if d['critical'] else 'non-critical'})"
                            for d in p["detectors"][0]["daemons"]) or "none"
        typer.echo(f"  DAEMONS      {daemons}")
        typer.echo(f"  ACTS         {p['action']['by']}: {p['action']['what']}")
        if p["rateLimit"]:
            r = p["rateLimit"]
            typer.echo(f"  RATE LIMIT   at most {r['maxDrainingAtOnce']} of {r['hosts']} host(s) draining at once "
                       f"({r['rule']}); a host is not repaired twice within {r['coolDownSeconds']:g} s")
        typer.echo(f"  RESUMPTION   {p['taskResumption']}")
        typer.echo("")
