"""`shoal sim`: a simulated fleet of hosts against a running server, until Ctrl-C."""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import time
from typing import Annotated, Optional

import typer

from shoal.cli.agent import parse_attributes


def _specs(hosts: list[str], capacity_provider: str | None, zones: list[str], attributes: dict[str, str]):
    from shoal import catalog
    from shoal.sim import HostSpec

    specs = []
    for item in hosts:
        parts = item.split(":")
        if len(parts) not in (2, 4) or not parts[0] or not all(p.isdigit() for p in parts[1:]):
            raise typer.BadParameter(f"expected TYPE:COUNT or NAME:COUNT:VCPUS:GIB, got {item!r}",
                                     param_hint="--hosts")
        name, count, shape = parts[0], int(parts[1]), [int(p) for p in parts[2:]] or [None, None]
        try:
            specs.append(HostSpec(name, count, capacity_provider, zones, attributes, *shape))
        except catalog.UnknownInstanceType as err:
            raise typer.BadParameter(str(err), param_hint="--hosts") from None
    return specs


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run(fleet, every: float) -> None:
    started = time.monotonic()
    try:
        await fleet.start()
        s = fleet.stats
        print(f"{s.registered} hosts registered in {s.registered_after:.1f}s "
              f"({s.registered / max(s.registered_after, 1e-9):.0f}/s)", flush=True)
        await fleet.wait_active()
        print(f"all {len(fleet.hosts)} hosts ACTIVE after {fleet.stats.active_after:.1f}s", flush=True)
        last_cpu, last_time = _cpu(), time.monotonic()
        while True:
            await asyncio.sleep(every)
            s, now, cpu = fleet.stats, time.monotonic(), _cpu()
            running = sum(1 for h in fleet.hosts for t in h.tasks.values() if t.status == "RUNNING")
            print(f"[{now - started:7.0f}s] hosts {s.active}/{len(fleet.hosts)} active, tasks running {running}, "
                  f"started {s.tasks_started}, stopped {s.tasks_stopped}, polls {s.polls}, reports {s.reports}, "
                  f"errors {s.errors}, cpu {100 * (cpu - last_cpu) / (now - last_time):.0f}%", flush=True)
            last_cpu, last_time = cpu, now
    finally:
        await fleet.stop()


def sim(
    hosts: Annotated[list[str], typer.Option(help="TYPE:COUNT, a catalog instance type (`shoal catalog list`) "
                                                  "and how many hosts of it, or NAME:COUNT:VCPUS:GIB for "
                                                  "CPU-only hosts (repeatable).")],
    server: Annotated[str, typer.Option(help="The control plane's URL.", envvar="SHOAL_SERVER")],
    join_token: Annotated[str, typer.Option(help="The cluster's join token (the server's <data-dir>/join-token).",
                                            envvar="SHOAL_JOIN_TOKEN")],
    cluster: Annotated[str, typer.Option(help="Cluster the hosts join.")] = "default",
    capacity_provider: Annotated[Optional[str], typer.Option(help="Capacity provider of every host.")] = None,
    zones: Annotated[Optional[str], typer.Option(help="Availability zones, comma-separated, dealt round-robin "
                                                      "(attribute ecs.availability-zone).")] = None,
    attribute: Annotated[Optional[list[str]], typer.Option(help="Custom attribute NAME=VALUE for every host "
                                                                "(repeatable).")] = None,
    run_time: Annotated[Optional[float], typer.Option(help="Mean task run time in seconds. Default: tasks run "
                                                           "until stopped. A task definition can set its own "
                                                           "with SHOAL_SIM_RUN_TIME.")] = None,
    distribution: Annotated[str, typer.Option(help="Run time distribution: fixed, exponential or uniform "
                                                   "(0.5x to 1.5x).")] = "fixed",
    start_delay: Annotated[float, typer.Option(help="Longest delay from placement to RUNNING, seconds "
                                                    "(uniform from 0).")] = 0.2,
    failure_rate: Annotated[float, typer.Option(help="Probability that a task exits 1 instead of 0.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the task model (same seed, same task: same fate).")] = 0,
    poll_wait: Annotated[float, typer.Option(help="Long-poll wait in seconds (at most 60). Keep it below the "
                                                  "server's --agent-timeout: at thousands of hosts, 60 with "
                                                  "--agent-timeout 90.")] = 20.0,
    heartbeat: Annotated[Optional[float], typer.Option(help="Report health every N seconds (default: only "
                                                            "at registration; polls keep hosts connected).")] = None,
    concurrency: Annotated[int, typer.Option(help="Registrations and reports in flight at once.")] = 64,
    prefix: Annotated[Optional[str], typer.Option(help="Host id prefix (ids are PREFIX-00000, …). Default: "
                                                       "sim-<random>.")] = None,
    stats_every: Annotated[float, typer.Option(help="Seconds between status lines.")] = 10.0,
    mps_probe_interval: Annotated[float, typer.Option(help="The modelled agents' MPS probe interval: a "
                                                           "`shoal chaos mps --mode hang` shows after 3 of them.")] = 5.0,
) -> None:
    """Run a simulated fleet: many hosts in this process, driving the server through the real agent
    protocol, with task run times from a model. Runs until Ctrl-C; on exit the hosts stay
    registered and the server marks their agents disconnected after its --agent-timeout
    (deregister them with the ECS API if they should go)."""
    from shoal.sim import SimFleet, TaskModel

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    attributes = parse_attributes(attribute)
    zone_list = [z.strip() for z in (zones or "").split(",") if z.strip()]
    specs = _specs(hosts, capacity_provider, zone_list, attributes)
    try:
        model = TaskModel(run_time=run_time, distribution=distribution, start_delay=(0.0, start_delay),
                          failure_rate=failure_rate, seed=seed)
        fleet = SimFleet(server, join_token, cluster, specs, model, poll_wait=poll_wait, heartbeat=heartbeat,
                         concurrency=concurrency, prefix=prefix, mps_probe_interval=mps_probe_interval)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if len(fleet.hosts) >= 2000 and poll_wait < 60:
        typer.echo(f"note: {len(fleet.hosts)} hosts polling every {poll_wait:g}s make about "
                   f"{len(fleet.hosts) / (0.9 * poll_wait):.0f} polls/s; at this size use --poll-wait 60 with "
                   f"`shoal server --agent-timeout 90`", err=True)
    from shoal import gctune
    from shoal.sim.fleet import new_event_loop

    gctune.tune()

    # SIGINT stops it even when it was started with SIGINT ignored (a background job, a script).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(_run(fleet, stats_every))
    except KeyboardInterrupt:
        print("stopped; the hosts stay registered", flush=True)
    except Exception as err:  # a refused registration (unknown cluster, bad join token…) says why
        raise typer.Exit(_fail(err)) from None


def _fail(err: Exception) -> int:
    typer.echo(f"shoal sim: {err}", err=True)
    return 1
