"""`shoal demo` end to end, as a user runs it (issue #6 point 7): one command, a server and
simulated p6-b200 hosts of its own, and the figures it prints are the story's acceptance."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shoal.agent.mps.fake_control import binary_path

pytestmark = pytest.mark.skipif(not os.access(binary_path(), os.X_OK), reason="shoal-fake-mps-control not installed")


def test_the_demo_tells_the_whole_story_and_measures_it(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "shoal", "demo", "--json", "--data-dir", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-5000:]
    out = json.loads(proc.stdout)
    figures, lines = out["figures"], [line["what"] for line in out["timeline"]]
    narration = proc.stderr
    for step in ("1. A cluster", "2. MPS inference", "3. The non-critical daemon", "4. The MPS control daemon",
                 "5. The same fault on the self-managed host"):
        assert step in narration, narration

    # 1: daemons before work: each host went ACTIVE after its daemons started
    assert narration.count("logd RUNNING, metricsd RUNNING; ACTIVE +") == 3, narration
    # 3: the non-critical daemon failed, nothing moved
    nc = figures["noncritical_daemon"]
    assert (nc["hosts_drained"], nc["tasks_moved"], nc["host_status"]) == (0, 0, "ACTIVE"), nc
    # 4: managed: detected, drained, replaced start-before-stop, its 3 tasks running elsewhere
    # (how fast is benchmarks/mps_recovery.py's business, not a test's)
    m = figures["managed_mps_hang"]
    assert 0 < m["detected_s"] <= m["draining_s"] <= m["old_host_terminated_s"], m
    assert m["replacement_active_s"] <= m["old_host_terminated_s"], m
    assert m["moved_tasks"] == 3 and m["tasks_running_again_s"] is not None, m
    # 5: self-managed: reported, left in place, its tasks untouched
    s = figures["self_managed_mps_hang"]
    assert s["detected_s"] > 0 and not s["replaced"] and s["tasks_still_running"] == 2, s
    assert s["status_after_s"] == {"5": "ACTIVE"}, s

    # the timeline is read from shoal's records, in order
    def at(prefix: str, start: int = 0) -> int:
        return next(i for i in range(start, len(lines)) if lines[i].startswith(prefix))
    hang = at("action log CHAOS_REQUESTED", at("action log CHAOS_DONE") + 1)
    assert at("action log HOST_REPAIR_STARTED", hang) < at("action log HOST_REPLACEMENT_LAUNCHED", hang) \
        < at("action log HOST_REPAIR_COMPLETED", hang)
    assert any("ACCELERATED_COMPUTE IMPAIRED" in line for line in lines[hang:]), lines
