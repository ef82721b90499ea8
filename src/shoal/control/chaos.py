"""Chaos orders: faults an operator injects on one host, for drills and demos (`shoal chaos`).

    mps     --mode crash | hang | fault | recover   the MPS control daemon of one GPU
    xid     --gpu N --xid X                        an Xid on one GPU
    daemon  --daemon D --kill                      SIGKILL the host's task of managed daemon D

The fault happens on the host, so the host's agent injects it: an order is stored here and
travels to the agent in its poll answers exactly like a task change (stamped with the host's
desired-state sequence under its row lock, so a poll never skips one); the agent applies it
once and reports DONE or FAILED with what it did. Everything after that, detection, events,
fencing and repair, is the ordinary path: the point of a drill.

Real hosts are protected: an order for a host that is not simulated (attribute
`shoal.simulated`, or simulated GPUs: `shoal.gpu.backend` fake) needs `really`. Requests and
results go to the cluster's action log (CHAOS_REQUESTED, CHAOS_DONE, CHAOS_FAILED), so a
timeline read from it shows when the fault was injected.
"""

from __future__ import annotations

import secrets

from sqlalchemy import Connection, bindparam, insert, select, update

from shoal import jsonio
from shoal.api.agent import desired
from shoal.api.ecs.common import cluster_row
from shoal.api.ecs.container_instances import instance_row
from shoal.api.operations import Context
from shoal.domain.daemons import GROUP_PREFIX
from shoal.domain.errors import InvalidParameter, NotFound
from shoal.events import action_log
from shoal.events.envelope import iso
from shoal.store.prepared import Prepared
from shoal.store.tables import chaos_orders, container_instances as cis, tasks

ACTIONS = ("mps", "xid", "daemon")
MPS_MODES = ("crash", "hang", "fault", "recover")
STATUSES = ("PENDING", "DONE", "FAILED")
MPS_CAPABILITY = "ecs.capability.gpu-sharing-mps"
_FIELDS = {"cluster", "host", "action", "mode", "gpu", "xid", "daemon", "kill", "really"}

_PENDING_FOR_HOST = Prepared(select(chaos_orders.c.id, chaos_orders.c.order_doc).where(
    chaos_orders.c.host_arn == bindparam("host"), chaos_orders.c.status == "PENDING",
    chaos_orders.c.seq > bindparam("cursor")).order_by(chaos_orders.c.seq))


# --- requests ------------------------------------------------------------------------------------
def _int(body: dict, name: str, required: bool, minimum: int = 0) -> int | None:
    value = body.get(name)
    if value is None:
        if required:
            raise InvalidParameter(f"Invalid parameter '{name}': required for action '{body['action']}'.")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidParameter(f"Invalid parameter '{name}': a whole number of at least {minimum}, got {value!r}.")
    return value


