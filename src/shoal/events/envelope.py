"""The EventBridge envelope for shoal's own events."""

import functools
from datetime import datetime, timezone

from shoal.domain.arns import new_uuid

SOURCE = "shoal.ecs"

TASK_STATE_CHANGE = "ECS Task State Change"
CONTAINER_INSTANCE_STATE_CHANGE = "ECS Container Instance State Change"
CONTAINER_INSTANCE_HEALTH_CHANGE = "ECS Container Instance Health Change"
SERVICE_ACTION = "ECS Service Action"
DEPLOYMENT_STATE_CHANGE = "ECS Deployment State Change"


@functools.lru_cache(maxsize=4096)
def iso(epoch: float) -> str:
    """Epoch seconds to the ISO 8601 form events carry (UTC, milliseconds, `Z`). Cached: the
    events of one unit of work share its time, and a task's times recur in each of its events."""
    dt = datetime.fromtimestamp(epoch, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def envelope(
    detail_type: str, resources: list[str], detail: dict, *, region: str, account: str, now: float,
    source: str = SOURCE, time: str | None = None,
) -> dict:
    return {
        "version": "0",
        "id": new_uuid(),
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

    # Every event converts a whole document: leaves are handled in their container's loop
    # rather than by a call each (a task document has a hundred or so), and by exact type
    # (documents are plain JSON values), which is cheaper than isinstance.
    def convert(value):
        if type(value) is dict:
            out = {}
            for k, v in value.items():
                if k in drop:
                    continue
                kind = type(v)
                if kind is dict or kind is list:
                    v = convert(v)
                elif k in _TIMESTAMP_FIELDS and (kind is float or kind is int):
                    v = iso(v)
                out[k] = v
            return out
        return [convert(v) if type(v) is dict or type(v) is list else v for v in value]

    return convert(doc) if type(doc) is dict or type(doc) is list else doc
