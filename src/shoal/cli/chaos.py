"""`shoal chaos …`: inject a fault on one host, for drills and demos (shoal.control.chaos).

The host's agent injects it and reports what it did; the command waits for that (--no-wait
returns at once). Detection and recovery then follow the ordinary path: watch them with
`shoal events tail`, `shoal actions list` or DescribeContainerInstances.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Optional

import typer

from shoal.cli import client
from shoal.cli.client import fail

app = typer.Typer(no_args_is_help=True, help="Inject faults on a host (simulated hosts; real ones need --really).")
WAIT = 30.0

Host = Annotated[str, typer.Option("--host", help="The host: container instance ARN or id, or its ec2InstanceId.")]
Cluster = Annotated[str, typer.Option("--cluster", help="The host's cluster.")]
Really = Annotated[bool, typer.Option("--really", help="Allow the fault on a real (not simulated) host.")]
NoWait = Annotated[bool, typer.Option("--no-wait", help="Do not wait for the agent's result.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the order as JSON.")]


def _order(body: dict, no_wait: bool, as_json: bool) -> None:
    order = client.call("POST", "/v1/chaos", body={k: v for k, v in body.items() if v is not None})["order"]
    deadline = time.monotonic() + WAIT
    while not no_wait and order["status"] == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.2)
        order = client.call("GET", f"/v1/chaos/{order['orderId']}")["order"]
    if as_json:
        typer.echo(json.dumps(order, indent=2))
    elif order["status"] == "PENDING":
        typer.echo(f"{order['orderId']} PENDING on {order['ec2InstanceId']}: "
                   + ("sent" if no_wait else f"its agent has not answered within {WAIT:g} s (is it connected?)"))
    else:
        typer.echo(f"{order['orderId']} {order['status']} on {order['ec2InstanceId']}: {order['result']}")
    if order["status"] == "FAILED" or (order["status"] == "PENDING" and not no_wait):
        raise typer.Exit(1)


@app.command("mps")
def mps(
    host: Host,
    mode: Annotated[str, typer.Option("--mode", help="crash | hang | fault | recover (lifts hang and fault).")],
    gpu: Annotated[Optional[int], typer.Option("--gpu", help="The GPU's index (default 0).")] = None,
    cluster: Cluster = "default", really: Really = False, no_wait: NoWait = False, as_json: AsJson = False,
) -> None:
    """Crash, hang or fault the MPS control daemon of one GPU (or lift a hang or fault)."""
    _order({"cluster": cluster, "host": host, "action": "mps", "mode": mode, "gpu": gpu, "really": really},
           no_wait, as_json)


@app.command("xid")
def xid(
    host: Host,
    gpu: Annotated[int, typer.Option("--gpu", help="The GPU's index.")],
    xid: Annotated[int, typer.Option("--xid", help="The Xid, e.g. 79 (GPU fallen off the bus).")],
    cluster: Cluster = "default", really: Really = False, no_wait: NoWait = False, as_json: AsJson = False,
) -> None:
    """Raise an Xid on one GPU."""
    _order({"cluster": cluster, "host": host, "action": "xid", "gpu": gpu, "xid": xid, "really": really},
           no_wait, as_json)


@app.command("daemon")
def daemon(
    host: Host,
    name: Annotated[str, typer.Option("--daemon", help="The managed daemon's name.")],
    kill: Annotated[bool, typer.Option("--kill", help="Kill its task's processes (SIGKILL).")] = False,
    cluster: Cluster = "default", really: Really = False, no_wait: NoWait = False, as_json: AsJson = False,
) -> None:
    """Kill the host's task of a managed daemon."""
    if not kill:
        fail("say what to do to the daemon: --kill", 2)
    _order({"cluster": cluster, "host": host, "action": "daemon", "daemon": name, "kill": True, "really": really},
           no_wait, as_json)
