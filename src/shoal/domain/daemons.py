"""Managed daemons: the pure rules of the daemon API. No store, no HTTP.

- daemon task definitions: the container rules of ordinary task definitions (reused from
  shoal.domain.task_definitions), plus bind-mount volumes that the mount points must name;
- a daemon's settings and deployment configuration, with ECS's defaults. UpdateDaemon carries
  nothing over: every field it leaves out takes its default again (`critical` is true);
- the documents of revisions and deployments;
- the deployment state machine, which the API uses to supersede a deployment and the daemon
  reconciler to advance one (`transition`), and the arithmetic of a rollout (`batch_size`,
  `breaker_threshold`).
"""

from __future__ import annotations

import math
import re

from shoal.domain import services, task_definitions
from shoal.domain.errors import InvalidParameter

GROUP_PREFIX = "daemon:"
MAX_NAME = 255 - len(GROUP_PREFIX)  # a daemon task's group "daemon:<name>" fits in 255
DEFAULT_DRAIN_PERCENT = 25.0
DEFAULT_BAKE_MINUTES = 0
MAX_BAKE_MINUTES = 1440
# ECS: "Up to 36 ASCII characters in the range of 33-126 (inclusive)".
CLIENT_TOKEN_RE = re.compile(r"^[\x21-\x7e]{1,36}$")
VOLUME_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,255}$")

# --- deployment states -------------------------------------------------------------------------
PENDING, IN_PROGRESS, SUCCESSFUL, STOPPED = "PENDING", "IN_PROGRESS", "SUCCESSFUL", "STOPPED"
STOP_REQUESTED, ROLLBACK_IN_PROGRESS = "STOP_REQUESTED", "ROLLBACK_IN_PROGRESS"
ROLLBACK_SUCCESSFUL, ROLLBACK_FAILED = "ROLLBACK_SUCCESSFUL", "ROLLBACK_FAILED"
ENDED = frozenset({SUCCESSFUL, STOPPED, ROLLBACK_SUCCESSFUL, ROLLBACK_FAILED})
# PENDING ─► IN_PROGRESS ─► SUCCESSFUL; a breaker trip or an alarm: IN_PROGRESS ─► STOP_REQUESTED
# ─► ROLLBACK_IN_PROGRESS ─► ROLLBACK_SUCCESSFUL | ROLLBACK_FAILED. Any deployment that has not
# ended may be STOPPED: superseded by a newer one, or failed without a rollback.
TRANSITIONS = {
    PENDING: {IN_PROGRESS, STOPPED},
    IN_PROGRESS: {SUCCESSFUL, STOP_REQUESTED, STOPPED},
    STOP_REQUESTED: {ROLLBACK_IN_PROGRESS, STOPPED},
    ROLLBACK_IN_PROGRESS: {ROLLBACK_SUCCESSFUL, ROLLBACK_FAILED, STOPPED},
    **{status: set() for status in ENDED},
}
_FINISHED = {SUCCESSFUL, ROLLBACK_SUCCESSFUL}  # they get finishedAt; STOPPED and ROLLBACK_FAILED stoppedAt


def group(name: str) -> str:
    """The group of a daemon's tasks."""
    return GROUP_PREFIX + name


# --- daemon task definitions ---------------------------------------------------------------------


def validate_task_definition(req: dict) -> dict:
    """Check a RegisterDaemonTaskDefinition request (containers already reduced to the members of
    DaemonContainerDefinition); return the definition's document without arn/revision/tags."""
    base = {k: req[k] for k in ("family", "containerDefinitions", "cpu", "memory") if req.get(k) is not None}
    # Family, container names, an essential container, memory at task or container level, cpu and
    # memory bounds, dependsOn targets: the same rules as any task definition.
    checked = task_definitions.validate(base)
    volumes = _check_volumes(req.get("volumes", []))
    for i, c in enumerate(checked["containerDefinitions"]):
        for j, mp in enumerate(c.get("mountPoints", [])):
            if mp.get("sourceVolume") not in volumes:
                raise InvalidParameter(f"Invalid parameter 'containerDefinitions[{i}].mountPoints[{j}].sourceVolume': "
                                       f"no volume named '{mp.get('sourceVolume')}' in this daemon task definition.")
    doc = {"family": req["family"], "containerDefinitions": checked["containerDefinitions"],
           "volumes": req.get("volumes", []), "status": "ACTIVE"}
    for key in ("taskRoleArn", "executionRoleArn", "cpu", "memory", "pidMode", "ipcMode"):
        value = checked.get(key) if key in ("cpu", "memory") else req.get(key)  # "1 vCPU" is stored "1024"
        if value is not None:
            doc[key] = value
    return doc


