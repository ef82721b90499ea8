"""The agent protocol's units of work: register a host, read its desired state, apply what its
agent reports. Each runs in one store transaction, like an ECS operation, and writes its events
in that transaction."""

from __future__ import annotations

import hashlib
import re

from sqlalchemy import bindparam, insert, select, update

from shoal import jsonio
from shoal.api.ecs.common import cluster_row
from shoal.api.ecs.container_instances import HEALTH_CHECKS, emit_health_change, emit_instance_change, initial_health
from shoal.api.operations import Context, dumps
from shoal.control import chaos
from shoal.domain import arns, health
from shoal.domain.errors import AuthError, InvalidParameter
from shoal.events import action_log
from shoal.events.changes import task_change_detail
from shoal.events.envelope import TASK_STATE_CHANGE, iso
from shoal.scheduler.placement import host_changed, release, task_definition
from shoal.store.db import StaleWrite, update_versioned
from shoal.store.prepared import Prepared
from shoal.store.tables import (capacity_providers, container_instances as cis, daemon_capacity_providers as daemon_cps,
                                tasks)

HOST_ID_RE = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")
MAX_CUSTOM_ATTRIBUTES = 10
# lastStatus in lifecycle order: an agent's report never moves a task backwards.
TASK_ORDER = ("PROVISIONING", "PENDING", "ACTIVATING", "RUNNING", "DEACTIVATING", "STOPPING",
              "DEPROVISIONING", "STOPPED")
CONTAINER_ORDER = ("PENDING", "RUNNING", "STOPPED")
CONTAINER_FIELDS = ("lastStatus", "exitCode", "reason", "runtimeId", "healthStatus")
TASK_TIMES = ("pullStartedAt", "pullStoppedAt", "startedAt", "connectivityAt", "stoppingAt",
              "executionStoppedAt", "stoppedAt")
CHECK_STATUSES = ("OK", "IMPAIRED", "INSUFFICIENT_DATA", "INITIALIZING")

# Every poll and every report runs these (thousands of hosts): see shoal.store.prepared. A host
# is read without its allocations, the one column that grows with its tasks.
_HOST_COLUMNS = (cis.c.arn, cis.c.cluster_name, cis.c.status, cis.c.version, cis.c.capacity_provider_name, cis.c.doc)
_PROVIDER_DAEMON = Prepared(select(daemon_cps.c.daemon_arn).where(
    daemon_cps.c.capacity_provider_name == bindparam("provider")).limit(1))
_HOST_BY_TOKEN = Prepared(select(*_HOST_COLUMNS).where(cis.c.agent_token_hash == bindparam("token_hash")))
_HOST_BY_TOKEN_FOR_UPDATE = Prepared(select(*_HOST_COLUMNS).where(cis.c.agent_token_hash == bindparam("token_hash"))
                                     .with_for_update())
_HOST_STATUS = Prepared(select(cis.c.status, cis.c.desired_seq, cis.c.orders_seq, cis.c.doc)
                        .where(cis.c.arn == bindparam("host")))
_TASKS_ON_HOST = Prepared(select(tasks.c.doc, tasks.c.host_seq).where(
    tasks.c.container_instance_arn == bindparam("host"), tasks.c.last_status != "STOPPED"))
_TASKS_CHANGED = Prepared(select(tasks.c.doc, tasks.c.host_seq).where(
    tasks.c.container_instance_arn == bindparam("host"), tasks.c.host_seq > bindparam("cursor")))
_REPORT_CHUNK = 50  # tasks read by one statement
_TASKS_FOR_UPDATE: dict[int, Prepared] = {}  # by the number of tasks


def _tasks_for_update(n: int) -> Prepared:
    found = _TASKS_FOR_UPDATE.get(n)
    if found is None:
        found = _TASKS_FOR_UPDATE[n] = Prepared(
            select(tasks.c.arn, tasks.c.version, tasks.c.container_instance_arn, tasks.c.cluster_name,
                   tasks.c.service_name, tasks.c.last_status, tasks.c.desired_status, tasks.c.doc)
            .where(tasks.c.arn.in_([bindparam(f"t{i}") for i in range(n)])).with_for_update())
    return found


