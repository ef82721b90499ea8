"""`shoal logs TASK`: a task's container output, read from the agent's files on this machine.

Every container's stdout and stderr are kept by its shim in
`<agent data dir>/tasks/<task-id>/<container>/stdout.log|stderr.log`. `shoal logs` finds the task
under a data dir (by default `.shoal`, where `shoal up` keeps its agent and its simulated hosts).
Logs of hosts on other machines stay on those machines.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

FOLLOW_INTERVAL = 0.2


def _task_dir(root: Path, task: str) -> Path:
    task_id = task.rsplit("/", 1)[-1]
    found = sorted(p for p in root.glob(f"**/tasks/{task_id}") if p.is_dir())
    if not found:
        raise typer.BadParameter(f"no task {task_id} under {root} (logs live on the task's host)",
                                 param_hint="TASK")
    return found[0]


def logs(
    task: Annotated[str, typer.Argument(help="Task ARN or id.")],
    container: Annotated[Optional[str], typer.Option(help="Container name (default: every container).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new output.")] = False,
    data_dir: Annotated[Path, typer.Option(help="Where the agents' data dirs are.",
                                           envvar="SHOAL_DATA_DIR")] = Path(".shoal"),
) -> None:
    """Print a task's container logs (stdout and stderr)."""
    task_dir = _task_dir(data_dir, task)
    names = [container] if container else sorted(p.name for p in task_dir.iterdir() if p.is_dir())
    if container and not (task_dir / container).is_dir():
        raise typer.BadParameter(f"task has no container {container!r} (has: "
                                 f"{', '.join(p.name for p in task_dir.iterdir() if p.is_dir())})",
                                 param_hint="--container")
    files = [(name, task_dir / name / stream) for name in names for stream in ("stdout.log", "stderr.log")]
    offsets = {path: 0 for _, path in files}
    prefix = len(names) > 1
    while True:
        ended = follow and _ended(task_dir, names)  # checked before reading: nothing comes after exit.json
        for name, path in files:
            try:
                with open(path, "rb") as f:
                    f.seek(offsets[path])
                    data = f.read()
            except FileNotFoundError:
                continue
            offsets[path] += len(data)
            if data:
                text = data.decode(errors="replace")
                if prefix:
                    text = "".join(f"{name} | {line}" for line in text.splitlines(keepends=True))
                (sys.stderr if path.name == "stderr.log" else sys.stdout).write(text)
        sys.stdout.flush()
        if not follow or ended:
            return
        time.sleep(FOLLOW_INTERVAL)


def _ended(task_dir: Path, names: list[str]) -> bool:
    """--follow stops once every container has recorded its exit."""
    return all((task_dir / n / "exit.json").exists() for n in names)
