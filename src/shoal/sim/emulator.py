"""The agent emulator: many simulated hosts in one asyncio process, speaking the real agent
protocol to a real control plane.

Per host: register with the join token (a bounded number at a time), report the four health
checks OK (which makes the host ACTIVE), then long-poll its desired state for as long as the
emulator runs. Task snapshots go out through a small pool of report workers, one batch per
host at a time, so each host's reports arrive in the order its tasks changed while the server
sees at most `workers` reports at once, however many hosts are busy.

Load at scale: an idle host costs one poll per `poll_wait` seconds, and nothing else unless
`heartbeat` is set (polls already keep the agent connected, and health changes are reported
when they happen). Poll waits are jittered so that hosts registered together do not poll
together forever after.
"""

from __future__ import annotations

import asyncio
import logging
import random
import resource
import time
from dataclasses import dataclass, field
from importlib import metadata

from shoal.sim.faults import HostFaults
from shoal.sim.host import HEALTH_OK, SimHost
from shoal.sim.wire import Connection, Endpoint, HttpError

log = logging.getLogger(__name__)
REPORT_BATCH = 100      # snapshots per report, as the real agent batches them
POLL_JITTER = 0.2       # each poll waits between (1 - jitter) and 1 times poll_wait
MAX_BACKOFF = 5.0


class RegistrationRefused(Exception):
    """The server refused a host (bad cluster, provider, join token…): retrying cannot help."""


@dataclass
class Stats:
    registered: int = 0
    active: int = 0
    polls: int = 0
    reports: int = 0
    errors: int = 0
    tasks_started: int = 0
    tasks_stopped: int = 0
    started_at: float = field(default_factory=time.monotonic)
    registered_after: float | None = None   # seconds from start until every host was registered
    active_after: float | None = None       # seconds from start until every host was ACTIVE