def _write_task(statuses: tuple[str, ...]) -> Prepared:
    """The UPDATE of a reported task that sets these status columns: only those that changed,
    since each is in an index that SQLite rewrites whenever the column is set."""
    values = dict(version=bindparam("next_version"), doc=bindparam("new_doc"))
    values.update({column: bindparam(f"new_{column}") for column in statuses})
    return Prepared(update(tasks).where(tasks.c.arn == bindparam("task"), tasks.c.version == bindparam("expected"))
                    .values(**values))


_WRITE_TASK = {statuses: _write_task(statuses)
               for statuses in ((), ("last_status",), ("desired_status",), ("last_status", "desired_status"))}


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _denied(message: str) -> AuthError:
    return AuthError(message, "AccessDeniedException")


def denied_credential() -> AuthError:
    return _denied("The host credential is not valid (unknown, or the host was deregistered).")


def host_for_token(ctx: Context, token: str, *, for_update: bool = False, hashed: str | None = None):
    """The host row (arn, cluster_name, status, version, doc) that this credential belongs to
    (`hashed`: the token's hash, when the caller has it already)."""
    row = (_HOST_BY_TOKEN_FOR_UPDATE if for_update else _HOST_BY_TOKEN).first(
        ctx.conn, {"token_hash": hashed or token_hash(token)})
    if row is None or row.status == "INACTIVE":
        raise denied_credential()
    return row


