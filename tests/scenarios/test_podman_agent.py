"""Story: an agent started with `--runtime podman` runs a task from a locally built image; the
image is honoured (a file only the image has), the output reaches the task's logs, a health
check runs inside the container, and the exit code comes back through DescribeTasks."""

import sys
from pathlib import Path

import pytest

from shoal.agent.runtime import podman
from tests.agent_support import AgentProcess
from tests.support import ServerProcess, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "podman"))
import build_image  # noqa: E402

pytestmark = pytest.mark.skipif(podman.podman_path() is None,
                                reason="podman is not installed (on Debian: apt-get install -y podman runc)")


def test_a_task_runs_from_a_local_image(tmp_path):
    image = build_image.ensure_image(build_image.TAG, podman.podman_path())
    server = ServerProcess(tmp_path / "server").start()
    agent = AgentProcess(server, tmp_path / "agent", extra_args=("--runtime", "podman"))
    try:
        ecs = server.client()
        ecs.create_cluster(clusterName="default")
        agent.start().wait_active(ecs)
        ecs.register_task_definition(family="boxed", containerDefinitions=[{
            "name": "box", "image": image, "memory": 64,
            "command": ["sh", "-c", "cat /etc/shoal-image-marker; touch /tmp/ready; sleep 6; exit 4"],
            "healthCheck": {"command": ["CMD-SHELL", "test -f /tmp/ready"], "interval": 5, "timeout": 2,
                            "retries": 1}}])
        arn = ecs.run_task(taskDefinition="boxed")["tasks"][0]["taskArn"]

        def describe():
            return ecs.describe_tasks(tasks=[arn])["tasks"][0]

        wait_for(lambda: describe()["healthStatus"] == "HEALTHY", timeout=30,
                 message="the probe, run inside the container, to pass")
        done = wait_for(lambda: (lambda t: t["lastStatus"] == "STOPPED" and t)(describe()), timeout=30,
                        message="the container to exit")
        assert done["containers"][0]["exitCode"] == 4 and done["stopCode"] == "EssentialContainerExited"
        out = (agent.container_dir(arn, "box") / "stdout.log").read_text()
        assert out == build_image.MARKER_TEXT, "the file only the image has was read, and logged"
    finally:
        agent.stop()
        agent.kill_leftovers()
        server.stop()
