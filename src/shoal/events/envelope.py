"""The EventBridge envelope for shoal's own events."""

import uuid
from datetime import datetime, timezone

SOURCE = "shoal.ecs"

TASK_STATE_CHANGE = "ECS Task State Change"
CONTAINER_INSTANCE_STATE_CHANGE = "ECS Container Instance State Change"
CONTAINER_INSTANCE_HEALTH_CHANGE = "ECS Container Instance Health Change"
SERVICE_ACTION = "ECS Service Action"
DEPLOYMENT_STATE_CHANGE = "ECS Deployment State Change"


def iso(epoch: float) -> str:
    """Epoch seconds to the ISO 8601 form events carry (UTC, milliseconds, `Z`)."""
    dt = datetime.fromtimestamp(epoch, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def envelope(
    detail_type: str, resources: list[str], detail: dict, *, region: str, account: str, now: float,
    source: str = SOURCE, time: str | None = None,
) -> dict:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": detail_type,
        "source": source,
        "account": account,
        "time": time or iso(now).split(".")[0] + "Z",
        "region": region,
        "resources": resources,
        "detail": detail,
    }


# Fields of the Task, Container and ContainerInstance shapes that are timestamps: the API sends
# them as epoch seconds, events as ISO strings.
_TIMESTAMP_FIELDS = {
    "createdAt", "startedAt", "stoppingAt", "stoppedAt", "executionStoppedAt", "pullStartedAt",
    "pullStoppedAt", "connectivityAt", "updatedAt", "registeredAt", "lastUpdated",
    "lastStatusChange",
}


def event_detail(doc: dict, drop: tuple[str, ...] = ("tags",)) -> dict:
    """A resource document in event form: ISO timestamps, API-only fields dropped."""

    def convert(value, key=None):
        if isinstance(value, dict):
            return {k: convert(v, k) for k, v in value.items() if k not in drop}
        if isinstance(value, list):
            return [convert(v) for v in value]
        if key in _TIMESTAMP_FIELDS and isinstance(value, int | float):
            return iso(value)
        return value

    return convert(doc)
