"""Story: a new user runs `shoal up`, pastes the four export lines, and talks to the cluster.

Ctrl-C (SIGINT) or SIGTERM shuts it down cleanly; a restart keeps the same credentials.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import boto3

from tests.support import free_port

SHOAL = Path(sys.executable).parent / "shoal"


def _start(data_dir: Path, port: int) -> tuple[subprocess.Popen, dict[str, str]]:
    proc = subprocess.Popen([str(SHOAL), "up", "--port", str(port), "--data-dir", str(data_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    exports: dict[str, str] = {}
    lines = []
    while len(exports) < 4:
        line = proc.stdout.readline()
        assert line, f"shoal up exited early: {''.join(lines)}"
        lines.append(line)
        if line.startswith("export "):
            key, _, value = line[len("export "):].strip().partition("=")
            exports[key] = value
    sample = proc.stdout.readline()
    assert 'aws ecs --endpoint-url "$SHOAL_ENDPOINT" list-clusters' in sample
    return proc, exports


def test_up_prints_exports_that_work_and_keeps_credentials_across_restarts(tmp_path):
    port = free_port()
    proc, exports = _start(tmp_path / "shoal", port)
    try:
        assert list(exports) == ["SHOAL_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"]
        assert exports["SHOAL_ENDPOINT"] == f"http://127.0.0.1:{port}"
        assert exports["AWS_DEFAULT_REGION"] == "local"
        ecs = boto3.client("ecs", endpoint_url=exports["SHOAL_ENDPOINT"], region_name=exports["AWS_DEFAULT_REGION"],
                           aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
                           aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"])
        ecs.create_cluster(clusterName="hello")
        env = {**os.environ, **exports, "HOME": str(tmp_path), "AWS_CONFIG_FILE": "/dev/null"}
        out = subprocess.run([str(SHOAL), "events", "list", "--json"], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0

    proc, again = _start(tmp_path / "shoal", port)
    try:
        assert again == exports
        ecs = boto3.client("ecs", endpoint_url=again["SHOAL_ENDPOINT"], region_name="local",
                           aws_access_key_id=again["AWS_ACCESS_KEY_ID"],
                           aws_secret_access_key=again["AWS_SECRET_ACCESS_KEY"])
        assert ecs.list_clusters()["clusterArns"] == ["arn:shoal:ecs:local:000000000000:cluster/hello"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
