"""Managed capacity: launch hosts when tasks wait for a managed capacity provider, retire idle ones.

Observe (managed providers, their hosts, the tasks waiting for them), diff (hosts wanted against
hosts live or on their way), act through the provisioner. Each provider's instance type is the
first of `managedInstancesProvider.instanceLaunchTemplate.instanceRequirements.allowedInstanceTypes`.
Two tags tune a provider: `shoal:min-hosts` (never fewer, default 0) and `shoal:scale-in-after`
(seconds a host must sit idle before it is retired; default the server's setting).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

from sqlalchemy import select

from shoal import catalog
from shoal.api.ecs.container_instances import emit_instance_change
from shoal.api.ecs.common import cluster_row
from shoal.api.operations import Context, dumps
from shoal.domain.tasks import stop_unstarted
from shoal.events.changes import emit_task_change
from shoal.providers import LaunchRequest, Provisioner, ProvisionerError
from shoal.scheduler.placement import task_definition
from shoal.scheduler.resources import HostCapacity, demand
from shoal.store.db import update_versioned
from shoal.store.tables import capacity_providers, container_instances as cis, tasks

log = logging.getLogger(__name__)
REGISTER_DEADLINE = 120.0  # a launched host that has not registered by then is given up on
WAIT_GRACE = 2.0  # a task counts as waiting for capacity once it has had this long to be placed
MIN_HOSTS_TAG, SCALE_IN_TAG = "shoal:min-hosts", "shoal:scale-in-after"


@dataclass
class ProviderView:
    name: str
    cluster: str
    instance_type: str | None
    min_hosts: int
    scale_in_after: float
    hosts: list[dict] = field(default_factory=list)  # {arn, hostId, status, idle}
    waiting_fit: int = 0  # waiting tasks that one host of the instance type could take


def instance_type_of(doc: dict) -> str | None:
    requirements = (doc.get("managedInstancesProvider", {}).get("instanceLaunchTemplate", {})
                    .get("instanceRequirements") or {})
    allowed = requirements.get("allowedInstanceTypes") or []
    return allowed[0] if allowed else None


def _empty_host(instance_type: str) -> HostCapacity | None:
    try:
        spec = catalog.get(instance_type)
    except KeyError:
        return None
    registered = [{"name": "CPU", "integerValue": spec.vcpus * 1024}, {"name": "MEMORY",
                  "integerValue": int(spec.memory_gib * 1024)}, {"name": "PORTS", "stringSetValue": ["22"]},
                  {"name": "PORTS_UDP", "stringSetValue": []}]
    gpus = spec.gpu.count if spec.gpu else 0
    devices = [{"gpuId": f"gpu{i}", "totalMemoryInMiB": spec.gpu.memory_mib} for i in range(gpus)]
    if gpus:
        registered.append({"name": "GPU", "stringSetValue": [d["gpuId"] for d in devices]})
    return HostCapacity("", registered, devices, {})


class CapacityController:
    def __init__(self, provisioner: Provisioner, join_token: str, *, server_url: str | None = None,
                 scale_in_after: float = 300.0):
        self.provisioner, self.join_token = provisioner, join_token
        self.server_url = server_url  # set once the server knows the port it listens on
        self.scale_in_after = scale_in_after
        self.launching: dict[str, tuple[str, float]] = {}  # host id -> (provider, deadline)
        self.idle_since: dict[str, float] = {}

    def expect(self, host_id: str, provider: str) -> None:
        """A host launched for `provider` elsewhere (a repair's replacement): count it as coming,
        and give up on it if it never registers."""
        self.launching[host_id] = (provider, time.monotonic() + REGISTER_DEADLINE)

    async def reconcile(self, hub) -> None:
        if self.server_url is None:
            return
        providers = await hub.store.read(lambda conn: self._observe(Context(conn, hub.arns)))
        now = time.monotonic()
        for view in providers:
            registered = {h["hostId"] for h in view.hosts}
            for host_id, (name, deadline) in list(self.launching.items()):
                if host_id in registered:
                    del self.launching[host_id]
                elif name == view.name and now > deadline:
                    log.warning("host %s of %s never registered; terminating it", host_id, name)
                    del self.launching[host_id]
                    await asyncio.to_thread(self.provisioner.terminate, host_id)
            await self._forget_vanished(hub, view)
            await self._scale_out(view)
            await self._scale_in(hub, view, now)

    def _observe(self, ctx: Context) -> list[ProviderView]:
        views = []
        for row in ctx.conn.execute(select(capacity_providers).where(capacity_providers.c.status == "ACTIVE",
                                                                     capacity_providers.c.kind == "MANAGED_INSTANCES")):
            doc = json.loads(row.doc)
            tags = {t["key"]: t["value"] for t in doc.get("tags", [])}
            view = ProviderView(row.name, row.cluster_name, instance_type_of(doc),
                                int(tags.get(MIN_HOSTS_TAG, 0) or 0),
                                float(tags.get(SCALE_IN_TAG, self.scale_in_after)))
            for host in ctx.conn.execute(select(cis).where(cis.c.capacity_provider_name == row.name,
                                                           cis.c.status != "INACTIVE")):
                view.hosts.append({"arn": host.arn, "hostId": host.ec2_instance_id, "status": host.status,
                                   "idle": _idle(ctx, host),
                                   "connected": json.loads(host.doc).get("agentConnected", False)})
            empty = _empty_host(view.instance_type) if view.instance_type else None
            for task in ctx.conn.execute(select(tasks.c.doc, tasks.c.placement).where(
                    tasks.c.cluster_name == row.cluster_name, tasks.c.desired_status == "RUNNING",
                    tasks.c.container_instance_arn.is_(None), tasks.c.last_status == "PROVISIONING",
                    tasks.c.created_at < time.time() - WAIT_GRACE)):
                strategy = json.loads(task.placement or "{}").get("capacityProviderStrategy", [])
                if empty is None or row.name not in {s["capacityProvider"] for s in strategy}:
                    continue
                tdoc = json.loads(task.doc)
                if empty.fit(demand(tdoc, task_definition(ctx, tdoc["taskDefinitionArn"])))[0] is not None:
                    view.waiting_fit += 1
            views.append(view)
        return views

    async def _forget_vanished(self, hub, view: ProviderView) -> None:
        """A host that its provisioner no longer has and whose agent is silent is gone: deregister
        it and stop what it ran, so that its capacity is no longer counted."""
        candidates = [h for h in view.hosts if not h["connected"] and h["hostId"] not in self.launching]
        if not candidates:
            return
        present = {h.host_id for h in await asyncio.to_thread(self.provisioner.list)}
        for host in candidates:
            if host["hostId"] not in present:
                log.warning("host %s of %s is gone; deregistering it", host["hostId"], view.name)
                await hub.write(lambda ctx, arn=host["arn"]: retire_host(ctx, arn, vanished=True))
                view.hosts.remove(host)

    async def _scale_out(self, view: ProviderView) -> None:
        if view.instance_type is None:
            return
        # A draining or failed host still counts: a repair replaces it (shoal.control.repair).
        live = sum(h["status"] in ("REGISTERING", "ACTIVE", "DRAINING", "REGISTRATION_FAILED") for h in view.hosts)
        coming = sum(name == view.name for name, _ in self.launching.values())
        want = max(view.min_hosts - live - coming, 0)
        if view.waiting_fit and not coming:
            want = max(want, 1)  # one more host at a time while tasks wait: it may take them all
        if not want:
            return
        request = LaunchRequest(view.instance_type, want, view.cluster, view.name, self.server_url, self.join_token)
        try:
            launched = await asyncio.to_thread(self.provisioner.launch, request)
        except ProvisionerError as err:
            log.error("could not launch %d × %s for %s: %s", want, view.instance_type, view.name, err)
            return
        deadline = time.monotonic() + REGISTER_DEADLINE
        for host in launched:
            log.info("launched %s (%s) for %s", host.host_id, host.instance_type, view.name)
            self.launching[host.host_id] = (view.name, deadline)

    async def _scale_in(self, hub, view: ProviderView, now: float) -> None:
        active = [h for h in view.hosts if h["status"] == "ACTIVE"]
        for host in active:
            if not host["idle"] or view.waiting_fit:
                self.idle_since.pop(host["arn"], None)
                continue
            since = self.idle_since.setdefault(host["arn"], now)
            if now - since < view.scale_in_after or len(active) <= view.min_hosts:
                continue
            if await hub.write(lambda ctx, arn=host["arn"]: retire_host(ctx, arn)):
                log.info("retiring idle host %s of %s", host["hostId"], view.name)
                active.remove(host)
                self.idle_since.pop(host["arn"], None)
                await asyncio.to_thread(self.provisioner.terminate, host["hostId"])


def _idle(ctx: Context, host) -> bool:
    """No application task holds anything on the host (its daemons' tasks do not count)."""
    held = set(json.loads(host.allocations or "{}"))
    if not held:
        return True
    daemon_tasks = set(ctx.conn.execute(select(tasks.c.arn).where(
        tasks.c.container_instance_arn == host.arn, tasks.c.daemon_name.is_not(None))).scalars())
    return held <= daemon_tasks


def retire_host(ctx: Context, arn: str, *, vanished: bool = False) -> bool:
    """Deregister a host: an idle one only if it is still idle (placement may have just used it);
    a vanished one whatever it held. Its unfinished tasks (an idle host's daemons) are marked
    STOPPED. True if done."""
    row = ctx.conn.execute(select(cis).where(cis.c.arn == arn).with_for_update()).first()
    if row is None or row.status == "INACTIVE" or (not vanished and (row.status != "ACTIVE" or not _idle(ctx, row))):
        return False
    doc = json.loads(row.doc)
    doc.update(status="INACTIVE", agentConnected=False, version=doc["version"] + 1)
    update_versioned(ctx.conn, cis, {"arn": arn}, row.version, status="INACTIVE", allocations="{}", doc=dumps(doc))
    emit_instance_change(ctx, cluster_row(ctx, row.cluster_name), doc)
    ctx.tell_agent(arn)
    for task in ctx.conn.execute(select(tasks).where(tasks.c.container_instance_arn == arn,
                                                     tasks.c.last_status != "STOPPED").with_for_update()).all():
        tdoc = stop_unstarted(json.loads(task.doc), f"Host {row.ec2_instance_id} was terminated",
                              "TerminationNotice", ctx.now)
        update_versioned(ctx.conn, tasks, {"arn": task.arn}, task.version, last_status="STOPPED",
                         desired_status="STOPPED", doc=dumps(tdoc))
        ctx.tell_agent(arn, task.arn)
        emit_task_change(ctx, tdoc)
    return True