def _check_request(body: dict) -> None:
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise InvalidParameter(f"Invalid parameter '{unknown[0]}': not a field of a chaos order "
                               f"({', '.join(sorted(_FIELDS))}).")
    for name in ("cluster", "host", "action", "mode", "daemon"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise InvalidParameter(f"Invalid parameter '{name}': expected a string.")
    for name in ("kill", "really"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise InvalidParameter(f"Invalid parameter '{name}': expected true or false.")
    if not body.get("host"):
        raise InvalidParameter("Invalid parameter 'host': required (a container instance ARN or id, "
                               "or an ec2InstanceId).")
    if body.get("action") not in ACTIONS:
        raise InvalidParameter(f"Invalid parameter 'action': one of {', '.join(ACTIONS)}, got {body.get('action')!r}.")


def _attributes(doc: dict) -> dict[str, str | None]:
    return {a["name"]: a.get("value") for a in doc.get("attributes", [])}


def _gpus(doc: dict) -> list[str]:
    return next((r["stringSetValue"] for r in doc.get("registeredResources", []) if r["name"] == "GPU"), [])


def is_simulated(doc: dict) -> bool:
    attributes = _attributes(doc)
    return attributes.get("shoal.simulated") == "true" or attributes.get("shoal.gpu.backend") == "fake"


def _order(ctx: Context, body: dict, host, doc: dict) -> dict:
    """What the agent is to do, checked against what the host has."""
    action, order = body["action"], {"action": body["action"]}
    gpus = _gpus(doc)
    if action == "mps" and MPS_CAPABILITY not in _attributes(doc):
        raise InvalidParameter(f"Invalid parameter 'host': {host.ec2_instance_id} runs no MPS control daemon "
                               f"(no {MPS_CAPABILITY}).")
    if action in ("mps", "xid"):
        gpu = _int(body, "gpu", required=action == "xid")
        gpu = 0 if gpu is None else gpu
        if gpu >= len(gpus):
            raise InvalidParameter(f"Invalid parameter 'gpu': host {host.ec2_instance_id} has "
                                   f"{len(gpus)} GPU(s), numbered from 0; got {gpu}.")
        order.update(gpu=gpu, gpuId=gpus[gpu])
    if action == "mps":
        if body.get("mode") not in MPS_MODES:
            raise InvalidParameter(f"Invalid parameter 'mode': one of {', '.join(MPS_MODES)}, got {body.get('mode')!r}.")
        order["mode"] = body["mode"]
    elif action == "xid":
        order["xid"] = _int(body, "xid", required=True, minimum=1)
    elif action == "daemon":
        if not body.get("daemon"):
            raise InvalidParameter("Invalid parameter 'daemon': required for action 'daemon' (the daemon's name).")
        if body.get("kill") is not True:
            raise InvalidParameter("Invalid parameter 'kill': the only daemon fault is kill; pass kill=true (--kill).")
        task = ctx.conn.execute(select(tasks.c.arn).where(
            tasks.c.container_instance_arn == host.arn, tasks.c.daemon_name == body["daemon"],
            tasks.c.last_status != "STOPPED").order_by(tasks.c.created_at.desc())).first()
        if task is None:
            raise InvalidParameter(f"Invalid parameter 'daemon': no task of daemon '{body['daemon']}' "
                                   f"({GROUP_PREFIX}{body['daemon']}) runs on {host.ec2_instance_id}.")
        order.update(daemon=body["daemon"], taskArn=task.arn, kill=True)
    return order


def request(ctx: Context, body: dict) -> dict:
    """Store a chaos order for a host's agent; the agent gets it in its next poll answer."""
    _check_request(body)
    cluster = cluster_row(ctx, body.get("cluster"))
    host = instance_row(ctx, cluster, body["host"], "host", for_update=True)
    if host is None or host.status == "INACTIVE":
        raise InvalidParameter(f"Invalid parameter 'host': no registered container instance "
                               f"'{body['host']}' in cluster '{cluster.name}'.")
    doc = jsonio.loads(host.doc)
    simulated = is_simulated(doc)
    if not simulated and not body.get("really"):
        raise InvalidParameter(f"Invalid parameter 'really': {host.ec2_instance_id} is a real host, not a simulated "
                               f"one; injecting a fault there needs really=true (--really).")
    order = {**_order(ctx, body, host, doc), "orderId": secrets.token_hex(8), "simulated": simulated,
             "really": bool(body.get("really"))}
    # The order's place in the host's desired-state sequence (see shoal.api.agent.desired).
    seq = desired.advance(ctx.conn, host.arn)
    ctx.conn.execute(update(cis).where(cis.c.arn == host.arn).values(orders_seq=seq))
    ctx.conn.execute(insert(chaos_orders).values(
        id=order["orderId"], cluster_name=cluster.name, host_arn=host.arn, seq=seq, status="PENDING",
        order_doc=jsonio.dumps(order), requested_at=ctx.now))
    ctx.tell_agent(host.arn)
    action_log.record(ctx, cluster=cluster.name, level="WARN", resource_arn=cluster.arn, source_id=host.arn,
                      event_name="CHAOS_REQUESTED", detail={**order, "ec2InstanceId": host.ec2_instance_id})
    return _shape(order, cluster.name, host.arn, host.ec2_instance_id, "PENDING", None, ctx.now, None)


# --- the agent's side ------------------------------------------------------------------------------
def for_poll(conn: Connection, host_arn: str, orders_seq: int, cursor: int | None) -> list[dict]:
    """The orders a poll answer carries: the pending ones stamped after the agent's cursor (all
    pending ones in a full answer). Free for a host that never had one."""
    if orders_seq <= (cursor or 0):
        return []
    return [jsonio.loads(doc) for _id, doc in _PENDING_FOR_HOST.tuples(conn, {"host": host_arn, "cursor": cursor or 0})]


def acknowledge(ctx: Context, host, acks) -> None:
    """The agent's results: [{orderId, status: DONE | FAILED, result}]. An order is settled once;
    a repeated report (a retry after a lost answer) changes nothing."""
    if not isinstance(acks, list):
        raise InvalidParameter("Invalid parameter 'orders': expected a list of {orderId, status, result}.")
    for ack in acks:
        if not isinstance(ack, dict) or ack.get("status") not in ("DONE", "FAILED") \
                or not isinstance(ack.get("orderId"), str):
            raise InvalidParameter("Invalid parameter 'orders[]': expected {orderId, status: DONE | FAILED, result}.")
        result = str(ack.get("result") or "")[:2000]
        row = ctx.conn.execute(select(chaos_orders).where(
            chaos_orders.c.id == ack["orderId"], chaos_orders.c.host_arn == host.arn)).first()
        if row is None or row.status != "PENDING":
            continue
        ctx.conn.execute(update(chaos_orders).where(chaos_orders.c.id == row.id)
                         .values(status=ack["status"], result=result, done_at=ctx.now))
        action_log.record(ctx, cluster=row.cluster_name, level="WARN" if ack["status"] == "DONE" else "ERROR",
                          resource_arn=ctx.arns.cluster(row.cluster_name), source_id=host.arn, event_name=f"CHAOS_{ack['status']}",
                          detail={**jsonio.loads(row.order_doc), "result": result})


# --- reading ---------------------------------------------------------------------------------------
def describe(conn: Connection, order_id: str) -> dict:
    row = conn.execute(select(chaos_orders, cis.c.ec2_instance_id).join(
        cis, cis.c.arn == chaos_orders.c.host_arn).where(chaos_orders.c.id == order_id)).first()
    if row is None:
        raise NotFound(f"Chaos order not found: '{order_id[:64]}'.", status=404)
    return _shape(jsonio.loads(row.order_doc), row.cluster_name, row.host_arn, row.ec2_instance_id, row.status,
                  row.result, row.requested_at, row.done_at)


def _shape(order: dict, cluster: str, host_arn: str, ec2_id: str, status: str, result: str | None,
           requested_at: float, done_at: float | None) -> dict:
    return {**order, "cluster": cluster, "containerInstanceArn": host_arn, "ec2InstanceId": ec2_id,
            "status": status, "result": result, "requestedAt": iso(requested_at),
            "doneAt": iso(done_at) if done_at is not None else None}