def _int(body: dict, key: str, field: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidParameter(f"Invalid parameter '{field}': expected a non-negative integer, got {value!r}.")
    return value


def _ports(values, field: str) -> list[str]:
    if not isinstance(values, list) or not all(isinstance(p, int) and 0 < p < 65536 for p in values):
        raise InvalidParameter(f"Invalid parameter '{field}': expected a list of port numbers.")
    return sorted({str(p) for p in values}, key=int)


def register(ctx: Context, body: dict, token: str) -> dict:
    """A host joins: create its container instance (REGISTERING) and its credential."""
    if body.get("cluster") is not None and not isinstance(body["cluster"], str):
        raise InvalidParameter("Invalid parameter 'cluster': expected a cluster name or ARN.")
    cluster = cluster_row(ctx, body.get("cluster"), lock="share")
    host_id = body.get("hostId")
    if not isinstance(host_id, str) or not HOST_ID_RE.match(host_id):
        raise InvalidParameter("Invalid parameter 'hostId': 1 to 64 letters, digits, '.', '_' or '-'.")
    provider = body.get("capacityProvider")
    if provider is not None:
        row = ctx.conn.execute(select(capacity_providers).where(capacity_providers.c.name == provider)).first()
        if row is None or row.status != "ACTIVE" or provider not in jsonio.loads(cluster.doc)["capacityProviders"]:
            raise InvalidParameter(f"Invalid parameter 'capacityProvider': '{provider}' is not a capacity provider "
                                   f"of cluster '{cluster.name}'.")
    res = body.get("resources") or {}
    if not isinstance(res, dict):
        raise InvalidParameter("Invalid parameter 'resources': expected an object {cpu, memory, ports, udpPorts}.")
    registered = [
        {"name": "CPU", "type": "INTEGER", "integerValue": _int(res, "cpu", "resources.cpu")},
        {"name": "MEMORY", "type": "INTEGER", "integerValue": _int(res, "memory", "resources.memory")},
        {"name": "PORTS", "type": "STRINGSET", "stringSetValue": _ports(res.get("ports", []), "resources.ports")},
        {"name": "PORTS_UDP", "type": "STRINGSET",
         "stringSetValue": _ports(res.get("udpPorts", []), "resources.udpPorts")},
    ]
    gpus = body.get("gpus") or []
    if not isinstance(gpus, list):
        raise InvalidParameter("Invalid parameter 'gpus': expected a list of GPUs.")
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict) or not isinstance(gpu.get("uuid"), str):
            raise InvalidParameter(f"Invalid parameter 'gpus[{i}].uuid': expected the GPU's UUID.")
        _int(gpu, "memoryMiB", f"gpus[{i}].memoryMiB")
    if len({g["uuid"] for g in gpus}) != len(gpus):
        raise InvalidParameter("Invalid parameter 'gpus': a GPU uuid is listed twice.")
    if gpus:
        registered.append({"name": "GPU", "type": "STRINGSET", "stringSetValue": [g["uuid"] for g in gpus]})
    attributes = [{"name": "ecs.os-type", "value": "linux"},
                  {"name": "ecs.cpu-architecture", "value": str(body.get("architecture") or "x86_64")}]
    if body.get("instanceType"):
        attributes.append({"name": "ecs.instance-type", "value": str(body["instanceType"])})
    if body.get("availabilityZone"):  # spread and memberOf read it, as on ECS
        attributes.append({"name": "ecs.availability-zone", "value": str(body["availabilityZone"])})
    custom = body.get("attributes") or []
    for i, attr in enumerate(custom):
        name = attr.get("name") if isinstance(attr, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidParameter(f"Invalid parameter 'attributes[{i}].name': required.")
        if name.startswith("ecs.") and not name.startswith("ecs.capability."):
            raise InvalidParameter(f"Invalid parameter 'attributes[{i}].name': the 'ecs.' prefix is reserved.")
    if sum(not a["name"].startswith(("ecs.", "shoal.")) for a in custom) > MAX_CUSTOM_ATTRIBUTES:
        raise InvalidParameter(f"Invalid parameter 'attributes': at most {MAX_CUSTOM_ATTRIBUTES} custom attributes.")
    attributes += [{"name": a["name"], **({"value": str(a["value"])} if a.get("value") is not None else {})}
                   for a in custom]
    instance_id = arns.new_id()
    arn = ctx.arns.container_instance(cluster.name, instance_id)
    doc = {
        "containerInstanceArn": arn,
        "ec2InstanceId": host_id,
        "version": 1,
        "versionInfo": body.get("versionInfo") or {},
        "remainingResources": registered,
        "registeredResources": registered,
        "status": "REGISTERING",
        "agentConnected": True,
        "runningTasksCount": 0,
        "pendingTasksCount": 0,
        "attributes": attributes,
        "registeredAt": ctx.now,
        "attachments": [],
        "tags": [],
        "healthStatus": initial_health(ctx.now),
        "gpuDevices": [{"gpuId": g["uuid"], "sharingMode": "IDLE", "containerCount": 0,
                        "totalMemoryInMiB": g["memoryMiB"], "remainingMemoryInMiB": g["memoryMiB"]} for g in gpus],
    }
    if provider:
        doc["capacityProviderName"] = provider
    ctx.conn.execute(insert(cis).values(
        arn=arn, id=instance_id, cluster_name=cluster.name, ec2_instance_id=host_id, status="REGISTERING",
        capacity_provider_name=provider, registered_at=ctx.now, version=1, doc=dumps(doc),
        agent_token_hash=token_hash(token), allocations="{}"))
    emit_instance_change(ctx, cluster, doc)
    return {"containerInstanceArn": arn, "cluster": cluster.name}


def _cluster_of(ctx: Context, host):
    return cluster_row(ctx, host.cluster_name)


def connected(ctx: Context, token: str) -> str:
    """A poll arrived: the agent is connected. Returns the host's ARN."""
    host = host_for_token(ctx, token, for_update=True)
    doc = jsonio.loads(host.doc)
    if not doc.get("agentConnected"):
        doc.update(agentConnected=True, version=doc["version"] + 1)
        changed = _connectivity(ctx, doc, "OK", None)
        update_versioned(ctx.conn, cis, {"arn": host.arn}, host.version, doc=dumps(doc))
        cluster = _cluster_of(ctx, host)
        emit_instance_change(ctx, cluster, doc)
        if changed:
            emit_health_change(ctx, cluster, doc)
        ctx.dirty_clusters.add(host.cluster_name)
    return host.arn


def _connectivity(ctx: Context, doc: dict, status: str, reason: str | None) -> bool:
    """The AGENT_CONNECTIVITY check follows the agent's connection (once the host is in service)."""
    if doc.get("status") == "REGISTERING" or "healthStatus" not in doc:
        return False
    return health.set_check(doc["healthStatus"], "AGENT_CONNECTIVITY", status, reason, ctx.now)


def disconnected(ctx: Context, host_arn: str) -> None:
    """No poll for too long: the agent is lost. Only connected agents get new tasks."""
    host = ctx.conn.execute(select(cis).where(cis.c.arn == host_arn).with_for_update()).first()
    if host is None or host.status == "INACTIVE":
        return
    doc = jsonio.loads(host.doc)
    if doc.get("agentConnected"):
        doc.update(agentConnected=False, version=doc["version"] + 1)
        changed = _connectivity(ctx, doc, "IMPAIRED", f"Agent disconnected since {iso(ctx.now)}")
        update_versioned(ctx.conn, cis, {"arn": host.arn}, host.version, doc=dumps(doc))
        cluster = _cluster_of(ctx, host)
        emit_instance_change(ctx, cluster, doc)
        if changed:
            emit_health_change(ctx, cluster, doc)


def desired_state(ctx: Context, host_arn: str, cursor: int | None = None) -> tuple[dict, bool]:
    """What the host's agent should run, and whether the host is marked connected. Without a
    cursor, every task on the host that has not stopped (`full`); with the cursor of an earlier
    answer, the tasks whose desired state changed since, stopped ones included (see
    shoal.api.agent.desired)."""
    # The sequence first: a change that commits between the two reads is then sent again next
    # time rather than never. So the two need not see one snapshot (the poll runs them without
    # a transaction around them).
    host = _HOST_STATUS.first(ctx.conn, {"host": host_arn})
    if cursor is None or cursor > host.desired_seq:  # (a cursor from a recreated database)
        rows, full = _TASKS_ON_HOST.all(ctx.conn, {"host": host_arn}), True
    else:
        rows, full = _TASKS_CHANGED.all(ctx.conn, {"host": host_arn, "cursor": cursor}), False
    out = []
    for text, seq in rows:
        doc = jsonio.loads(text)
        td = task_definition(ctx, doc["taskDefinitionArn"])
        out.append({
            "taskArn": doc["taskArn"], "desiredStatus": doc["desiredStatus"], "lastStatus": doc["lastStatus"],
            "version": doc["version"], "cpu": doc.get("cpu"), "memory": doc.get("memory"),
            "overrides": doc.get("overrides", {}), "family": td["family"], "revision": td["revision"],
            "containerDefinitions": td["containerDefinitions"],
            "containers": [{k: c[k] for k in ("name", "containerArn", "gpuIds") if k in c} for c in doc["containers"]],
            "stopCode": doc.get("stopCode"), "stoppedReason": doc.get("stoppedReason"), "seq": seq,
        })
    answer = {"status": host.status, "cursor": host.desired_seq, "full": full, "tasks": out}
    orders = chaos.for_poll(ctx.conn, host_arn, host.orders_seq, None if full else cursor)
    if orders:
        answer["orders"] = orders
    return answer, bool(jsonio.loads(host.doc).get("agentConnected"))


def _merge_container(current: dict, reported: dict) -> dict:
    merged = dict(current)
    for key in CONTAINER_FIELDS:
        if key in reported and reported[key] is not None:
            merged[key] = reported[key]
    if CONTAINER_ORDER.index(merged["lastStatus"]) < CONTAINER_ORDER.index(current["lastStatus"]):
        merged["lastStatus"] = current["lastStatus"]
    return merged


def _container_snapshots(containers) -> dict[str, dict]:
    if not isinstance(containers, list):
        raise InvalidParameter("Invalid parameter 'updates[].containers': expected a list of container snapshots.")
    reported = {}
    for c in containers:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise InvalidParameter("Invalid parameter 'updates[].containers[].name': expected the container's name.")
        if c.get("lastStatus") is not None and c["lastStatus"] not in CONTAINER_ORDER:
            raise InvalidParameter(f"Invalid parameter 'updates[].containers[].lastStatus': unknown container "
                                   f"status {c['lastStatus']!r}.")
        reported[c["name"]] = c
    return reported


def _without_health(doc: dict) -> dict:
    """The task document without its health: what a task state change is made of."""
    return {**doc, "healthStatus": None, "containers": [{**c, "healthStatus": None} for c in doc["containers"]]}


class _ReportedTasks:
    """The tasks one report names: their rows read together (locked), each snapshot applied in
    order to the document in memory, then each changed task written once and the events written
    in one statement. A report of a dozen tasks costs a few statements, not a few dozen."""

    def __init__(self, ctx: Context, host, updates: list):
        self.ctx, self.host = ctx, host
        names = list(dict.fromkeys(u["taskArn"] for u in updates if isinstance(u, dict)
                                   and isinstance(u.get("taskArn"), str)))
        self.rows = {}
        for start in range(0, len(names), _REPORT_CHUNK):
            chunk = names[start:start + _REPORT_CHUNK]
            self.rows.update((row.arn, row) for row in _tasks_for_update(len(chunk)).all(
                ctx.conn, {f"t{i}": arn for i, arn in enumerate(chunk)}))
        self.docs: dict[str, dict] = {}  # task ARN -> its document as the snapshots so far leave it
        self.moved: set[str] = set()  # tasks whose state changed (not only their health)
        self.events: list[tuple[list[str], dict]] = []

    def apply(self, update: dict) -> dict:
        """Apply one task snapshot from the host's agent; return the task's state after it.

        Snapshots arrive in the order the agent saw the transitions; each one that changes the
        task's state moves its version and makes one "ECS Task State Change" event."""
        arn = update.get("taskArn")
        if not isinstance(arn, str) or not arn:
            raise InvalidParameter("Invalid parameter 'updates[].taskArn': required, the task's ARN.")
        row = self.rows.get(arn)
        if row is None or row.container_instance_arn != self.host.arn:
            raise _denied(f"Task '{arn}' is not on this host: a host's credential reaches its own tasks only.")
        doc = self.docs.get(arn) or jsonio.loads(row.doc)
        if doc["lastStatus"] == "STOPPED":
            return {"taskArn": arn, "lastStatus": "STOPPED", "desiredStatus": "STOPPED", "version": doc["version"]}
        status = update.get("lastStatus", doc["lastStatus"])
        if status not in TASK_ORDER:
            raise InvalidParameter(f"Invalid parameter 'updates[].lastStatus': unknown task status {status!r}.")
        before = dict(doc)  # what follows replaces the fields it changes (containers too), never mutates them
        if TASK_ORDER.index(status) > TASK_ORDER.index(doc["lastStatus"]):
            doc["lastStatus"] = status
        reported = _container_snapshots(update.get("containers", []))
        doc["containers"] = [_merge_container(c, reported[c["name"]]) if c["name"] in reported else c
                             for c in doc["containers"]]
        for key in TASK_TIMES:
            if update.get(key) is not None and key not in doc:
                doc[key] = update[key]
        if doc["lastStatus"] in ("STOPPING", "STOPPED") and doc["desiredStatus"] != "STOPPED":
            # The task stops on its own (an essential container exited): that is now what is wanted.
            doc["desiredStatus"] = "STOPPED"
            doc.setdefault("stoppingAt", update.get("stoppingAt") or self.ctx.now)
        if doc["desiredStatus"] == "STOPPED" and "stopCode" not in doc and update.get("stopCode"):
            doc["stopCode"] = update["stopCode"]  # a stop the user asked for keeps UserInitiated
            doc["stoppedReason"] = str(update.get("stoppedReason") or "")[:1024]
        if update.get("healthStatus") in ("HEALTHY", "UNHEALTHY", "UNKNOWN"):
            doc["healthStatus"] = update["healthStatus"]
        if doc != before:
            self.docs[arn] = doc
            # Health alone is not a state change (task events carry no health): no new version, no event.
            if _without_health(doc) != _without_health(before):
                doc["version"] += 1
                self.moved.add(arn)
                self.events.append(([arn], task_change_detail(self.ctx, doc)))
        return {"taskArn": arn, "lastStatus": doc["lastStatus"], "desiredStatus": doc["desiredStatus"],
                "version": doc["version"]}

    def write(self) -> None:
        """Each changed task once (one statement per set of status columns that moved), then the
        events, then what stopped tasks held on the host."""
        writes: dict[tuple[str, ...], list[dict]] = {}
        for arn, doc in self.docs.items():
            row = self.rows[arn]
            statuses = {"last_status": doc["lastStatus"], "desired_status": doc["desiredStatus"]}
            changed = tuple(column for column in statuses if statuses[column] != getattr(row, column))
            writes.setdefault(changed, []).append({
                "task": arn, "expected": row.version, "next_version": row.version + 1, "new_doc": dumps(doc),
                **{f"new_{column}": statuses[column] for column in changed}})
            if arn not in self.moved and row.service_name:  # health alone decides whether it counts as healthy
                self.ctx.dirty_services.add((row.cluster_name, row.service_name))
        for changed, params in writes.items():
            if _WRITE_TASK[changed].run_many(self.ctx.conn, params) != len(params):
                raise StaleWrite(f"a task of {self.host.arn} changed concurrently")
        if self.events:
            self.ctx.emit_many(TASK_STATE_CHANGE, self.events)
        for arn, doc in self.docs.items():
            if doc["lastStatus"] == "STOPPED":
                release(self.ctx, self.host.arn, arn)


def _impaired_gpus(doc: dict, check: dict) -> None:
    """The GPUs an ACCELERATED_COMPUTE check names (`gpus`: UUIDs whose MPS control daemon is
    down) take no new MPS shares; on managed capacity the impaired host is replaced anyway."""
    gpus = check.get("gpus") or []
    known = {g["gpuId"] for g in doc.get("gpuDevices", [])}
    if not isinstance(gpus, list) or not all(isinstance(g, str) and g in known for g in gpus):
        raise InvalidParameter("Invalid parameter 'health.ACCELERATED_COMPUTE.gpus': expected UUIDs of this host's "
                               "GPUs.")
    if gpus:
        doc["_impairedGpus"] = sorted(set(gpus))
    else:
        doc.pop("_impairedGpus", None)


def _has_daemons(ctx: Context, provider: str | None) -> bool:
    return provider is not None and _PROVIDER_DAEMON.first(ctx.conn, {"provider": provider}) is not None


def apply_health(ctx: Context, host, checks: dict) -> None:
    """The agent's health checks. The DAEMON check is not the agent's to set: the daemon scheduler
    sets it from the daemons' tasks (shoal.control.daemons), and on a host without daemons it is
    OK. The first healthy report makes a REGISTERING host ACTIVE, unless daemons must start first
    (then the daemon scheduler activates it)."""
    doc = jsonio.loads(host.doc)
    hs = doc.get("healthStatus") or initial_health(ctx.now)
    before, gpus_before = jsonio.dumps(hs), doc.get("_impairedGpus")
    moved: list[str] = []  # the checks that changed status: announced
    for kind, check in checks.items():
        if kind not in HEALTH_CHECKS or not isinstance(check, dict) or check.get("status") not in CHECK_STATUSES:
            raise InvalidParameter(f"Invalid parameter 'health.{kind}': expected one of {HEALTH_CHECKS} with a "
                                   f"status in {CHECK_STATUSES}.")
        if kind != "DAEMON" and health.set_check(hs, kind, check["status"], str(check.get("reason") or "") or None,
                                                 ctx.now):
            moved.append(kind)
        if kind == "ACCELERATED_COMPUTE":
            _impaired_gpus(doc, check)
    runtime_ok = health.check(hs, "CONTAINER_RUNTIME")["status"] == "OK"
    daemons = _has_daemons(ctx, host.capacity_provider_name) if host.status == "REGISTERING" or \
        health.check(hs, "DAEMON")["status"] == "INITIALIZING" else True
    changed = bool(moved)
    if not daemons and runtime_ok:
        changed |= health.set_check(hs, "DAEMON", "OK", None, ctx.now)
    doc["healthStatus"] = hs
    activate = host.status == "REGISTERING" and runtime_ok and not daemons
    if activate:
        doc.update(status="ACTIVE", version=doc["version"] + 1)
    if jsonio.dumps(hs) != before or doc.get("_impairedGpus") != gpus_before or activate:
        update_versioned(ctx.conn, cis, {"arn": host.arn}, host.version, status=doc["status"], doc=dumps(doc))
    if doc.get("_impairedGpus") != gpus_before:
        host_changed(ctx, host.cluster_name, host.arn)  # its next MPS placement knows
        ctx.dirty_clusters.add(host.cluster_name)  # a GPU back: room for waiting MPS work
    cluster = _cluster_of(ctx, host) if changed or activate else None
    if changed and host.status != "REGISTERING":
        emit_health_change(ctx, cluster, doc)
        for kind in moved:  # the action log says it too: who reported what
            check = health.check(hs, kind)
            action_log.record(ctx, cluster=cluster.name, level="WARN" if check["status"] == "IMPAIRED" else "INFO",
                              resource_arn=cluster.arn, source_id=host.arn, event_name=f"{kind}_{check['status']}",
                              detail={"containerInstanceArn": host.arn, "statusReason": check.get("statusReason"),
                                      **({"gpus": doc["_impairedGpus"]} if kind == "ACCELERATED_COMPUTE"
                                         and doc.get("_impairedGpus") else {})})
    if activate:
        emit_instance_change(ctx, cluster, doc)
        host_changed(ctx, host.cluster_name, host.arn)
        ctx.dirty_clusters.add(host.cluster_name)
        ctx.tell_agent(host.arn)
    elif host.status == "REGISTERING" and runtime_ok:
        ctx.dirty_daemons.add(host.cluster_name)  # its daemons start now; they activate it


def report(ctx: Context, token: str, body: dict) -> dict:
    """Everything one report carries, all or nothing: task snapshots in order, then health."""
    host = host_for_token(ctx, token)
    updates = body.get("updates") or []
    if not isinstance(updates, list):
        raise InvalidParameter("Invalid parameter 'updates': expected a list of task snapshots.")
    results, reported = {}, _ReportedTasks(ctx, host, updates)
    for snapshot in updates:
        if not isinstance(snapshot, dict):
            raise InvalidParameter("Invalid parameter 'updates[]': expected an object.")
        state = reported.apply(snapshot)
        results[state["taskArn"]] = state
    reported.write()
    if body.get("orders"):
        chaos.acknowledge(ctx, host, body["orders"])
    if body.get("health"):
        if not isinstance(body["health"], dict):
            raise InvalidParameter("Invalid parameter 'health': expected an object of checks.")
        host = host_for_token(ctx, token, for_update=True)  # re-read: placement may have moved it
        apply_health(ctx, host, body["health"])
    return {"tasks": list(results.values()), "host": host.arn}
