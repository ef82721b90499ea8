"""The operation registry and the per-request context handlers run in.

An operation is a plain function `(ctx, request) -> response`, registered under its AWS name.
It runs inside one store transaction: a write operation either fully applies, with its events,
or raises and leaves no trace.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from sqlalchemy import Connection

from shoal import jsonio
from shoal.api.agent import desired
from shoal.domain.arns import ArnFactory
from shoal.events import outbox
from shoal.events.envelope import TASK_STATE_CHANGE


@dataclass
class Context:
    conn: Connection
    arns: ArnFactory
    now: float = field(default_factory=time.time)
    # What the unit of work changed that others wait on: hosts whose agents must look again
    # (their long-polls wake after the commit), clusters with capacity to place waiting tasks on.
    touched_hosts: set[str] = field(default_factory=set)
    # Host ARN -> tasks whose desired state on it changed (placed there, asked to stop): written
    # into the host's desired-state sequence before the commit (see `run_unit`).
    desired_changes: dict[str, set[str]] = field(default_factory=dict)
    dirty_clusters: set[str] = field(default_factory=set)
    # Services whose scheduler must look again, as (cluster name, service name): one of their
    # tasks changed. See `emit`.
    dirty_services: set[tuple[str, str]] = field(default_factory=set)
    # Clusters whose daemon scheduler must look again: a daemon, one of its tasks, or a host of
    # its providers changed (shoal.control.daemons).
    dirty_daemons: set[str] = field(default_factory=set)
    emitted: int = 0  # events written: the rule router has work
    rules_changed: bool = False  # the router must reload its rule index

    def tell_agent(self, host_arn: str, task_arn: str | None = None) -> None:
        """The host's agent must look again: its long-poll wakes after the commit, and its next
        answer carries `task_arn` (a task placed on the host, or asked to stop)."""
        self.touched_hosts.add(host_arn)
        if task_arn is not None:
            self.desired_changes.setdefault(host_arn, set()).add(task_arn)

    def emit(self, detail_type: str, resources: list[str], detail: dict, **envelope) -> dict:
        """Append an event (source shoal.ecs unless `source=` says otherwise) in this transaction."""
        self._noted(detail_type, detail)
        return outbox.append(self.conn, detail_type, resources, detail,
                             region=self.arns.region, account=self.arns.account, now=self.now, **envelope)

    def emit_many(self, detail_type: str, items: list[tuple[list[str], dict]]) -> list[dict]:
        """`emit` for several events of one type, (resources, detail) each, in one statement."""
        for _, detail in items:
            self._noted(detail_type, detail)
        return outbox.append_many(self.conn, detail_type, items, region=self.arns.region, account=self.arns.account,
                                  now=self.now)

    def _noted(self, detail_type: str, detail: dict) -> None:
        """What an event tells the control loop."""
        self.emitted += 1
        if detail_type == TASK_STATE_CHANGE and str(detail.get("group", "")).startswith("service:"):
            # Every change of a service task, whoever made it (an agent's report, StopTask, a
            # drain, a host that vanished), writes this event: the one place to catch them all.
            self.dirty_services.add((detail["clusterArn"].rsplit("/", 1)[-1], detail["group"][len("service:"):]))
        if detail_type == TASK_STATE_CHANGE and (str(detail.get("group", "")).startswith("daemon:") or (
                detail.get("lastStatus") == "STOPPED" and detail.get("containerInstanceArn"))):
            # A daemon's task changed, or a task left a host (a drained host's daemons stop last).
            self.dirty_daemons.add(detail["clusterArn"].rsplit("/", 1)[-1])


T = TypeVar("T")
Handler = Callable[[Context, dict], dict]


def run_unit(conn: Connection, arns: ArnFactory, fn: Callable[[Context], T]) -> tuple[T, Context]:
    """Run one unit of work in the store transaction `conn` has begun; return its result and
    context, for what must happen after the commit."""
    ctx = Context(conn, arns)
    result = fn(ctx)
    if ctx.desired_changes:
        desired.record(ctx.conn, ctx.desired_changes)
    return result, ctx


@dataclass(frozen=True)
class Operation:
    name: str
    handler: Handler
    write: bool


class Registry:
    def __init__(self, target_prefix: str, service: str, invalid_input: str):
        self.target_prefix = target_prefix
        self.service = service
        self.invalid_input = invalid_input  # the error code of a request the model rejects
        self.operations: dict[str, Operation] = {}

    def op(self, name: str, *, write: bool = True) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.operations[name] = Operation(name, fn, write)
            return fn

        return register


ecs = Registry("AmazonEC2ContainerServiceV20141113", "ecs", "InvalidParameterException")
eventbridge = Registry("AWSEvents", "events", "ValidationException")


def dumps(doc: object) -> str:
    return jsonio.dumps(doc)
