"""The control loop of one server: after every commit, wake the agents and the placement of the
clusters it concerns, the service scheduler for services whose tasks changed, and the event
rules' dispatcher when events were written; on a slow tick, catch what no commit announced (a
lost agent, capacity to scale, tasks that another server left waiting, services to resync).

Reconcilers follow the controller pattern: observe, diff, act, each step idempotent, so running
one twice, or on two servers at once, is harmless.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from sqlalchemy import select

from shoal.api.agent import state as agent_state
from shoal.api.operations import Context, run_unit
from shoal.control.daemons import DaemonScheduler
from shoal.control.repair import RepairController
from shoal.control.services import ServiceScheduler
from shoal.control.signals import HostSignals
from shoal.domain.tasks import PENDING_STATES
from shoal.scheduler.placement import place_pending
from shoal.store.tables import container_instances as cis, tasks

log = logging.getLogger(__name__)
TICK = 1.0
AGENT_TIMEOUT = 30.0  # an agent long-polls every 20 s at most: silence past this means it is lost


class Hub:
    def __init__(self, store, arns, *, capacity=None, dispatcher=None, agent_timeout: float = AGENT_TIMEOUT,
                 services: ServiceScheduler | None = None, daemons: DaemonScheduler | None = None):
        self.store, self.arns, self.capacity, self.dispatcher = store, arns, capacity, dispatcher
        self.repair = RepairController(capacity) if capacity is not None else None
        self.services = services or ServiceScheduler()
        self.daemons = daemons or DaemonScheduler()
        self.agent_timeout = agent_timeout
        self.signals = HostSignals()
        self.last_seen: dict[str, float] = {}
        self._dirty: set[str] = set()
        self._wake: asyncio.Event | None = None
        self._started = time.monotonic()
        self._swept = self._listed = float("-inf")
        self._live: set[str] = set()  # hosts not INACTIVE, as last listed
        self._checked: dict[str, float] = {}  # host ARN -> when the sweep last found it overdue

    def committed(self, ctx: Context) -> None:
        """Called on the event loop after a unit of work committed."""
        if ctx.touched_hosts:
            self.signals.bump(ctx.touched_hosts)
        if self.dispatcher is not None and (ctx.emitted or ctx.rules_changed):
            self.dispatcher.wake()
        if ctx.dirty_clusters or ctx.dirty_services or ctx.dirty_daemons:
            self._dirty |= ctx.dirty_clusters
            self.services.mark(ctx.dirty_services)
            self.daemons.mark(ctx.dirty_daemons)
            if self._wake is not None:
                self._wake.set()

    async def write(self, fn):
        result, ctx = await self.store.write(lambda conn: run_unit(conn, self.arns, fn))
        self.committed(ctx)
        return result

    async def run(self) -> None:
        self._wake = asyncio.Event()
        while True:
            due = min((d for d in (self.services.next_due(), self.daemons.next_due()) if d is not None),
                      default=None)  # a service or daemon asked to be looked at again by then
            timeout = TICK if due is None else min(TICK, max(due - time.monotonic(), 0.0))
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                self._dirty |= await self.store.read(_clusters_with_waiting_tasks)
            self._wake.clear()
            try:
                await self.daemons.run_once(self)
                await self._place()
                await self.services.run_once(self)
                await self._sweep_agents()
                if self.capacity is not None:
                    await self.capacity.reconcile(self)
                    await self.repair.reconcile(self)
            except asyncio.CancelledError:
                raise
            except Exception:  # keep reconciling; the next tick tries again
                log.exception("control loop step failed")

    async def _place(self) -> None:
        while self._dirty:
            cluster = self._dirty.pop()
            await self.write(lambda ctx: place_pending(ctx, cluster))

    async def _sweep_agents(self) -> None:
        """Mark lost the agents that stopped polling. Once a tick, from memory: when this server
        last heard from each host. The list of live hosts (to learn of those this server has
        never heard from) is read again only every half agent timeout, and only overdue hosts'
        rows are read, so the sweep stays cheap with thousands of hosts."""
        now = time.monotonic()
        if now - self._swept < TICK:
            return
        self._swept = now
        if now - self._listed > self.agent_timeout / 2:
            self._listed, self._live = now, set(await self.store.read(_live_hosts))
        # Overdue: not heard from (or, never heard from, not since start-up) for a whole agent
        # timeout, and not checked within one. Two passes rather than one over the union of the
        # live and the seen hosts with a max() each: 8 ms -> 1 ms a tick for 10,000 hosts.
        deadline, checked = now - self.agent_timeout, self._checked
        overdue = [arn for arn, seen in self.last_seen.items() if seen < deadline and checked.get(arn, 0.0) < deadline]
        if self._started < deadline:
            overdue += [arn for arn in self._live - self.last_seen.keys() if checked.get(arn, 0.0) < deadline]
        if not overdue:
            return
        for arn in await self.store.read(lambda conn: _connected_hosts(conn, overdue)):
            log.warning("agent of %s is not polling: marking it disconnected", arn)
            await self.write(lambda ctx, arn=arn: agent_state.disconnected(ctx, arn))
        for arn in overdue:  # checked: not read again until another timeout has passed
            self._checked[arn] = now


def _clusters_with_waiting_tasks(conn) -> set[str]:
    return set(conn.execute(select(tasks.c.cluster_name).distinct().where(
        tasks.c.desired_status == "RUNNING", tasks.c.container_instance_arn.is_(None),
        tasks.c.last_status.in_(PENDING_STATES))).scalars())


def _live_hosts(conn) -> list[str]:
    return list(conn.execute(select(cis.c.arn).where(cis.c.status != "INACTIVE")).scalars())


def _connected_hosts(conn, arns: list[str]) -> list[str]:
    connected = []
    for start in range(0, len(arns), 500):
        rows = conn.execute(select(cis.c.arn, cis.c.doc).where(cis.c.arn.in_(arns[start:start + 500]),
                                                               cis.c.status != "INACTIVE")).all()
        connected += [r.arn for r in rows if json.loads(r.doc).get("agentConnected")]
    return connected
