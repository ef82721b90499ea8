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


@dataclass
class Context:
    conn: Connection
    arns: ArnFactory
    now: float = field(default_factory=time.time)
    # What the unit of work changed that others wait on: hosts whose agents must look again
    # (their long-polls wake after the commit), clusters with capacity to place waiting tasks on.
    touched_hosts: set[str] = field(default_factory=set)
    dirty_clusters: set[str] = field(default_factory=set)

    def emit(self, detail_type: str, resources: list[str], detail: dict) -> dict:
        return outbox.append(self.conn, detail_type, resources, detail,
                             region=self.arns.region, account=self.arns.account, now=self.now)


Handler = Callable[[Context, dict], dict]


@dataclass(frozen=True)
class Operation:
    name: str
    handler: Handler
    write: bool


class Registry:
    def __init__(self, target_prefix: str, service: str):
        self.target_prefix = target_prefix
        self.service = service
        self.operations: dict[str, Operation] = {}

    def op(self, name: str, *, write: bool = True) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.operations[name] = Operation(name, fn, write)
            return fn

        return register


ecs = Registry("AmazonEC2ContainerServiceV20141113", "ecs")


def dumps(doc: object) -> str:
    return json.dumps(doc, separators=(",", ":"))
