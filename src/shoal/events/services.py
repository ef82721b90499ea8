"""The events of services: "ECS Service Action" and "ECS Deployment State Change", plus the
human-readable messages a service keeps in its own `events` list (DescribeServices)."""

from __future__ import annotations

from shoal.domain.arns import new_uuid
from shoal.events.envelope import DEPLOYMENT_STATE_CHANGE, SERVICE_ACTION, iso

MAX_SERVICE_EVENTS = 100  # ECS shows the latest 100
EVENT_TYPES = {"SERVICE_STEADY_STATE": "INFO", "SERVICE_DESIRED_COUNT_UPDATED": "INFO",
               "SERVICE_TASK_START_IMPAIRED": "WARN", "SERVICE_TASK_PLACEMENT_FAILURE": "ERROR",
               "SERVICE_DEPLOYMENT_IN_PROGRESS": "INFO", "SERVICE_DEPLOYMENT_COMPLETED": "INFO",
               "SERVICE_DEPLOYMENT_FAILED": "ERROR"}


def service_action(ctx, service: dict, event_name: str, **extra) -> None:
    """An "ECS Service Action": detail {eventType, eventName, clusterArn, createdAt, …extra}."""
    detail = {"eventType": EVENT_TYPES[event_name], "eventName": event_name,
              "clusterArn": service["clusterArn"], "createdAt": iso(ctx.now), **extra}
    ctx.emit(SERVICE_ACTION, [service["serviceArn"]], detail)


def deployment_change(ctx, service: dict, deployment_id: str, event_name: str, reason: str) -> None:
    """An "ECS Deployment State Change": detail {eventType, eventName, deploymentId, updatedAt, reason}."""
    detail = {"eventType": EVENT_TYPES[event_name], "eventName": event_name, "deploymentId": deployment_id,
              "updatedAt": iso(ctx.now), "reason": reason}
    ctx.emit(DEPLOYMENT_STATE_CHANGE, [service["serviceArn"]], detail)


def note(ctx, service: dict, message: str) -> None:
    """Add a message to the service's own event list, newest first, as ECS words them:
    "(service web) has reached a steady state."."""
    event = {"id": new_uuid(), "createdAt": ctx.now, "message": f"(service {service['serviceName']}) {message}"}
    service["events"] = [event, *service.get("events", [])][:MAX_SERVICE_EVENTS]