def raise_open_files_limit() -> int:
    """Every host holds a poll connection: lift the soft limit on open files to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _version() -> str:
    try:
        return metadata.version("shoal")
    except metadata.PackageNotFoundError:
        return "0"


class Emulator:
    def __init__(self, server_url: str, join_token: str, hosts: list[SimHost], *, poll_wait: float = 20.0,
                 heartbeat: float | None = None, concurrency: int = 64, seed: int = 0,
                 mps_probe_interval: float = 5.0):
        self.endpoint = Endpoint(server_url)
        self.join_token, self.hosts = join_token, hosts
        self.poll_wait, self.heartbeat, self.concurrency = poll_wait, heartbeat, concurrency
        self.mps_probe_interval = mps_probe_interval  # for modelled MPS hangs (shoal.sim.faults)
        self._orders_done: set[str] = set()
        self.stats = Stats()
        self._rng = random.Random(seed)  # poll jitter only
        self._reports: asyncio.Queue[SimHost] | None = None
        self._tasks: list[asyncio.Task] = []
        self._active = asyncio.Event()
        if not hosts:
            self._active.set()
        self._failed: BaseException | None = None
        for host in hosts:
            host._report = self._enqueue

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Register every host; return once all are registered (they poll from then on)."""
        limit = raise_open_files_limit()
        if limit < len(self.hosts) + 2 * self.concurrency + 64:
            log.warning("open files limit %d is low for %d hosts (one connection each)", limit, len(self.hosts))
        self.stats = Stats()
        self._reports = asyncio.Queue()
        self._tasks += [asyncio.create_task(self._report_worker()) for _ in range(self.concurrency)]
        pending = iter(self.hosts)
        workers = [asyncio.create_task(self._register_worker(pending)) for _ in range(self.concurrency)]
        try:
            await asyncio.gather(*workers)
        except BaseException as err:
            for w in workers:
                w.cancel()
            self._failed = err
            self._active.set()  # wake anyone waiting for ACTIVE: it will not happen
            raise
        self.stats.registered_after = time.monotonic() - self.stats.started_at
        if self.heartbeat:
            self._tasks.append(asyncio.create_task(self._heartbeats()))

    async def wait_active(self, timeout: float | None = None) -> None:
        """Until every host has been told by its poll that it is ACTIVE."""
        async with asyncio.timeout(timeout):
            await self._active.wait()
        if self._failed is not None:
            raise RuntimeError(f"the fleet did not start: {self._failed}") from self._failed

    async def stop(self) -> None:
        """Stop polling and reporting. Hosts stay registered, as after a crash of their agents:
        the server marks them disconnected after its --agent-timeout."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for host in self.hosts:
            host.close()

    # -- registration ------------------------------------------------------------------------
    async def _register_worker(self, pending) -> None:
        conn, version = Connection(self.endpoint), _version()
        try:
            for host in pending:
                await self._register(conn, host, version)
                self.stats.registered += 1
                # Health before the first poll: that poll then finds the host ACTIVE already,
                # which saves the server one poll per host while thousands register.
                host.outbox.append({"health": HEALTH_OK})
                await self._send_batch(conn, host)
                if host.outbox:
                    self._schedule(host)  # it failed: the report workers retry it
                host.poller = asyncio.create_task(self._poll_loop(host))
                self._tasks.append(host.poller)
        finally:
            conn.close()

    async def _register(self, conn: Connection, host: SimHost, version: str) -> None:
        backoff = 0.2
        body = host.registration(version)
        while True:
            try:
                status, answer = await conn.request("POST", "/v1/agent/register", self.join_token, body)
            except HttpError as err:  # the server is restarting or overloaded: it never saw this one
                self.stats.errors += 1
                log.warning("registering %s failed (%s); retrying in %.1fs", host.host_id, err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            if status == 200:
                host.arn, host.token = answer["containerInstanceArn"], answer["token"]
                return
            if status >= 500 or status == 429:
                self.stats.errors += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            raise RegistrationRefused(f"registering {host.host_id} ({host.instance_type}) was refused "
                                      f"({status}): {answer.get('message', answer)}")

    # -- polling -----------------------------------------------------------------------------
    async def _poll_loop(self, host: SimHost) -> None:
        conn, since, cursor, backoff = Connection(self.endpoint), "", "", 0.2
        try:
            while not host.silenced:
                wait = round(self.poll_wait * (1 - POLL_JITTER * self._rng.random()), 2)
                try:
                    status, answer = await conn.request("GET", f"/v1/agent/poll?since={since}&cursor={cursor}&wait={wait}",
                                                        host.token, timeout=wait + 30)
                except HttpError as err:
                    status, answer = None, {"message": str(err)}
                self.stats.polls += 1
                if status == 403:
                    log.warning("%s: the server refused its credential (deregistered); it stops", host.host_id)
                    return
                if status != 200:
                    self.stats.errors += 1
                    log.debug("%s: poll failed (%s): %s", host.host_id, status, answer.get("message"))
                    await asyncio.sleep(backoff * (0.5 + self._rng.random()))
                    backoff = min(backoff * 2, MAX_BACKOFF)
                    continue
                backoff = 0.2
                since, cursor = answer["version"], answer["cursor"]
                self._seen_status(host, answer["status"])
                host.reconcile(answer["tasks"], full=answer["full"], cursor=cursor)
                for order in answer.get("orders", ()):
                    self._chaos(host, order)
                if answer["status"] == "INACTIVE":  # deregistered: its tasks are left as they are
                    return
        finally:
            conn.close()

    def _chaos(self, host: SimHost, order: dict) -> None:
        """A `shoal chaos` order: modelled by shoal.sim.faults, answered once."""
        if host.faults is None:
            host.faults = HostFaults(host, self.mps_probe_interval,
                                     lambda check: self._report_health(host, {"ACCELERATED_COMPUTE": check}),
                                     host.fail)
        if order["orderId"] in self._orders_done:
            return
        self._orders_done.add(order["orderId"])
        try:
            status, result = "DONE", host.faults.apply(order)
        except ValueError as e:
            status, result = "FAILED", str(e)
        host.outbox.append({"orders": [{"orderId": order["orderId"], "status": status, "result": result}]})
        self._schedule(host)

    def _seen_status(self, host: SimHost, status: str) -> None:
        if status == host.status:
            return
        if status == "ACTIVE" and host.status in (None, "REGISTERING"):
            self.stats.active += 1
            if self.stats.active == len(self.hosts):
                self.stats.active_after = time.monotonic() - self.stats.started_at
                self._active.set()
        host.status = status

    # -- reporting ---------------------------------------------------------------------------
    def _enqueue(self, host: SimHost, snapshot: dict) -> None:
        if snapshot["lastStatus"] == "RUNNING" and snapshot.get("startedAt") and "stoppingAt" not in snapshot:
            self.stats.tasks_started += 1
        elif snapshot["lastStatus"] == "STOPPED":
            self.stats.tasks_stopped += 1
        host.outbox.append(snapshot)
        self._schedule(host)

    def _schedule(self, host: SimHost) -> None:
        if host.silenced:  # a lost agent tells nobody anything
            host.outbox.clear()
            return
        if not host.queued and self._reports is not None:
            host.queued = True
            self._reports.put_nowait(host)

    def _report_health(self, host: SimHost, checks: dict) -> None:
        host.outbox.append({"health": checks})
        self._schedule(host)

    def set_health(self, host: SimHost, kind: str, status: str, reason: str | None = None) -> None:
        """Report one health check of `host` (e.g. ACCELERATED_COMPUTE IMPAIRED) as a real agent would."""
        check = {"status": status, **({"reason": reason} if reason else {})}
        self._report_health(host, {kind: check})

    def silence(self, host: SimHost) -> None:
        """Make `host` a lost agent: it stops polling and reporting at once (the server marks it
        disconnected after its --agent-timeout); its tasks are left as they are."""
        host.silenced = True
        host.outbox.clear()
        if host.poller is not None:
            host.poller.cancel()

    async def _report_worker(self) -> None:
        conn = Connection(self.endpoint)
        try:
            while True:
                host = await self._reports.get()
                try:
                    await self._send_batch(conn, host)
                except Exception:  # a bug must not take a report worker away for good
                    log.exception("%s: report failed", host.host_id)
                    await asyncio.sleep(1.0)
                finally:
                    host.queued = False
                    if host.outbox and host.token:
                        self._schedule(host)
        finally:
            conn.close()

    async def _send_batch(self, conn: Connection, host: SimHost) -> None:
        """One report: task snapshots in order, with any health that was queued before them (or
        one chaos result)."""
        batch, health, orders, taken = [], {}, [], 0
        for item in host.outbox[:REPORT_BATCH]:
            if "orders" in item:  # chaos results go alone
                if taken:
                    break
                orders, taken = item["orders"], 1
                break
            if "health" in item:
                if batch or set(item["health"]) & set(health):
                    break  # after a task snapshot, or a second change of one check: the next report
                health.update(item["health"])
            else:
                batch.append(item)
            taken += 1
        body = {"updates": batch, **({"health": health} if health else {}), **({"orders": orders} if orders else {})}
        try:
            status, answer = await conn.request("POST", "/v1/agent/report", host.token, body)
        except HttpError as err:
            status, answer = None, {"message": str(err)}
        self.stats.reports += 1
        if status == 403:  # deregistered: nothing it says matters any more
            host.outbox.clear()
            return
        if status is None or status >= 500 or status == 429:  # try again: snapshots are idempotent
            self.stats.errors += 1
            log.warning("%s: report failed (%s): %s", host.host_id, status, answer.get("message"))
            await asyncio.sleep(0.2 + self._rng.random())
            return
        del host.outbox[:taken]
        if status != 200:  # refused as malformed: sending it again would be refused again
            self.stats.errors += 1
            log.error("%s: report refused (%s): %s", host.host_id, status, answer.get("message"))
            return
        for state in answer.get("tasks", []):
            host.acknowledged(state)

    async def _heartbeats(self) -> None:
        """Optional periodic health reports, spread evenly over the interval."""
        while True:
            for host in list(self.hosts):
                if host.token and not host.silenced:
                    self._report_health(host, HEALTH_OK)
                await asyncio.sleep(self.heartbeat / max(1, len(self.hosts)))

