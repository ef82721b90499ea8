"""`shoal explain recovery` and GET /v1/explain/recovery: who owns recovery per capacity
provider, built from the live configuration (issue #6 point 3)."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_placement import register_host
from tests.support import shoal_cli

MI = {"infrastructureRoleArn": "arn:shoal:iam::000000000000:role/x",
      "instanceLaunchTemplate": {"ec2InstanceProfileArn": "arn:shoal:iam::000000000000:instance-profile/x",
                                 "networkConfiguration": {"subnets": []},
                                 "instanceRequirements": {"vCpuCount": {"min": 1}, "memoryMiB": {"min": 1},
                                                          "allowedInstanceTypes": ["g6e.xlarge"]}}}


@pytest.fixture
def fleet(server, ecs, unique):
    """A cluster with three providers: managed (repair on), managed (repair off), self-managed;
    a critical and a non-critical daemon on them; one host of the self-managed one."""
    cluster, on, off, own = unique("rc"), unique("on"), unique("off"), unique("own")
    ecs.create_cluster(clusterName=cluster)
    ecs.create_capacity_provider(name=on, cluster=cluster, managedInstancesProvider=MI)
    ecs.create_capacity_provider(name=off, cluster=cluster, managedInstancesProvider={
        **MI, "autoRepairConfiguration": {"actionsStatus": "DISABLED"}})
    ecs.create_capacity_provider(name=own, autoScalingGroupProvider={
        "autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:x"})
    ecs.put_cluster_capacity_providers(cluster=cluster, capacityProviders=[on, off, own],
                                       defaultCapacityProviderStrategy=[])
    td = ecs.register_daemon_task_definition(family=unique("d"), containerDefinitions=[
        {"name": "d", "image": "busybox", "memory": 32}])["daemonTaskDefinitionArn"]
    ecs.create_daemon(clusterArn=cluster, daemonName="logs", daemonTaskDefinitionArn=td, capacityProviderArns=[on, own])
    ecs.create_daemon(clusterArn=cluster, daemonName="metrics", daemonTaskDefinitionArn=td, critical=False,
                      capacityProviderArns=[on, off, own])
    register_host(server, cluster, capacity_provider=own,
                  attributes=[{"name": "shoal.mps.probe-interval", "value": "7"},
                              {"name": "shoal.gpu.xid-set", "value": "48,79"}])
    return {"cluster": cluster, "on": on, "off": off, "own": own}


def explain(server, **params) -> dict:
    resp = server.get("/v1/explain/recovery", params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_each_provider_says_who_detects_who_acts_and_where_resumption_ends(server, fleet):
    found = explain(server, cluster=fleet["cluster"])
    assert set(found) == {fleet["on"], fleet["off"], fleet["own"]}

    on = found[fleet["on"]]
    assert on["autoRepair"] == "ENABLED" and on["action"]["by"] == "shoal (repair controller)"
    assert on["criticalDaemons"] == ["logs"]
    assert on["rateLimit"]["maxDrainingAtOnce"] == 1 and on["rateLimit"]["coolDownSeconds"] == 600
    assert "re-run, not resumed" in on["taskResumption"]
    daemon_check = on["detectors"][0]
    assert daemon_check["daemons"] == [{"name": "logs", "critical": True}, {"name": "metrics", "critical": False}]
    assert "daemonStartTimeout 300 s" in on["detectors"][1]["threshold"]

    off = found[fleet["off"]]
    assert off["autoRepair"] == "DISABLED" and off["action"]["by"] == "the operator"
    assert off["rateLimit"] is None and "auto repair is DISABLED" in off["action"]["what"]

    own = found[fleet["own"]]
    assert own["managed"] is False and own["action"]["by"] == "the operator"
    assert "self-managed" in own["action"]["what"] and own["taskResumption"].startswith("Nothing is moved")
    # The agents' own settings, as the host advertised them.
    checks = {(d["check"], d["detector"]): d for d in own["detectors"]}
    assert "every 7 s" in checks[("ACCELERATED_COMPUTE", "the host's agent (MPS control daemon probe)")]["threshold"]
    assert "{48,79}" in checks[("ACCELERATED_COMPUTE", "the host's agent (NVML Xid events)")]["threshold"]


def test_one_provider_bad_references_and_the_cli(server, fleet, tmp_path):
    assert set(explain(server, cluster=fleet["cluster"], capacityProvider=fleet["off"])) == {fleet["off"]}
    missing = server.get("/v1/explain/recovery", {"cluster": "no-such-cluster"})
    assert missing.status_code == 400 and missing.json()["__type"] == "ClusterNotFoundException"
    stranger = server.get("/v1/explain/recovery", {"cluster": fleet["cluster"], "capacityProvider": "nope"})
    assert stranger.status_code == 400 and "'capacityProvider'" in stranger.json()["message"]

    out = json.loads(shoal_cli(server, tmp_path, "explain", "recovery", "--cluster", fleet["cluster"], "--json").stdout)
    assert out == explain(server, cluster=fleet["cluster"])
    table = shoal_cli(server, tmp_path, "explain", "recovery", "--cluster", fleet["cluster"]).stdout
    assert f"{fleet['on']}  (managed; auto repair ENABLED)" in table and "RATE LIMIT   at most 1 of 0" in table
    assert f"{fleet['own']}  (self-managed; auto repair n/a (self-managed))" in table
