"""Daemon SLIs from what real hosts did (issue #5, point 10): a real server, a real `shoal agent` on
a self-managed capacity provider, daemon tasks that are real child processes.

- a non-critical daemon that exits at once: every decided start failed (rate 0), it is
  restarted, and its host is the one without it, in the report and on /metrics;
- a critical daemon that dies on an ACTIVE host and runs again: one recovery, as long as the
  host was without it, counted from the scheduler's own action log;
- a critical daemon killed on a managed host: the host is replaced, and the repair's duration is
  the daemon's mean time to replace.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.agent_support import AgentProcess
from tests.scenarios.test_daemon_repair import actions, hosts, instance_changes, kill_daemon_on, managed_fleet
from tests.support import ServerProcess, kill_workloads, wait_for


@pytest.fixture
def server(tmp_path):
    srv = ServerProcess(tmp_path / "server").start()
    agents: list[AgentProcess] = []
    srv.agents = agents
    yield srv
    for agent in agents:
        agent.stop()
    srv.stop()
    kill_workloads(tmp_path)


def setup(server, tmp_path, command: list[str], *, critical: bool):
    """A cluster with a self-managed provider, a daemon running `command` there and one real host."""
    ecs = server.client()
    ecs.create_cluster(clusterName="fleet")
    ecs.create_capacity_provider(name="own", autoScalingGroupProvider={
        "autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:x"})
    ecs.put_cluster_capacity_providers(cluster="fleet", capacityProviders=["own"], defaultCapacityProviderStrategy=[])
    td = ecs.register_daemon_task_definition(family="agentd", containerDefinitions=[
        {"name": "agentd", "image": "busybox", "memory": 32, "command": command}])
    daemon = ecs.create_daemon(clusterArn="fleet", daemonName="agentd", critical=critical,
                               daemonTaskDefinitionArn=td["daemonTaskDefinitionArn"],
                               capacityProviderArns=["own"])["daemonArn"]
    agent = AgentProcess(server, tmp_path / "host", ("--capacity-provider", "own"), cluster="fleet").start()
    server.agents.append(agent)
    return ecs, daemon, agent


def report(server) -> dict:
    resp = server.get("/v1/daemons/sli", {"cluster": "fleet", "daemon": "agentd", "window": "1h"})
    assert resp.status_code == 200, resp.text
    [found] = resp.json()["daemons"]
    return found


def scrape(server) -> dict[str, float]:
    """/metrics as {'name{labels}': value}."""
    text = httpx.get(server.endpoint + "/metrics", timeout=10).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def daemon_check(ecs, arn: str) -> dict:
    ci = ecs.describe_container_instances(cluster="fleet", containerInstances=[arn],
                                          include=["CONTAINER_INSTANCE_HEALTH"])["containerInstances"][0]
    return next(d for d in ci["healthStatus"]["details"] if d["type"] == "DAEMON")


def test_a_non_critical_daemon_that_exits_at_once_has_no_successful_start_and_one_host_without_it(server, tmp_path):
    ecs, daemon, agent = setup(server, tmp_path, ["sh", "-c", "exit 3"], critical=False)
    agent.wait_active(ecs)

    # Failed, restarted with backoff, failed again: three decided starts, all failures.
    found = wait_for(lambda: (r := report(server))["startsFailed"] >= 3 and r, timeout=30, interval=0.2,
                     message="three failed daemon starts in the report")
    assert found["daemonArn"] == daemon
    assert found["startSuccessRate"] == 0.0 and found["startsSucceeded"] == 0
    assert found["restarts"] >= 2 and found["restartsPerHour"] == found["restarts"]
    assert (found["hostsRunning"], found["hostsWithoutDaemon"]) == (0, 1)
    assert found["mttrRecoverSeconds"] is None and found["mttrReplaceSeconds"] is None  # it never ran

    samples = scrape(server)
    labels = 'cluster="fleet",daemon="agentd"'
    assert samples[f"shoal_daemon_start_success_ratio{{{labels}}}"] == 0.0
    assert samples[f"shoal_daemon_restarts_per_hour{{{labels}}}"] >= 2
    assert samples[f"shoal_daemon_hosts_without_daemon{{{labels}}}"] == 1
    assert f'shoal_daemon_mttr_seconds{{{labels},kind="recover"}}' not in samples  # no data, no sample
    assert samples['shoal_container_instances{cluster="fleet",status="ACTIVE"}'] == 1


def test_a_critical_daemon_that_dies_and_runs_again_counts_one_recovery(server, tmp_path):
    flag = tmp_path / "fail"
    # Runs until the flag exists; while it exists, every restart fails at once.
    ecs, daemon, agent = setup(server, tmp_path, ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 1"],
                               critical=True)
    arn = agent.wait_active(ecs)["containerInstanceArn"]
    assert report(server)["hostsWithoutDaemon"] == 0

    flag.touch()  # the daemon exits
    down = time.time()
    wait_for(lambda: daemon_check(ecs, arn)["status"] == "IMPAIRED", timeout=10, interval=0.05,
             message="the DAEMON check to go IMPAIRED")
    wait_for(lambda: report(server)["restarts"] >= 1, timeout=20, interval=0.1, message="a restart")
    flag.unlink()  # the next restart runs, and once it has stayed up, the episode is over
    up = time.time()
    found = wait_for(lambda: (r := report(server))["recoveries"] == 1 and r, timeout=60, interval=0.2,
                     message="one recovery in the report")
    assert daemon_check(ecs, arn)["status"] == "OK"
    # From the daemon's failure until it had run again for the start grace (10 s).
    assert up - down <= found["mttrRecoverSeconds"] <= time.time() - down + 1
    assert found["mttrRecoverSeconds"] >= 10
    assert found["hostsWithoutDaemon"] == 0 and found["startsFailed"] >= 1
    assert 0 < found["startSuccessRate"] < 1
    labels = 'cluster="fleet",daemon="agentd"'
    assert scrape(server)[f'shoal_daemon_mttr_seconds{{{labels},kind="recover"}}'] == found["mttrRecoverSeconds"]


@pytest.fixture
def managed_server(tmp_path):
    """A server whose local provisioner launches real `shoal agent --simulate` hosts."""
    srv = ServerProcess(tmp_path / "server", extra_args=("--scale-in-after", "600")).start()
    yield srv
    srv.stop()
    kill_workloads(tmp_path)  # hosts (agents) and their tasks outlive the server by design
    for pid_file in tmp_path.rglob("agent.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def test_a_managed_host_replaced_for_its_critical_daemon_counts_one_repair(managed_server):
    server = managed_server
    ecs = managed_fleet(server, 1, ["sleep", "600"])
    [victim] = wait_for(lambda: hosts(ecs, "ACTIVE"), timeout=60, message="an ACTIVE host")
    assert report(server)["repairs"] == 0

    kill_daemon_on(server, victim, ecs)
    wait_for(lambda: any(c["containerInstanceArn"] == victim["containerInstanceArn"] and c["status"] == "INACTIVE"
                         for c in instance_changes(server)), timeout=90, message="the old host to be terminated")
    [completed] = [a for a in actions(server) if a["eventName"] == "HOST_REPAIR_COMPLETED"]
    assert completed["detail"]["daemon"] == "agentd"
    found = report(server)
    assert found["repairs"] == 1 and found["mttrReplaceSeconds"] == completed["detail"]["durationSeconds"] > 0
    assert found["recoveries"] == 0  # the daemon never ran again on the old host: it was replaced
    assert found["hostsWithoutDaemon"] == 0  # the replacement runs it
    labels = 'cluster="fleet",daemon="agentd"'
    assert scrape(server)[f'shoal_daemon_mttr_seconds{{{labels},kind="replace"}}'] == found["mttrReplaceSeconds"]
