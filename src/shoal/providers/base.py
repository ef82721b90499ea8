"""What a managed capacity provider asks of a provisioner: launch hosts, terminate them, list them.

A provisioner only makes machines appear and disappear. The host's agent joins the control plane
by itself (with the server URL and join token it was given), and the control plane maps hosts to
container instances through the host id, which the agent reports as its ec2InstanceId."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Protocol

HOST_ID = re.compile(r"i-[0-9a-f]{17}")


@dataclass(frozen=True)
class LaunchRequest:
    instance_type: str        # e.g. "p6-b200.48xlarge"
    count: int
    cluster: str
    capacity_provider: str
    server_url: str           # the control-plane URL the new host's agent joins
    join_token: str = field(repr=False)  # a secret: never on a command line, never in a log line


@dataclass(frozen=True)
class Host:
    host_id: str              # the agent's ec2InstanceId
    instance_type: str
    state: str                # "running" | "stopped" (gone without being terminated)


class ProvisionerError(RuntimeError):
    """A provisioner could not do what it was asked; the message says what failed and why."""


class Provisioner(Protocol):
    name: str

    def launch(self, request: LaunchRequest) -> list[Host]:
        """Start `request.count` hosts; all of them, or none (raises ProvisionerError)."""

    def terminate(self, host_id: str) -> None:
        """Make the host and everything on it go away. Idempotent: an unknown id is a no-op."""

    def list(self) -> list[Host]:
        """The hosts launched and not yet terminated."""


def new_host_id() -> str:
    """An id shaped like an EC2 instance id, so that ECS clients accept it as ec2InstanceId."""
    return "i-" + secrets.token_hex(9)[:17]
