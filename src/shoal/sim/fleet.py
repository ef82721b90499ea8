"""Simulated fleets for tests and benchmarks: thousands of hosts in this process, against a real
`shoal server`.

    from shoal.sim import HostSpec, SimFleet, TaskModel

    specs = [HostSpec("p5.48xlarge", 100, zones=["a", "b", "c"]), HostSpec("g6e.xlarge", 1000)]
    with SimFleet(url, join_token, "gpu", specs, TaskModel(run_time=30, seed=7)) as fleet:
        fleet.wait_active_blocking(timeout=60)   # every host ACTIVE
        ...                                        # boto3 calls against the server
    # leaving the block stops the emulator; the hosts stay registered (their agents are "lost")

From async code: `async with SimFleet(...) as fleet: await fleet.wait_active()`.
The sync form runs the emulator's event loop on a background thread (uvloop where installed).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from shoal import catalog
from shoal.sim.emulator import Emulator, Stats
from shoal.sim.host import SimHost
from shoal.sim.model import TaskModel


@dataclass(frozen=True)
class HostSpec:
    """`count` hosts of `instance_type` (a catalog type); zones are dealt round-robin. With
    `vcpus` and `memory_gib`, a CPU-only host of any type name (the catalog has GPU types only)."""
    instance_type: str
    count: int
    capacity_provider: str | None = None
    zones: Sequence[str] = ()
    attributes: Mapping[str, str] = field(default_factory=dict)
    vcpus: int | None = None
    memory_gib: float | None = None

    def __post_init__(self):
        if (self.vcpus is None) != (self.memory_gib is None):
            raise ValueError(f"{self.instance_type}: give both vcpus and memory_gib, or neither")
        if self.vcpus is None:
            catalog.get(self.instance_type)  # UnknownInstanceType (a KeyError) names close matches
        if self.count < 0:
            raise ValueError(f"{self.instance_type}: count must be >= 0, got {self.count}")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed: cheaper per connection with thousands of long-polls."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class SimFleet:
    """Simulated hosts that join `cluster` with `join_token` and run tasks by `model`.

    `poll_wait` is each host's long-poll wait (jittered down by up to 20%): it must stay below
    the server's --agent-timeout (default 30 s), or idle hosts are marked disconnected. 20 s
    suits the default; at thousands of hosts use 60 s with --agent-timeout 90.
    `mps_probe_interval`: the modelled agents' MPS probe interval (a `shoal chaos mps --mode
    hang` is reported after three of them; see shoal.sim.faults).
    """

    def __init__(self, server_url: str, join_token: str, cluster: str = "default",
                 specs: Sequence[HostSpec] = (), model: TaskModel | None = None, *, poll_wait: float = 20.0,
                 heartbeat: float | None = None, concurrency: int = 64, prefix: str | None = None,
                 mps_probe_interval: float = 5.0):
        if not 0 < poll_wait <= 60:
            raise ValueError("poll_wait: seconds, at most 60 (the server's longest long-poll)")
        self.model = model or TaskModel()
        self.prefix = prefix or f"sim-{secrets.token_hex(3)}"  # host ids differ from any earlier fleet's
        self.hosts: list[SimHost] = []
        for spec in specs:
            for i in range(spec.count):
                index = len(self.hosts)
                self.hosts.append(SimHost(
                    index=index, host_id=f"{self.prefix}-{index:05d}", cluster=cluster,
                    instance_type=spec.instance_type, zone=spec.zones[i % len(spec.zones)] if spec.zones else None,
                    capacity_provider=spec.capacity_provider, attributes=dict(spec.attributes), model=self.model,
                    shape=(spec.vcpus, spec.memory_gib) if spec.vcpus is not None else None))
        self.emulator = Emulator(server_url, join_token, self.hosts, poll_wait=poll_wait, heartbeat=heartbeat,
                                 concurrency=concurrency, seed=self.model.seed,
                                 mps_probe_interval=mps_probe_interval)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- what the fleet is -------------------------------------------------------------------
    @property
    def arns(self) -> list[str]:
        """Container instance ARNs, in host order (None for a host not registered yet)."""
        return [h.arn for h in self.hosts]

    @property
    def host_ids(self) -> list[str]:
        return [h.host_id for h in self.hosts]

    @property
    def stats(self) -> Stats:
        return self.emulator.stats

    def host(self, key: str) -> SimHost:
        """The host with this host id (ec2InstanceId) or container instance ARN."""
        for h in self.hosts:
            if key in (h.host_id, h.arn):
                return h
        raise KeyError(key)

    # -- async API ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Register every host (a bounded number at a time); they poll as soon as registered."""
        await self.emulator.start()

    async def wait_active(self, timeout: float | None = None) -> None:
        await self.emulator.wait_active(timeout)

    async def stop(self) -> None:
        await self.emulator.stop()

    async def __aenter__(self) -> "SimFleet":
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # -- faults (thread-safe) ----------------------------------------------------------------
    def set_health(self, host: str, kind: str, status: str, reason: str | None = None) -> None:
        """Have `host` report health check `kind` (e.g. ACCELERATED_COMPUTE) as `status`."""
        self._on_loop(self.emulator.set_health, self.host(host), kind, status, reason)

    def silence(self, host: str) -> None:
        """Make `host`'s agent lost: no more polls or reports."""
        self._on_loop(self.emulator.silence, self.host(host))

    def _on_loop(self, fn, *args) -> None:
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._loop.call_soon_threadsafe(fn, *args)
        else:
            fn(*args)

    # -- sync API: the emulator on a background thread ---------------------------------------
    def start_background(self) -> "SimFleet":
        if self._thread is not None:
            raise RuntimeError("the fleet is already running")
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="shoal-sim", daemon=True)
        self._thread.start()
        try:
            self._call(self.start())
        except BaseException:
            self.stop_background()
            raise
        return self

    def wait_active_blocking(self, timeout: float | None = None) -> None:
        self._call(self.wait_active(timeout))

    def stop_background(self) -> None:
        if self._thread is None:
            return
        try:
            self._call(self.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
            self._thread = self._loop = None

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> "SimFleet":
        return self.start_background()

    def __exit__(self, *exc) -> None:
        self.stop_background()