def _check_volumes(volumes: list[dict]) -> set[str]:
    """Daemon volumes are host bind mounts (or a log driver's volume): no Docker, EFS or EBS volumes."""
    names: set[str] = set()
    for i, v in enumerate(volumes):
        path = f"volumes[{i}]"
        name = v.get("name")
        if not name or not VOLUME_NAME_RE.match(name):
            raise InvalidParameter(f"Invalid parameter '{path}.name': a volume name has 1 to 255 letters, numbers, "
                                   "hyphens and underscores.")
        if name in names:
            raise InvalidParameter(f"Invalid parameter '{path}.name': duplicate volume name '{name}'.")
        names.add(name)
        source = (v.get("host") or {}).get("sourcePath")
        if source is None and v.get("logDriverVolumeConfiguration") is None:
            raise InvalidParameter(f"Missing required parameter '{path}.host.sourcePath': daemon volumes are bind "
                                   "mounts of a host path.")
        if source is not None and not source.startswith("/"):
            raise InvalidParameter(f"Invalid parameter '{path}.host.sourcePath': '{source}' is not an absolute path.")
    return names


# --- daemons -----------------------------------------------------------------------------------


def check_name(name: str) -> str:
    if len(name) > MAX_NAME:
        raise InvalidParameter(f"Invalid parameter 'daemonName': at most {MAX_NAME} characters, so that its tasks' "
                               f"group '{GROUP_PREFIX}<name>' fits in 255.")
    return name


def check_client_token(token: str | None) -> None:
    if token is not None and not CLIENT_TOKEN_RE.match(token):
        raise InvalidParameter("Invalid parameter 'clientToken': 1 to 36 ASCII characters from '!' to '~' "
                               "(codes 33-126).")


def settings(req: dict) -> dict:
    """What a daemon revision records of a CreateDaemon/UpdateDaemon request, defaults filled in.
    Nothing comes from the previous revision: a field left out takes its default."""
    return {
        "propagateTags": req.get("propagateTags", "NONE"),
        "enableECSManagedTags": bool(req.get("enableECSManagedTags", False)),
        "enableExecuteCommand": bool(req.get("enableExecuteCommand", False)),
        "critical": bool(req.get("critical", True)),
    }


def deployment_configuration(given: dict | None) -> dict:
    """The DaemonDeploymentConfiguration a deployment runs with: `given` over ECS's defaults
    (drainPercent 25, bakeTimeInMinutes 0, alarms off), never over a previous configuration."""
    given = given or {}
    prefix = "deploymentConfiguration"
    drain = given.get("drainPercent", DEFAULT_DRAIN_PERCENT)
    if isinstance(drain, bool) or not isinstance(drain, int | float) or not 0 <= drain <= 100:
        raise InvalidParameter(f"Invalid parameter '{prefix}.drainPercent': must be between 0.0 and 100.0, "
                               f"got {drain!r}.")
    bake = given.get("bakeTimeInMinutes", DEFAULT_BAKE_MINUTES)
    if isinstance(bake, bool) or not isinstance(bake, int) or not 0 <= bake <= MAX_BAKE_MINUTES:
        raise InvalidParameter(f"Invalid parameter '{prefix}.bakeTimeInMinutes': must be between 0 and "
                               f"{MAX_BAKE_MINUTES}, got {bake!r}.")
    alarms = given.get("alarms") or {}
    names = list(alarms.get("alarmNames", []))
    for i, name in enumerate(names):
        if not name:
            raise InvalidParameter(f"Invalid parameter '{prefix}.alarms.alarmNames[{i}]': an alarm name must not "
                                   "be empty.")
    if len(set(names)) != len(names):
        raise InvalidParameter(f"Invalid parameter '{prefix}.alarms.alarmNames': an alarm is named twice.")
    enable = bool(alarms.get("enable", False))
    if enable and not names:
        raise InvalidParameter(f"Invalid parameter '{prefix}.alarms.alarmNames': name at least one alarm when "
                               "alarms are enabled.")
    return {"drainPercent": float(drain), "alarms": {"alarmNames": names, "enable": enable},
            "bakeTimeInMinutes": bake}


def batch_size(drain_percent: float, hosts: int) -> int:
    """Hosts a rolling deployment drains at once: drainPercent of the hosts rounded up, at least
    1 (so that 0.0, which the API allows, still makes progress), at most all of them."""
    if hosts <= 0:
        return 0
    return min(hosts, max(1, math.ceil(drain_percent * hosts / 100 - 1e-9)))


def breaker_threshold(hosts: int) -> int:
    """Daemon start failures that trip a deployment's circuit breaker. ECS does not document it;
    shoal uses the services' default rule over the hosts in scope: clamp(ceil(0.5 × hosts), 3, 200)."""
    return services.breaker_threshold(hosts)


