"""Simulated GPUs for hosts without them: the hardware boundary of the test suite.

A fake host's GPUs come from a JSON spec (`{"model", "count", "memoryMiB", "uuids"?}`) or from the
instance catalog (a simulated `p6-b200.48xlarge` has the catalog's 8 GPUs). Their UUIDs are kept
in the state dir, so a restarted agent sees the same devices.

Faults are injected through a Unix datagram socket named after the state dir (in the abstract
namespace, so that a deep state dir does not hit the 108-byte limit of socket paths):
`inject(state_dir, gpu, xid)` sends one datagram and `wait_xid` wakes at once, as an NVML event
wait would. No polling.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import uuid
from pathlib import Path

from shoal.agent.gpu.base import Gpu, XidEvent

def socket_address(state_dir: Path) -> str:
    digest = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:32]
    return f"\0shoal-fake-gpu-{digest}"
DEVICES_FILE = "fake-gpus.json"


class FakeGpus:
    name = "fake"

    def __init__(self, devices: list[Gpu], state_dir: Path | None = None):
        self._devices = devices
        self._socket: socket.socket | None = None
        if state_dir is not None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._socket.bind(socket_address(state_dir))

    @classmethod
    def from_spec(cls, spec_path: Path | None = None, *, instance_type: str | None = None,
                  state_dir: Path | None = None) -> "FakeGpus":
        if spec_path is not None:
            spec = json.loads(Path(spec_path).read_text())
            model, count, memory = spec["model"], int(spec["count"]), int(spec["memoryMiB"])
            uuids = spec.get("uuids")
        else:
            from shoal import catalog

            gpu = catalog.get(instance_type).gpu
            if gpu is None:
                return cls([], state_dir)
            model, count, memory, uuids = gpu.model, gpu.count, gpu.memory_mib, None
        uuids = uuids or _kept_uuids(state_dir, count)
        if len(uuids) != count:
            raise ValueError(f"fake GPU spec: {count} GPUs but {len(uuids)} uuids")
        return cls([Gpu(i, u, model, memory) for i, u in enumerate(uuids)], state_dir)

    def devices(self) -> list[Gpu]:
        return list(self._devices)

    def wait_xid(self, timeout: float) -> XidEvent | None:
        if self._socket is None:
            return None
        self._socket.settimeout(timeout)
        try:
            message = json.loads(self._socket.recv(4096))
        except (TimeoutError, socket.timeout):
            return None
        target = message["gpu"]
        for gpu in self._devices:
            if target in (gpu.uuid, gpu.index, str(gpu.index)):
                return XidEvent(gpu_uuid=gpu.uuid, xid=int(message["xid"]))
        raise ValueError(f"injected Xid for unknown GPU {target!r}")

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def inject(state_dir: Path, gpu: int | str, xid: int) -> None:
    """Make the fake GPU `gpu` (index or uuid) of the agent using `state_dir` report Xid `xid`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(json.dumps({"gpu": gpu, "xid": xid}).encode(), socket_address(state_dir))


def _kept_uuids(state_dir: Path | None, count: int) -> list[str]:
    fresh = [f"GPU-{uuid.uuid4()}" for _ in range(count)]
    if state_dir is None:
        return fresh
    path = state_dir / DEVICES_FILE
    if path.exists():
        kept = json.loads(path.read_text())
        if len(kept) == count:
            return kept
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(fresh))
    tmp.replace(path)
    return fresh
