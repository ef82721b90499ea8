"""`shoal agent`: run the host agent for this machine."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated, Optional

import typer


def agent(
    server: Annotated[str, typer.Option(help="The control plane's URL.", envvar="SHOAL_SERVER")],
    join_token: Annotated[str, typer.Option(help="The cluster's join token (the server's <data-dir>/join-token).",
                                            envvar="SHOAL_JOIN_TOKEN")],
    cluster: Annotated[str, typer.Option(help="Cluster to join.")] = "default",
    capacity_provider: Annotated[Optional[str], typer.Option(help="Capacity provider the host belongs to.")] = None,
    data_dir: Annotated[Path, typer.Option(help="The agent's state: identity, task and container dirs, logs.",
                                           envvar="SHOAL_AGENT_DATA_DIR")] = Path(".shoal/agent"),
    host_id: Annotated[Optional[str], typer.Option(help="The host's id (ec2InstanceId). Default: generated "
                                                        "once and kept in the data dir.")] = None,
    instance_type: Annotated[Optional[str], typer.Option(help="Instance type to register "
                                                              "(attribute ecs.instance-type).")] = None,
    availability_zone: Annotated[Optional[str], typer.Option(help="Zone the host is in (attribute "
                                                                  "ecs.availability-zone).",
                                                             envvar="SHOAL_AVAILABILITY_ZONE")] = None,
    simulate: Annotated[bool, typer.Option("--simulate", help="Take CPU, memory and GPUs from the instance "
                                                              "catalog for --instance-type (simulated GPUs).")] = False,
    fake_gpus: Annotated[Optional[Path], typer.Option(help="Simulate GPUs from a JSON spec "
                                                           "({model, count, memoryMiB, uuids?}).")] = None,
    attribute: Annotated[Optional[list[str]], typer.Option(help="Custom attribute NAME=VALUE (repeatable).")] = None,
    runtime: Annotated[str, typer.Option(help="process (default; image is not used) or podman.")] = "process",
    mps_control: Annotated[Optional[str], typer.Option(
        help="The MPS control binary (path or name on PATH). Default: shoal-fake-mps-control for "
             "simulated GPUs, else nvidia-cuda-mps-control if it is on PATH (without one: no MPS).",
        envvar="SHOAL_MPS_CONTROL")] = None,
    mps_probe_interval: Annotated[float, typer.Option(
        help="Seconds between probes of each GPU's MPS control daemon (IMPAIRED after 3 failures; "
             "a crash is seen at once).", envvar="SHOAL_MPS_PROBE_INTERVAL")] = 5.0,
    xid_set: Annotated[str, typer.Option(
        help="GPU Xids that make ACCELERATED_COMPUTE IMPAIRED (XID_<n>), comma-separated; others are "
             "logged only; 'none' for none. Default: the Xids ECS GPU auto repair acts on.",
        envvar="SHOAL_XID_SET")] = "",
) -> None:
    """Run the host agent: register this host, run the tasks placed on it, report their life."""
    from shoal.agent.accelerated import AWS_XIDS, parse_xid_set
    from shoal.agent.agent import Agent, AgentConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if runtime not in ("process", "podman"):
        raise typer.BadParameter("expected process or podman", param_hint="--runtime")
    if simulate and not instance_type:
        raise typer.BadParameter("--simulate needs --instance-type", param_hint="--simulate")
    if not 0.05 <= mps_probe_interval <= 3600:
        raise typer.BadParameter("expected seconds between 0.05 and 3600", param_hint="--mps-probe-interval")
    try:
        xids = frozenset() if xid_set.strip().lower() == "none" else \
            parse_xid_set(xid_set) if xid_set.strip() else frozenset(AWS_XIDS)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--xid-set") from None
    attributes = parse_attributes(attribute)
    config = AgentConfig(server=server.rstrip("/"), join_token=join_token, data_dir=data_dir, cluster=cluster,
                         capacity_provider=capacity_provider, host_id=host_id, instance_type=instance_type,
                         availability_zone=availability_zone,
                         simulate=simulate, attributes=attributes, runtime=runtime, fake_gpus=fake_gpus,
                         mps_control=mps_control, mps_probe_interval=mps_probe_interval, xid_set=xids)
    try:
        asyncio.run(Agent(config).run())
    except KeyboardInterrupt:
        pass


def parse_attributes(items: list[str] | None) -> dict[str, str]:
    """--attribute NAME=VALUE options (repeatable) as a dict."""
    attributes = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint="--attribute")
        attributes[name] = value
    return attributes