def revision_doc(*, arn: str, cluster_arn: str, daemon_arn: str, task_definition: dict, settings_: dict,
                 now: float) -> dict:
    """A DaemonRevision: an immutable snapshot of what a deployment rolls out."""
    images = [{"containerName": c["name"], "image": c["image"]} for c in task_definition["containerDefinitions"]]
    return {"daemonRevisionArn": arn, "clusterArn": cluster_arn, "daemonArn": daemon_arn,
            "daemonTaskDefinitionArn": task_definition["daemonTaskDefinitionArn"], "createdAt": now,
            "containerImages": images, **settings_}


# --- counting hosts ------------------------------------------------------------------------------
# `counts` is one capacity provider's live hosts (ACTIVE or DRAINING) by (status, whether a RUNNING
# task of the daemon is on them): {("ACTIVE", True): n, ("DRAINING", False): m, …}.


def daemon_counts(counts: dict[tuple, int]) -> tuple[int, int]:
    """DescribeDaemon's (runningCount, withoutDaemonCount), disjoint: hosts that run the daemon,
    draining or not; ACTIVE hosts that do not (a DRAINING host is not missing it)."""
    return counts.get(("ACTIVE", True), 0) + counts.get(("DRAINING", True), 0), counts.get(("ACTIVE", False), 0)


def instance_counts(provider_arn: str, counts: dict[tuple, int]) -> dict:
    """A DaemonDeploymentCapacityProvider, its three counts disjoint: ACTIVE hosts with the daemon,
    ACTIVE hosts without it, DRAINING hosts."""
    return {"arn": provider_arn, "runningInstanceCount": counts.get(("ACTIVE", True), 0),
            "withoutDaemonInstanceCount": counts.get(("ACTIVE", False), 0),
            "drainingInstanceCount": counts.get(("DRAINING", True), 0) + counts.get(("DRAINING", False), 0)}


def revision_detail(revision_arn: str, counts: list[dict]) -> dict:
    """A DaemonDeploymentRevisionDetail from per-provider counts
    [{"arn", "runningInstanceCount", "withoutDaemonInstanceCount", "drainingInstanceCount"}]."""
    return {"arn": revision_arn, "capacityProviders": counts,
            "totalRunningInstanceCount": sum(c["runningInstanceCount"] for c in counts),
            "totalWithoutDaemonInstanceCount": sum(c["withoutDaemonInstanceCount"] for c in counts),
            "totalDrainingInstanceCount": sum(c["drainingInstanceCount"] for c in counts)}


def deployment_doc(*, arn: str, cluster_arn: str, target: dict | None, sources: list[dict], config: dict,
                   hosts: int, now: float) -> dict:
    """A new DaemonDeployment, PENDING until the reconciler starts on a host. `target` is None for
    the deployment of a DeleteDaemon, which takes the daemon off its hosts."""
    doc = {"daemonDeploymentArn": arn, "clusterArn": cluster_arn, "status": PENDING}
    if target is not None:
        doc["targetDaemonRevision"] = target
    doc.update(
        sourceDaemonRevisions=sources,
        circuitBreaker={"failureCount": 0, "status": "MONITORING", "threshold": breaker_threshold(hosts)},
        alarms={"status": "MONITORING" if config["alarms"]["enable"] else "DISABLED",
                "alarmNames": config["alarms"]["alarmNames"], "triggeredAlarmNames": []},
        deploymentConfiguration=config, createdAt=now)
    return doc


def can_transition(current: str, status: str) -> bool:
    return status in TRANSITIONS.get(current, set())


def transition(doc: dict, status: str, now: float, reason: str | None = None) -> dict:
    """The deployment `doc` moved to `status` (a new dict): statusReason, startedAt on the first
    IN_PROGRESS, finishedAt or stoppedAt when it ends, and monitors that were still watching
    marked MONITORING_COMPLETE. Raises ValueError for a move the state machine does not have."""
    if not can_transition(doc["status"], status):
        raise ValueError(f"daemon deployment {doc.get('daemonDeploymentArn')}: no transition "
                         f"{doc['status']} -> {status}")
    out = {**doc, "status": status}
    if reason is not None:
        out["statusReason"] = reason
    if status == IN_PROGRESS:
        out.setdefault("startedAt", now)
    if status in ENDED:
        out["finishedAt" if status in _FINISHED else "stoppedAt"] = now
        for monitor in ("circuitBreaker", "alarms"):
            if out.get(monitor, {}).get("status") == "MONITORING":
                out[monitor] = {**out[monitor], "status": "MONITORING_COMPLETE"}
    return out
