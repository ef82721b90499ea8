"""The real-hardware MPS check (tests/gpu/check_mps.py, issue 6 point 5) as a test.

It runs only where an NVIDIA driver with a GPU, `nvidia-cuda-mps-control` and torch with CUDA are
present, and is skipped elsewhere with the reason (the CI machines have no GPU). Nothing here
imports torch or pynvml at import time: the cheap checks run in the test, torch is probed by the
script in a subprocess (it exits 77 when it has to skip).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("check_mps.py")


def _check_module():
    spec = importlib.util.spec_from_file_location("shoal_gpu_check_mps", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(900)
def test_real_mps_daemon_enforces_client_limits_and_its_crash_impairs_the_host(tmp_path):
    check = _check_module()
    missing, _ = check.prerequisites(check_torch=False)  # milliseconds where there is no driver
    if missing:
        pytest.skip("needs an NVIDIA GPU host: " + "; ".join(missing))
    summary = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", str(summary)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=840)
    assert summary.exists(), f"check_mps.py exited {proc.returncode} without a summary:\n{proc.stdout[-12000:]}"
    result = json.loads(summary.read_text())
    if proc.returncode == check.SKIPPED:
        pytest.skip("needs an NVIDIA GPU host: " + "; ".join(result.get("skipped", [])))
    assert proc.returncode == 0 and result["ok"], f"check_mps.py exited {proc.returncode}:\n{proc.stdout[-12000:]}"
