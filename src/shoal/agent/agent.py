"""The host agent: join the cluster, long-poll for what should run here, run it, report.

The control plane owns desired state; the agent owns the truth about local processes. Its loop
is the controller pattern: observe (a poll answer), diff (runners against desired tasks), act
(start a runner, or tell one its task should stop), and every step is idempotent. Reports go out
as transitions happen, in order, through one queue; the heartbeat is only a safety net.

On a GPU host it also runs one MPS control daemon per GPU and watches GPU health (MPS probes,
crashes, FAULT, Xids: shoal.agent.mps.supervisor and shoal.agent.accelerated); a change of the
ACCELERATED_COMPUTE check is reported at once, not at the next heartbeat.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import httpx

from shoal.agent import cgroups, chaos
from shoal.agent import host as hostinfo
from shoal.agent.accelerated import AWS_XIDS, AcceleratedCompute, XidWatcher
from shoal.agent.gpu.base import detect as detect_gpus
from shoal.agent.runtime import shims
from shoal.agent.runtime.files import write_atomic
from shoal.agent.runtime.forkserver import ForkServer
from shoal.agent.task_runner import TaskRunner

log = logging.getLogger(__name__)
POLL_WAIT = 20.0
HEARTBEAT = 15.0
IDENTITY = "agent.json"
REPORTED = "stopped.reported"  # in a task dir: the control plane has its STOPPED report
HOST_TERMINATED = "terminated"  # in a simulated host's data dir: written by the local provisioner


@dataclass
class AgentConfig:
    server: str
    join_token: str
    data_dir: Path
    cluster: str = "default"
    capacity_provider: str | None = None
    host_id: str | None = None
    instance_type: str | None = None
    availability_zone: str | None = None
    simulate: bool = False
    attributes: dict[str, str] = field(default_factory=dict)
    runtime: str = "process"
    fake_gpus: Path | None = None
    mps_control: str | None = None  # the MPS control binary; default: the fake on simulated GPUs, else on PATH
    mps_probe_interval: float = 5.0
    xid_set: frozenset[int] = frozenset(AWS_XIDS)


class Deregistered(Exception):
    """The control plane no longer knows this host's credential."""


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.tasks_dir = self.data_dir / "tasks"
        self.runners: dict[str, TaskRunner] = {}
        self.identity: dict | None = None
        self._outbox: list[dict] = []
        self._outbox_ready: asyncio.Event | None = None
        self._health_due: asyncio.Event | None = None
        self._health_changes: list[dict] = []  # changes not yet reported, oldest first
        self.mps = None  # MpsSupervisor on hosts with GPUs and an MPS control binary
        self.accelerated: AcceleratedCompute | None = None
        self.gpu_backend: str | None = None  # "fake" | "nvml"
        self._orders_seen: set[str] = set()  # chaos orders applied (or being applied) by this agent
        self._background: set[asyncio.Task] = set()

    @property
    def simulated(self) -> bool:
        """Whether faults injected here hurt nothing real (see shoal.agent.chaos)."""
        return self.config.simulate or self.gpu_backend == "fake"

    # -- setup -----------------------------------------------------------------------------
    def _backend(self):
        c = self.config
        return detect_gpus(fake_spec=c.fake_gpus, instance_type=c.instance_type if c.simulate else None,
                           state_dir=self.data_dir)

    def _runtime(self, gpus):
        layout = cgroups.detect(parent_name=f"shoal-{self.host}")
        index = {g.uuid: g.index for g in gpus}
        mps_env = self.mps.client_env if self.mps is not None else None
        if self.config.runtime == "podman":
            from shoal.agent.runtime.podman import PodmanRuntime

            return PodmanRuntime(gpu_index=index, mps_env=mps_env)
        from shoal.agent.runtime.process import ProcessRuntime

        return ProcessRuntime(layout=layout, cgroup_parent=f"shoal-{self.host}", gpu_index=index, mps_env=mps_env)

    def _mps(self, gpus):
        """The MPS supervisor, where this host has GPUs and an MPS control binary: the one given
        (--mps-control), `shoal-fake-mps-control` for simulated GPUs, else nvidia-cuda-mps-control
        on PATH. None otherwise: the host runs whole-GPU work only."""
        c = self.config
        if not gpus:
            return None
        from shoal.agent.mps import fake_control
        from shoal.agent.mps.manager import REAL_BINARY, MpsManager
        from shoal.agent.mps.supervisor import MpsSupervisor

        binary = c.mps_control
        if binary is not None:
            found = shutil.which(binary)
            if found is None:
                raise SystemExit(f"--mps-control {binary}: no such executable")
            binary = found
        elif c.simulate or c.fake_gpus:
            binary = fake_control.binary_path()
            if not os.access(binary, os.X_OK):
                log.warning("MPS: %s is not installed: no MPS on these simulated GPUs", binary)
                return None
        else:
            binary = shutil.which(REAL_BINARY)
            if binary is None:
                log.info("MPS: %s is not on PATH: no MPS on this host (whole GPUs only)", REAL_BINARY)
                return None
        daemon_env = {}
        if Path(binary).name.startswith("shoal-fake"):  # simulated machines: see fake_control
            daemon_env = {"SHOAL_FAKE_MPS_HOST_GONE": str(self.data_dir / HOST_TERMINATED),
                          "SHOAL_FAKE_MPS_IDLE_EXIT": f"{max(60.0, 12 * c.mps_probe_interval):g}"}
        manager = MpsManager(self.data_dir, binary, daemon_env=daemon_env)
        return MpsSupervisor(manager, gpus, interval=c.mps_probe_interval, health=self.accelerated,
                             tasks_on=self._mps_tasks)

    def _mps_tasks(self, uuid: str) -> list[TaskRunner]:
        return [r for r in self.runners.values() if not r.done.done() and r.mps_gpu == uuid]

    def _attributes(self, gpus) -> dict[str, str]:
        """The configured attributes, and the GPU health settings `shoal explain recovery` reads."""
        attributes = dict(self.config.attributes)
        if gpus:
            attributes["shoal.gpu.backend"] = self.gpu_backend
            attributes["shoal.gpu.xid-set"] = ",".join(str(x) for x in sorted(self.config.xid_set))
        if self.mps is not None:
            attributes["shoal.mps.probe-interval"] = f"{self.config.mps_probe_interval:g}"
        return attributes

    async def _register(self, client: httpx.AsyncClient, gpus) -> dict:
        c = self.config
        body = hostinfo.registration(
            cluster=c.cluster, capacity_provider=c.capacity_provider, host=self.host,
            instance_type=c.instance_type, availability_zone=c.availability_zone, simulate=c.simulate, gpus=gpus,
            attributes=self._attributes(gpus), enforced=self.runtime.enforced(), runtime=self.runtime.name,
            version=_version(),
            # Simulated GPUs come with a simulated MPS (the fake binary); real ones need the real binary.
            mps=self.mps is not None)
        r = await client.post("/v1/agent/register", json=body,
                              headers={"Authorization": f"Bearer {c.join_token}"})
        if r.status_code != 200:
            raise SystemExit(f"registration refused ({r.status_code}): {r.text}")
        identity = {**r.json(), "hostId": self.host}
        write_atomic(self.data_dir / IDENTITY, json.dumps(identity).encode())
        os.chmod(self.data_dir / IDENTITY, 0o600)
        return identity

    # -- main ------------------------------------------------------------------------------
    async def run(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / IDENTITY
        self.identity = json.loads(path.read_text()) if path.exists() else None
        self.host = self.identity["hostId"] if self.identity else hostinfo.host_id(self.data_dir, self.config.host_id)
        backend = self._backend()
        gpus = backend.devices() if backend else []
        self.gpu_backend = backend.name if backend else None
        self._outbox_ready = asyncio.Event()
        self._health_due = asyncio.Event()
        self.accelerated = AcceleratedCompute(self.data_dir, self.config.xid_set, self._health_changed)
        self.mps = self._mps(gpus)
        self.runtime = self._runtime(gpus)
        self.launcher = ForkServer(shims.shim_env())
        xids = XidWatcher(backend, self.accelerated.xid) if backend else None
        try:
            if self.mps is not None:
                await self.mps.start()  # one daemon per GPU (or the ones already running), before any task
            if xids is not None:
                xids.start()
            await self._serve(gpus)
        finally:
            if self.mps is not None:
                self.mps.close()  # the daemons keep serving their clients; the next agent adopts them
            if xids is not None:
                xids.stop()
            self.launcher.close()  # running shims do not depend on it
            if backend:
                backend.close()
            if getattr(self.runtime, "layout", None) is not None:  # what adopted tasks use stays
                cgroups.remove_parent(self.runtime.layout, f"shoal-{self.host}")

    async def _serve(self, gpus) -> None:
        async with httpx.AsyncClient(base_url=self.config.server, timeout=httpx.Timeout(10.0)) as client:
            if self.identity is None:
                self.identity = await self._register(client, gpus)
                log.info("registered as %s", self.identity["containerInstanceArn"])
            else:
                log.info("resuming as %s", self.identity["containerInstanceArn"])
            self.client = client
            self.auth = {"Authorization": f"Bearer {self.identity['token']}"}
            workers = [asyncio.create_task(self._send_reports()), asyncio.create_task(self._send_health()),
                       asyncio.create_task(self._heartbeat())]
            try:
                await self._poll_loop()
            finally:
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)

    async def _poll_loop(self) -> None:
        # since: the wake-up token of the last answer; cursor: its data position, so that the
        # next answer carries only what changed (the first one, after a restart too, is full).
        since, cursor, backoff = None, None, 0.2
        while True:
            try:
                r = await self.client.get("/v1/agent/poll", headers=self.auth, timeout=POLL_WAIT + 10,
                                          params={"since": since or "", "cursor": cursor or "", "wait": POLL_WAIT})
            except httpx.HTTPError as err:
                log.warning("poll failed (%s); retrying in %.1fs", err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if r.status_code == 403:
                log.warning("the control plane refused this host's credential: deregistered; stopping")
                return
            if r.status_code != 200:
                log.warning("poll answered %s: %s", r.status_code, r.text[:500])
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.2
            desired = r.json()
            since, cursor = desired["version"], desired["cursor"]
            self._reconcile(desired["tasks"])
            for order in desired.get("orders", []):
                self._chaos(order)
            if desired["status"] == "INACTIVE":
                log.warning("this host was deregistered; its tasks are left as they are; stopping")
                return

    def _reconcile(self, tasks: list[dict]) -> None:
        for spec in tasks:
            runner = self.runners.get(spec["taskArn"])
            if runner is not None:
                runner.set_desired(spec["desiredStatus"])
                continue
            task_dir = self.tasks_dir / spec["taskArn"].rsplit("/", 1)[-1]
            if spec["lastStatus"] == "STOPPED" or (task_dir / REPORTED).exists():
                continue  # over: stopped before this agent ran it, or it ran and was reported
            runner = TaskRunner(spec, task_dir, self.runtime, self._enqueue, self.launcher, mps=self.mps)
            self.runners[spec["taskArn"]] = runner
            runner.task = asyncio.get_running_loop().create_task(runner.run())  # held: the loop keeps weak refs

    def _chaos(self, order: dict) -> None:
        """Apply a chaos order once (answers repeat it until its result is in) and report how
        it went, retrying until the control plane has it."""
        if order["orderId"] in self._orders_seen:
            return
        self._orders_seen.add(order["orderId"])

        async def run() -> None:
            status, result = chaos.apply(self, order)
            backoff = 0.2
            while True:
                try:
                    await self._post_report({"orders": [{"orderId": order["orderId"], "status": status,
                                                         "result": result}]})
                    return
                except Deregistered:
                    return
                except httpx.HTTPError as err:
                    if isinstance(err, httpx.HTTPStatusError) and err.response.status_code < 500:
                        log.error("chaos result refused: %s", err.response.text[:300])  # it would be again
                        return
                    log.warning("chaos result report failed (%s); retrying in %.1fs", err, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- reporting -------------------------------------------------------------------------
    def _enqueue(self, snapshot: dict) -> None:
        self._outbox.append(snapshot)
        self._outbox_ready.set()

    def _health(self) -> dict:
        ok = {"status": "OK"}
        accelerated = self.accelerated.check() if self.accelerated is not None else ok
        return {"CONTAINER_RUNTIME": ok, "ACCELERATED_COMPUTE": accelerated, "DAEMON": ok, "AGENT_CONNECTIVITY": ok}

    def _health_changed(self) -> None:
        """A check changed: report it now, not at the next heartbeat, and this very picture: a
        crash that is repaired before the report goes out must still be reported."""
        health = self._health()
        log.info("health: ACCELERATED_COMPUTE %s", health["ACCELERATED_COMPUTE"])
        self._health_changes.append(health)
        self._health_due.set()

    async def _post_report(self, body: dict) -> dict:
        r = await self.client.post("/v1/agent/report", json=body, headers=self.auth)
        if r.status_code == 403:
            raise Deregistered(r.text)
        r.raise_for_status()
        return r.json()

    async def _send_reports(self) -> None:
        """Send queued snapshots in order, as one batch per round trip; retry until accepted."""
        backoff = 0.2
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox:
                batch = self._outbox[:100]
                try:
                    answer = await self._post_report({"updates": batch})
                except Deregistered:
                    return
                except httpx.HTTPError as err:
                    log.warning("report failed (%s); retrying in %.1fs", err, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                backoff = 0.2
                del self._outbox[:len(batch)]
                for state in answer["tasks"]:
                    self._acknowledged(state)

    def _acknowledged(self, state: dict) -> None:
        runner = self.runners.get(state["taskArn"])
        if state["lastStatus"] == "STOPPED" and runner is not None and runner.done.done():
            (runner.dir / REPORTED).touch()
            del self.runners[state["taskArn"]]

    async def _heartbeat(self) -> None:
        while True:
            self._health_due.set()
            await asyncio.sleep(HEARTBEAT)

    async def _send_health(self) -> None:
        """Every health report goes through here, one at a time: each change as it was, in order,
        then (heartbeats) the picture of the moment, so that a heartbeat never overtakes a change
        with an older picture and no transition is lost."""
        backoff = 0.2
        while True:
            await self._health_due.wait()
            self._health_due.clear()
            health = self._health_changes[0] if self._health_changes else self._health()
            try:
                try:
                    await self._post_report({"health": health})
                except httpx.HTTPStatusError as err:
                    if err.response.status_code != 400 or not health["ACCELERATED_COMPUTE"].get("gpus"):
                        raise
                    # GPUs the control plane does not know (replaced under a kept identity): the
                    # status still counts; only the per-GPU fencing is lost.
                    log.error("the control plane refused the impaired GPUs %s (%s); reporting without them",
                              health["ACCELERATED_COMPUTE"]["gpus"], err.response.text[:300])
                    health["ACCELERATED_COMPUTE"] = {**health["ACCELERATED_COMPUTE"], "gpus": []}
                    await self._post_report({"health": health})
            except Deregistered:
                return
            except httpx.HTTPError as err:
                log.warning("health report failed (%s); retrying in %.1fs", err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                self._health_due.set()
                continue
            backoff = 0.2
            if self._health_changes:
                self._health_changes.pop(0)
                if self._health_changes:
                    self._health_due.set()


def _version() -> str:
    try:
        return metadata.version("shoal")
    except metadata.PackageNotFoundError:
        return "0"
