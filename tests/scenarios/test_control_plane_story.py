"""Story: an ECS user drives a whole control-plane flow through boto3 against a real server.

A cluster gets capacity providers of both kinds, a GPU family and an MPS family are registered,
a task is run and waits PENDING (no agent yet), the user stops it, and the event log then tells
exactly that story, in order.
"""

import pytest

MI_CONFIG = {
    "infrastructureRoleArn": "arn:aws:iam::000000000000:role/shoal-infra",
    "instanceLaunchTemplate": {"ec2InstanceProfileArn": "arn:aws:iam::000000000000:instance-profile/p",
                               "networkConfiguration": {"subnets": ["subnet-local"]}},
}


def test_cluster_capacity_task_lifecycle_and_events(server, ecs, unique):
    cursor_before = server.events()
    name = unique("gpu")
    cluster = ecs.create_cluster(clusterName=name, tags=[{"key": "team", "value": "ml"}])["cluster"]
    assert cluster["clusterArn"].endswith(f":cluster/{name}") and cluster["status"] == "ACTIVE"

    managed = ecs.create_capacity_provider(name=unique("mi"), cluster=name,
                                           managedInstancesProvider=MI_CONFIG)["capacityProvider"]
    assert managed["type"] == "MANAGED_INSTANCES"
    assert managed["managedInstancesProvider"]["autoRepairConfiguration"]["actionsStatus"] == "ENABLED"
    selfm = ecs.create_capacity_provider(name=unique("onprem"), autoScalingGroupProvider={
        "autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:x"})["capacityProvider"]
    assert selfm["type"] == "EC2_AUTOSCALING"
    ecs.put_cluster_capacity_providers(
        cluster=name, capacityProviders=[managed["name"], selfm["name"]],
        defaultCapacityProviderStrategy=[{"capacityProvider": selfm["name"], "weight": 1}])
    described = ecs.describe_capacity_providers(capacityProviders=[managed["name"], selfm["name"]])
    assert {p["name"] for p in described["capacityProviders"]} == {managed["name"], selfm["name"]}

    whole = ecs.register_task_definition(family=unique("train"), containerDefinitions=[
        {"name": "trainer", "image": "pytorch", "memory": 4096,
         "resourceRequirements": [{"type": "GPU", "value": "8"}]}])["taskDefinition"]
    mps = ecs.register_task_definition(family=unique("infer"), containerDefinitions=[
        {"name": "server", "image": "vllm", "memory": 2048, "resourceRequirements": [
            {"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 16384, "maxComputePercent": 25}}}]}]
    )["taskDefinition"]
    assert whole["revision"] == 1 and mps["revision"] == 1
    assert mps["requiresAttributes"] == [{"name": "ecs.capability.gpu-sharing-mps"}]
    again = ecs.describe_task_definition(taskDefinition=mps["family"])["taskDefinition"]
    shared = again["containerDefinitions"][0]["resourceRequirements"][0]["sharingStrategy"]["nvidiaMps"]
    assert shared == {"memory": 16384, "maxComputePercent": 25}

    run = ecs.run_task(cluster=name, taskDefinition=mps["taskDefinitionArn"], launchType="EC2",
                       startedBy="story")
    assert run["failures"] == []
    task = run["tasks"][0]
    assert (task["lastStatus"], task["desiredStatus"]) == ("PENDING", "RUNNING")
    assert ecs.list_tasks(cluster=name)["taskArns"] == [task["taskArn"]]
    counts = ecs.describe_clusters(clusters=[name])["clusters"][0]
    assert counts["pendingTasksCount"] == 1 and counts["runningTasksCount"] == 0

    stopped = ecs.stop_task(cluster=name, task=task["taskArn"].split("/")[-1], reason="changed my mind")["task"]
    assert (stopped["lastStatus"], stopped["stopCode"]) == ("STOPPED", "UserInitiated")
    assert stopped["stoppedReason"] == "changed my mind"
    assert ecs.list_tasks(cluster=name)["taskArns"] == []
    assert ecs.list_tasks(cluster=name, desiredStatus="STOPPED")["taskArns"] == [task["taskArn"]]

    new_events = server.events()[len(cursor_before):]
    task_events = [e for e in new_events if e["resources"] == [task["taskArn"]]]
    assert [e["detail-type"] for e in task_events] == ["ECS Task State Change"] * 2
    assert [e["detail"]["lastStatus"] for e in task_events] == ["PENDING", "STOPPED"]
    assert task_events[1]["detail"]["stopCode"] == "UserInitiated"
    assert task_events[1]["detail"]["version"] > task_events[0]["detail"]["version"]
    for env in task_events:
        assert env["source"] == "shoal.ecs" and env["version"] == "0"
        assert env["detail"]["clusterArn"] == cluster["clusterArn"]
        assert env["detail"]["createdAt"].endswith("Z")  # ISO in events, epoch in the API

    ecs.delete_cluster(cluster=name)
    assert ecs.describe_clusters(clusters=[name])["clusters"][0]["status"] == "INACTIVE"
    with pytest.raises(ecs.exceptions.ClusterNotFoundException):
        ecs.run_task(cluster=name, taskDefinition=mps["family"])
