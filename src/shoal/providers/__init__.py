"""Provisioners for managed capacity: how a managed capacity provider gets hosts and gives them
back. `local` simulates hosts as agent processes on this machine; `command` runs executables
the operator supplies, for real machines anywhere."""

from __future__ import annotations

import shlex
from pathlib import Path

from shoal.providers.base import Host, LaunchRequest, Provisioner, ProvisionerError
from shoal.providers.command import CommandProvisioner
from shoal.providers.local import LocalProvisioner

__all__ = ["CommandProvisioner", "Host", "LaunchRequest", "LocalProvisioner", "Provisioner",
           "ProvisionerError", "from_settings"]

Command = str | list[str]


def from_settings(kind: str, root: Path, launch: Command | None = None, terminate: Command | None = None,
                  list_: Command | None = None) -> Provisioner:
    """The provisioner that settings name. `root` is where local hosts keep their directories.

    Commands may be argv lists or, as they come from flags and the environment, shell-style
    strings (split with shlex, never run through a shell)."""
    if kind == "local":
        return LocalProvisioner(root)
    if kind == "command":
        missing = [name for name, value in (("launch", launch), ("terminate", terminate)) if not value]
        if missing:
            raise ValueError(f"the command provisioner needs a {' and a '.join(missing)} command")
        return CommandProvisioner(_argv(launch), _argv(terminate), _argv(list_) if list_ else None)
    raise ValueError(f"unknown provisioner kind {kind!r}: use 'local' or 'command'")


def _argv(command: Command) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else list(command)
