"""ARNs: `arn:shoal:ecs:<region>:<account>:<type>/<path>`.

Every API that takes a cluster, task or instance accepts either a bare name/id or the full ARN;
`short_name` reduces either to the last path segment.
"""

import os
import random
import re
import time
from dataclasses import dataclass

from shoal.domain.errors import InvalidParameter

PARTITION = "shoal"
_ARN = re.compile(r"^arn:[a-z0-9-]+:[a-z0-9-]+:[a-z0-9-]*:\d{12}:([a-z-]+)/(.+)$")


@dataclass(frozen=True)
class Arn:
    resource_type: str
    path: str

    @property
    def last(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class ArnFactory:
    region: str = "local"
    account: str = "000000000000"

    def make(self, resource_type: str, path: str, service: str = "ecs") -> str:
        return f"arn:{PARTITION}:{service}:{self.region}:{self.account}:{resource_type}/{path}"

    def cluster(self, name: str) -> str:
        return self.make("cluster", name)

    def capacity_provider(self, name: str) -> str:
        return self.make("capacity-provider", name)

    def task_definition(self, family: str, revision: int) -> str:
        return self.make("task-definition", f"{family}:{revision}")

    def task(self, cluster: str, task_id: str) -> str:
        return self.make("task", f"{cluster}/{task_id}")

    def container(self, cluster: str, task_id: str, container_id: str) -> str:
        return self.make("container", f"{cluster}/{task_id}/{container_id}")

    def container_instance(self, cluster: str, instance_id: str) -> str:
        return self.make("container-instance", f"{cluster}/{instance_id}")

    def service(self, cluster: str, name: str) -> str:
        return self.make("service", f"{cluster}/{name}")

    # A deployment `ecs-svc/<n>` of a service has the revision and service deployment `<n>`.
    def service_deployment(self, cluster: str, service: str, deployment_id: str) -> str:
        return self.make("service-deployment", f"{cluster}/{service}/{deployment_id.rsplit('/', 1)[-1]}")

    def service_revision(self, cluster: str, service: str, deployment_id: str) -> str:
        return self.make("service-revision", f"{cluster}/{service}/{deployment_id.rsplit('/', 1)[-1]}")

    def daemon_task_definition(self, family: str, revision: int) -> str:
        return self.make("daemon-task-definition", f"{family}:{revision}")

    def daemon(self, cluster: str, name: str) -> str:
        return self.make("daemon", f"{cluster}/{name}")

    def daemon_revision(self, cluster: str, daemon: str, revision_id: str) -> str:
        return self.make("daemon-revision", f"{cluster}/{daemon}/{revision_id}")

    def daemon_deployment(self, cluster: str, daemon: str, deployment_id: str) -> str:
        return self.make("daemon-deployment", f"{cluster}/{daemon}/{deployment_id}")


def is_arn(value: str) -> bool:
    return value.startswith("arn:")


def parse(value: str, field: str = "resourceArn") -> Arn:
    m = _ARN.match(value)
    if not m:
        raise InvalidParameter(f"Invalid identifier for {field}: '{value}' is not a valid ARN.")
    return Arn(m.group(1), m.group(2))


def short_name(value: str, resource_type: str, field: str) -> str:
    """Name or id from either a bare name or an ARN of the expected type."""
    if not is_arn(value):
        return value
    arn = parse(value, field)
    if arn.resource_type != resource_type:
        raise InvalidParameter(
            f"Invalid identifier for {field}: expected a {resource_type} ARN, got '{value}'."
        )
    return arn.last


# Resource and event IDs: UUIDs in RFC 9562's version 7 layout (milliseconds since the epoch,
# then 74 random bits). ECS's are random version-4 UUIDs; a client can tell no difference (32
# hex digits, or the 8-4-4-4-12 form), but the store can: IDs that grow with time land at the
# end of the indexes on task ARNs and IDs and on event IDs, where fully random ones dirtied a
# leaf page each, anywhere in indexes of hundreds of thousands of rows (more pages to write at
# every commit, and to read back once they fall out of the page cache). They name things and
# are no secrets (credentials come from `secrets`), so the random bits come from a generator
# seeded once from the OS (reseeded in a forked child) rather than from os.urandom per ID.
_random = random.Random()
os.register_at_fork(after_in_child=_random.seed)
_V7 = (0x7 << 76) | (0x2 << 62)  # the version nibble (7) and the variant bits (10)
_RANDOM_MASK = (1 << 80) - 1 & ~((0xF << 76) | (0x3 << 62))


def new_id() -> str:
    """A time-ordered UUID as 32 hex digits (a task's or container's ID)."""
    return "%032x" % (time.time_ns() // 1_000_000 << 80 | _random.getrandbits(80) & _RANDOM_MASK | _V7)


def new_uuid() -> str:
    """A time-ordered UUID in its 8-4-4-4-12 form (an event's ID)."""
    h = new_id()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
