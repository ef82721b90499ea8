"""The `shoal` command line."""

from __future__ import annotations

import typer

from shoal.cli import actions, agent, alarm, catalog, chaos, daemons, demo, events, explain, logs, rules, server, sim, up

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="shoal: a self-hosted orchestrator for GPU fleets that speaks the Amazon ECS API.")
app.command("server")(server.server)
app.command("up")(up.up)
app.command("agent")(agent.agent)
app.command("logs")(logs.logs)
app.command("sim")(sim.sim)
app.command("demo")(demo.demo)
app.add_typer(events.app, name="events")
app.add_typer(rules.app, name="rules")
app.add_typer(explain.app, name="explain")
app.add_typer(catalog.app, name="catalog")
app.add_typer(actions.app, name="actions")
app.add_typer(alarm.app, name="alarm")
app.add_typer(daemons.app, name="daemons")
app.add_typer(chaos.app, name="chaos")

if __name__ == "__main__":
    app()
