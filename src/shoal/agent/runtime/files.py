"""The container directory: the files a shim and the agent share, and how they are read and
written. Every file is published atomically (a temporary file, then a rename or a hard link), so a
reader sees all of a file or none. The layout is described in `shoal.agent.runtime.shim`."""

from __future__ import annotations

import os
import time
from pathlib import Path

SPEC = "spec.json"
SHIM_PID = "shim.pid"
SHIM_START = "shim_start"  # the shim's start time in clock ticks: tells it apart from a pid reuse
SHIM_LOG = "shim.log"
PID = "pid"
STARTED_AT = "started_at"
PROC_START = "proc_start"
STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
EXIT = "exit.json"


def write_atomic(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """Write `data` to a temporary file beside `path`, then publish it under `path` in one step.

    With `exclusive`, publish by hard link, which fails with FileExistsError if `path` exists."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        if exclusive or tmp.exists():
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def read_int(path: Path) -> int | None:
    text = read_text(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def proc_stat(pid: int) -> list[str] | None:
    """Fields 3 onwards of /proc/<pid>/stat (index 0 is the state), or None if there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rfind(")") + 2:].split()


def proc_start_ticks(pid: int) -> int | None:
    fields = proc_stat(pid)
    return int(fields[19]) if fields else None


def have_proc() -> bool:
    return os.path.isdir("/proc/self")


def killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
