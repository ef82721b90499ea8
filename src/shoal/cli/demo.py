"""`shoal demo`: managed daemons, MPS sharing, faults and who owns recovery, on simulated p6-b200
hosts, in one command (shoal.demo.story). Ends with a timeline read from the event log and the
action log, and the measured detection and recovery times."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from shoal.demo import story as demo_story
from shoal.demo.rig import Rig
from shoal.events.envelope import iso


def demo(
    data_dir: Annotated[Optional[Path], typer.Option(
        help="Where the demo's server and hosts keep their files (kept afterwards); default: a temporary "
             "directory, removed unless the demo fails.")] = None,
    probe_interval: Annotated[float, typer.Option(
        help="Seconds between the agents' MPS probes (each GPU's daemon).")] = 2.0,
    as_json: Annotated[bool, typer.Option("--json", help="Narrate on stderr; print the figures and the "
                                                         "timeline as one JSON object on stdout.")] = False,
) -> None:
    """Show the story end to end on simulated p6-b200 hosts (about two minutes): daemons, MPS
    sharing, a non-critical daemon failing, an MPS hang on managed and on self-managed capacity."""
    root = data_dir or Path(tempfile.mkdtemp(prefix="shoal-demo-"))
    root.mkdir(parents=True, exist_ok=True)

    def say(message: str) -> None:
        typer.echo(message, err=as_json)

    say(f"shoal demo: a real shoal server and agents on this machine (files in {root})")
    rig, ok = Rig(root, probe_interval), False
    try:
        story = demo_story.Story(rig, say)
        story.setup()
        story.share_gpus()
        faults_from = time.time()
        story.noncritical_daemon_fails()
        story.managed_mps_hang(probe_interval)
        story.self_managed_mps_hang(probe_interval)
        lines = story.timeline(faults_from)
        ok = True
    finally:
        rig.stop()
        if ok and data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
        elif not ok:
            say(f"the demo stopped early; logs are in {root}")
    # Times from the first fault injected, as the action log recorded it.
    t0 = next((t for t, text in lines if text.startswith("action log CHAOS_REQUESTED")), faults_from)
    if as_json:
        typer.echo(json.dumps({"figures": story.figures, "timeline": [
            {"t": round(t - t0, 3), "at": iso(t), "what": text} for t, text in lines]}, indent=2))
        return
    say("\nTimeline (from the event log and the action log):")
    for t, text in lines:
        say(f"  {t - t0:+8.2f} s  {text}")
    f = story.figures
    say("\nMeasured:")
    nc = f["noncritical_daemon"]
    say(f"  non-critical daemon killed: restarted after {nc['restarted_after_s']:.2f} s; hosts drained "
        f"{nc['hosts_drained']}, tasks moved {nc['tasks_moved']}")
    m = f["managed_mps_hang"]
    say(f"  MPS hang, managed: detected {m['detected_s']:.2f} s (goal ≤ {m['goal_detected_s']:g} s), replacement "
        f"ACTIVE {m['replacement_active_s']:.2f} s, {m['moved_tasks']} tasks running again "
        f"{m['tasks_running_again_s']:.2f} s, old host terminated {m['old_host_terminated_s']:.2f} s")
    s = f["self_managed_mps_hang"]
    say(f"  MPS hang, self-managed: detected {s['detected_s']:.2f} s; replaced: {'yes' if s['replaced'] else 'no'}; "
        f"its MPS tasks still running: {s['tasks_still_running']}")

