"""The operation registry and the per-request context handlers run in.

An operation is a plain function `(ctx, request) -> response`, registered under its AWS name.
It runs inside one store transaction: a write operation either fully applies, with its events,
or raises and leaves no trace.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable

from sqlalchemy import Connection

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
    dirty_clusters: set[str] = field(default_factory=set)
    # Services whose scheduler must look again, as (cluster name, service name): one of their
    # tasks changed. See `emit`.
    dirty_services: set[tuple[str, str]] = field(default_factory=set)
    emitted: int = 0  # events written: the rule router has work
    rules_changed: bool = False  # the router must reload its rule index

    def emit(self, detail_type: str, resources: list[str], detail: dict, **envelope) -> dict:
        """Append an event (source shoal.ecs unless `source=` says otherwise) in this transaction."""
        self.emitted += 1
        if detail_type == TASK_STATE_CHANGE and str(detail.get("group", "")).startswith("service:"):
            # Every change of a service task, whoever made it (an agent's report, StopTask, a
            # drain, a host that vanished), writes this event: the one place to catch them all.
            self.dirty_services.add((detail["clusterArn"].rsplit("/", 1)[-1], detail["group"][len("service:"):]))
        return outbox.append(self.conn, detail_type, resources, detail,
                             region=self.arns.region, account=self.arns.account, now=self.now, **envelope)


Handler = Callable[[Context, dict], dict]


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
    return json.dumps(doc, separators=(",", ":"))
