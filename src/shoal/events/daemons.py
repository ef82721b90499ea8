"""The events of managed daemons. "ECS Daemon Deployment State Change": one per deployment
transition, written in the transaction that makes it (reference §1.8)."""

from __future__ import annotations

from shoal.events import action_log
from shoal.events.envelope import iso

DAEMON_DEPLOYMENT_STATE_CHANGE = "ECS Daemon Deployment State Change"
DAEMON_SERVICE_ACTION = "ECS Daemon Service Action"
# Every transition is INFO but a failed rollback (ECS's table).
_ERRORS = {"ROLLBACK_FAILED"}


def deployment_event_name(status: str) -> str:
    return f"DAEMON_DEPLOYMENT_{status}"


def deployment_state_change(ctx, deployment: dict, daemon_arn: str) -> None:
    """detail {eventType, eventName, clusterArn, daemonArn, daemonDeploymentArn,
    targetDaemonRevisionArn, updatedAt}; resources [daemonArn]. A DeleteDaemon deployment has no
    target revision, so its events carry none."""
    status = deployment["status"]
    detail = {"eventType": "ERROR" if status in _ERRORS else "INFO", "eventName": deployment_event_name(status),
              "clusterArn": deployment["clusterArn"], "daemonArn": daemon_arn,
              "daemonDeploymentArn": deployment["daemonDeploymentArn"]}
    target = deployment.get("targetDaemonRevision")
    if target:
        detail["targetDaemonRevisionArn"] = target["arn"]
    detail["updatedAt"] = iso(ctx.now)
    ctx.emit(DAEMON_DEPLOYMENT_STATE_CHANGE, [daemon_arn], detail)
    # The cluster's action log tells the same story, with the reason.
    action_log.record(ctx, cluster=deployment["clusterArn"].rsplit("/", 1)[-1], level="ERROR" if status in _ERRORS
                      else "INFO", resource_arn=deployment["clusterArn"], source_id=daemon_arn,
                      event_name=detail["eventName"], daemon=daemon_arn.rsplit("/", 1)[-1],
                      detail={"daemonDeploymentArn": deployment["daemonDeploymentArn"], "status": status,
                              **({"statusReason": deployment["statusReason"]} if deployment.get("statusReason") else {})})
