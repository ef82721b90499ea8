"""The ECS API behaviour an ECS user relies on, through boto3 against a real server.

One server per module (and backend); every test works in clusters and families of its own, so
tests never see each other's resources except in account-wide listings, which they filter.
"""

from __future__ import annotations

import itertools
import json

import pytest
from botocore.exceptions import ClientError

HEALTH_CHECKS = {"CONTAINER_RUNTIME", "ACCELERATED_COMPUTE", "DAEMON", "AGENT_CONNECTIVITY"}
_instance_ids = itertools.count(1)


# --- helpers -------------------------------------------------------------------------------------

def error_code(excinfo) -> str:
    return excinfo.value.response["Error"]["Code"]


def all_pages(call, key: str, **kwargs) -> tuple[list, int]:
    """Every item of a paginated List* call, following nextToken; and how many pages it took."""
    items, pages, token = [], 0, None
    while True:
        resp = call(**kwargs, **({"nextToken": token} if token else {}))
        items += resp[key]
        pages += 1
        token = resp.get("nextToken")
        if not token:
            return items, pages


def family(ecs, name: str, **extra) -> dict:
    return ecs.register_task_definition(family=name, containerDefinitions=[
        {"name": "app", "image": "busybox", "memory": 128}], **extra)["taskDefinition"]


def cluster(ecs, unique, **extra) -> str:
    name = unique("c")
    ecs.create_cluster(clusterName=name, **extra)
    return name


def register(ecs, cluster_name: str, *, instance_type: str = "p5.48xlarge", gpus: list[str] | None = None,
             attributes: list[dict] | None = None, ec2_id: str | None = None) -> dict:
    """A container instance registered the way an agent registers one."""
    ec2_id = ec2_id or f"i-{next(_instance_ids):017x}"
    resources = [{"name": "CPU", "type": "INTEGER", "integerValue": 4096},
                 {"name": "MEMORY", "type": "INTEGER", "integerValue": 16384}]
    if gpus is not None:
        resources.append({"name": "GPU", "type": "STRINGSET", "stringSetValue": gpus})
    return ecs.register_container_instance(
        cluster=cluster_name, totalResources=resources, attributes=attributes or [],
        instanceIdentityDocument=json.dumps({"instanceId": ec2_id, "instanceType": instance_type,
                                             "availabilityZone": "local-1a"}),
    )["containerInstance"]


def short(arn: str) -> str:
    return arn.split("/")[-1]


def events_for(server, arn: str) -> list[dict]:
    return [e for e in server.events() if e["resources"] == [arn]]


# --- clusters ------------------------------------------------------------------------------------

def test_create_cluster_is_idempotent_for_an_active_name(ecs, unique):
    name = unique()
    first = ecs.create_cluster(clusterName=name)["cluster"]
    again = ecs.create_cluster(clusterName=name)["cluster"]
    assert again["clusterArn"] == first["clusterArn"] and again["status"] == "ACTIVE"
    listed, _ = all_pages(ecs.list_clusters, "clusterArns")
    assert listed.count(first["clusterArn"]) == 1


def test_delete_cluster_refuses_a_cluster_with_live_tasks(ecs, unique):
    name = cluster(ecs, unique)
    task = ecs.run_task(cluster=name, taskDefinition=family(ecs, unique("f"))["taskDefinitionArn"])["tasks"][0]
    with pytest.raises(ecs.exceptions.ClusterContainsTasksException):
        ecs.delete_cluster(cluster=name)
    ecs.stop_task(cluster=name, task=task["taskArn"])
    assert ecs.delete_cluster(cluster=name)["cluster"]["status"] == "INACTIVE"


def test_delete_cluster_refuses_a_cluster_with_registered_instances(ecs, unique):
    name = cluster(ecs, unique)
    instance = register(ecs, name)
    with pytest.raises(ecs.exceptions.ClusterContainsContainerInstancesException):
        ecs.delete_cluster(cluster=name)
    ecs.deregister_container_instance(cluster=name, containerInstance=instance["containerInstanceArn"])
    assert ecs.delete_cluster(cluster=name)["cluster"]["status"] == "INACTIVE"


def test_describe_clusters_counts_instances_and_pending_tasks(ecs, unique):
    name = cluster(ecs, unique)
    register(ecs, name)
    register(ecs, name)
    ecs.run_task(cluster=name, taskDefinition=family(ecs, unique("f"))["family"], count=2)
    described = ecs.describe_clusters(clusters=[name])["clusters"][0]
    assert described["registeredContainerInstancesCount"] == 2
    assert (described["pendingTasksCount"], described["runningTasksCount"]) == (2, 0)


# --- pagination ----------------------------------------------------------------------------------

def test_list_clusters_pages_return_every_cluster_exactly_once(ecs, unique):
    mine = {ecs.create_cluster(clusterName=unique("page"))["cluster"]["clusterArn"] for _ in range(5)}
    listed, pages = all_pages(ecs.list_clusters, "clusterArns", maxResults=2)
    assert len(listed) == len(set(listed)) and mine <= set(listed)
    assert pages == (len(listed) + 1) // 2
    assert listed == all_pages(ecs.list_clusters, "clusterArns", maxResults=100)[0]


def test_list_task_definitions_pages_return_every_revision_exactly_once(ecs, unique):
    name = unique("fam")
    arns = [family(ecs, name)["taskDefinitionArn"] for _ in range(5)]
    listed, pages = all_pages(ecs.list_task_definitions, "taskDefinitionArns", familyPrefix=name, maxResults=2)
    assert (listed, pages) == (arns, 3)


def test_list_tasks_pages_return_every_task_exactly_once(ecs, unique):
    name = cluster(ecs, unique)
    td = family(ecs, unique("f"))["family"]
    arns = [t["taskArn"] for t in ecs.run_task(cluster=name, taskDefinition=td, count=5)["tasks"]]
    listed, pages = all_pages(ecs.list_tasks, "taskArns", cluster=name, maxResults=2)
    assert sorted(listed) == sorted(arns) and len(listed) == 5 and pages == 3


# --- task definitions ----------------------------------------------------------------------------

def test_registering_a_family_again_adds_revisions(ecs, unique):
    name = unique("fam")
    assert [family(ecs, name)["revision"] for _ in range(3)] == [1, 2, 3]


def test_describe_by_family_returns_the_latest_active_revision(ecs, unique):
    name = unique("fam")
    for _ in range(3):
        family(ecs, name)
    assert ecs.describe_task_definition(taskDefinition=name)["taskDefinition"]["revision"] == 3
    gone = ecs.deregister_task_definition(taskDefinition=f"{name}:3")["taskDefinition"]
    assert gone["status"] == "INACTIVE"
    assert ecs.describe_task_definition(taskDefinition=name)["taskDefinition"]["revision"] == 2
    assert ecs.describe_task_definition(taskDefinition=f"{name}:3")["taskDefinition"]["status"] == "INACTIVE"


def test_list_task_definition_families_by_status(ecs, unique):
    prefix = unique("famstat")
    live, retired = f"{prefix}-live", f"{prefix}-retired"
    family(ecs, live)
    family(ecs, retired)
    ecs.deregister_task_definition(taskDefinition=f"{retired}:1")

    def families(status):
        return ecs.list_task_definition_families(familyPrefix=prefix, status=status)["families"]

    assert families("ACTIVE") == [live]
    assert families("INACTIVE") == [retired]
    assert families("ALL") == [live, retired]


def test_delete_task_definitions_only_deletes_inactive_revisions(ecs, unique):
    td = family(ecs, unique("fam"))
    refused = ecs.delete_task_definitions(taskDefinitions=[td["taskDefinitionArn"]])
    assert refused["taskDefinitions"] == []
    assert [f["arn"] for f in refused["failures"]] == [td["taskDefinitionArn"]]
    ecs.deregister_task_definition(taskDefinition=td["taskDefinitionArn"])
    deleted = ecs.delete_task_definitions(taskDefinitions=[td["taskDefinitionArn"]])
    assert deleted["failures"] == []
    assert [(d["taskDefinitionArn"], d["status"]) for d in deleted["taskDefinitions"]] == \
        [(td["taskDefinitionArn"], "DELETE_IN_PROGRESS")]


def test_run_task_with_an_inactive_revision_fails(ecs, unique):
    name = cluster(ecs, unique)
    td = family(ecs, unique("fam"))
    ecs.deregister_task_definition(taskDefinition=td["taskDefinitionArn"])
    with pytest.raises(ecs.exceptions.ClientException):
        ecs.run_task(cluster=name, taskDefinition=td["taskDefinitionArn"])
    assert ecs.list_tasks(cluster=name)["taskArns"] == []


# --- RunTask -------------------------------------------------------------------------------------

def test_run_task_count_creates_that_many_distinct_tasks(ecs, unique):
    name = cluster(ecs, unique)
    run = ecs.run_task(cluster=name, taskDefinition=family(ecs, unique("f"))["family"], count=3)
    arns = [t["taskArn"] for t in run["tasks"]]
    assert run["failures"] == [] and len(set(arns)) == 3
    assert sorted(ecs.list_tasks(cluster=name)["taskArns"]) == sorted(arns)


def test_run_task_client_token_replays_the_first_answer(server, ecs, unique):
    name = cluster(ecs, unique)
    td = family(ecs, unique("f"))["family"]
    first = ecs.run_task(cluster=name, taskDefinition=td, count=2, clientToken="tok-1")
    arns = [t["taskArn"] for t in first["tasks"]]
    events_before = [e for e in server.events() if set(e["resources"]) & set(arns)]
    again = ecs.run_task(cluster=name, taskDefinition=td, count=2, clientToken="tok-1")
    assert [t["taskArn"] for t in again["tasks"]] == arns
    assert sorted(ecs.list_tasks(cluster=name)["taskArns"]) == sorted(arns)
    assert [e for e in server.events() if set(e["resources"]) & set(arns)] == events_before
    assert len(events_before) == 2


def test_run_task_client_token_with_different_parameters_conflicts(ecs, unique):
    name = cluster(ecs, unique)
    td = family(ecs, unique("f"))["family"]
    ecs.run_task(cluster=name, taskDefinition=td, clientToken="tok-2")
    with pytest.raises(ecs.exceptions.ConflictException):
        ecs.run_task(cluster=name, taskDefinition=td, count=2, clientToken="tok-2")
    assert len(ecs.list_tasks(cluster=name)["taskArns"]) == 1


def _self_managed_provider(ecs, unique) -> str:
    provider = ecs.create_capacity_provider(name=unique("cp"), autoScalingGroupProvider={
        "autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:x"})["capacityProvider"]
    return provider["name"]


def test_run_task_with_a_capacity_provider_strategy_waits_provisioning(ecs, unique):
    name = cluster(ecs, unique)
    provider = _self_managed_provider(ecs, unique)
    ecs.put_cluster_capacity_providers(cluster=name, capacityProviders=[provider],
                                       defaultCapacityProviderStrategy=[])
    task = ecs.run_task(cluster=name, taskDefinition=family(ecs, unique("f"))["family"],
                        capacityProviderStrategy=[{"capacityProvider": provider, "weight": 1}])["tasks"][0]
    assert task["lastStatus"] == "PROVISIONING" and "launchType" not in task


def test_cluster_default_strategy_applies_when_neither_launch_type_nor_strategy_is_given(ecs, unique):
    name = cluster(ecs, unique)
    provider = _self_managed_provider(ecs, unique)
    ecs.put_cluster_capacity_providers(cluster=name, capacityProviders=[provider],
                                       defaultCapacityProviderStrategy=[{"capacityProvider": provider, "weight": 1}])
    td = family(ecs, unique("f"))["family"]
    by_default = ecs.run_task(cluster=name, taskDefinition=td)["tasks"][0]
    assert by_default["lastStatus"] == "PROVISIONING" and "launchType" not in by_default
    explicit = ecs.run_task(cluster=name, taskDefinition=td, launchType="EC2")["tasks"][0]
    assert (explicit["lastStatus"], explicit["launchType"]) == ("PENDING", "EC2")


# --- StartTask -----------------------------------------------------------------------------------

def test_start_task_places_the_task_on_the_named_instance(ecs, unique):
    name = cluster(ecs, unique)
    instance = register(ecs, name, ec2_id="i-0123456789abcdef0")
    td = family(ecs, unique("f"))["family"]
    task = ecs.start_task(cluster=name, taskDefinition=td,
                          containerInstances=[short(instance["containerInstanceArn"])])["tasks"][0]
    assert task["containerInstanceArn"] == instance["containerInstanceArn"]
    assert ecs.list_tasks(cluster=name, containerInstance=instance["containerInstanceArn"])["taskArns"] == \
        [task["taskArn"]]
    assert ecs.list_tasks(cluster=name, containerInstance=short(instance["containerInstanceArn"]))["taskArns"] == \
        [task["taskArn"]]
    stopped = ecs.stop_task(cluster=name, task=task["taskArn"])["task"]
    assert stopped["lastStatus"] == "STOPPED"
    assert ecs.list_tasks(cluster=name, containerInstance=instance["containerInstanceArn"])["taskArns"] == []


# --- container instances -------------------------------------------------------------------------

def test_describe_container_instances_by_id_arn_and_ec2_instance_id(ecs, unique):
    name = cluster(ecs, unique)
    arn = register(ecs, name, ec2_id="i-0123456789abcdef0")["containerInstanceArn"]
    for ref in (short(arn), arn, "i-0123456789abcdef0"):
        found = ecs.describe_container_instances(cluster=name, containerInstances=[ref])
        assert found["failures"] == [], ref
        assert [(d["containerInstanceArn"], d["ec2InstanceId"]) for d in found["containerInstances"]] == \
            [(arn, "i-0123456789abcdef0")], ref


def test_container_instance_health_only_when_included(ecs, unique):
    name = cluster(ecs, unique)
    arn = register(ecs, name)["containerInstanceArn"]
    plain = ecs.describe_container_instances(cluster=name, containerInstances=[arn])["containerInstances"][0]
    assert "healthStatus" not in plain
    with_health = ecs.describe_container_instances(cluster=name, containerInstances=[arn],
                                                   include=["CONTAINER_INSTANCE_HEALTH"])["containerInstances"][0]
    health = with_health["healthStatus"]
    assert "overallStatus" in health
    assert {d["type"] for d in health["details"]} == HEALTH_CHECKS and len(health["details"]) == 4


def test_gpu_devices_come_from_a_gpu_stringset(ecs, unique):
    name = cluster(ecs, unique)
    gpu = register(ecs, name, gpus=["GPU-aaaa", "GPU-bbbb"])["containerInstanceArn"]
    cpu = register(ecs, name, instance_type="c7i.large")["containerInstanceArn"]
    found = {d["containerInstanceArn"]: d for d in ecs.describe_container_instances(
        cluster=name, containerInstances=[gpu, cpu])["containerInstances"]}
    assert [d["gpuId"] for d in found[gpu]["gpuDevices"]] == ["GPU-aaaa", "GPU-bbbb"]
    registered = {r["name"]: r for r in found[gpu]["registeredResources"]}
    assert registered["GPU"]["stringSetValue"] == ["GPU-aaaa", "GPU-bbbb"]
    assert not found[cpu].get("gpuDevices")
    assert "GPU" not in {r["name"] for r in found[cpu]["registeredResources"]}


def test_list_container_instances_by_status(ecs, unique):
    name = cluster(ecs, unique)
    active = register(ecs, name)["containerInstanceArn"]
    draining = register(ecs, name)["containerInstanceArn"]
    ecs.update_container_instances_state(cluster=name, containerInstances=[draining], status="DRAINING")
    assert ecs.list_container_instances(cluster=name, status="ACTIVE")["containerInstanceArns"] == [active]
    assert ecs.list_container_instances(cluster=name, status="DRAINING")["containerInstanceArns"] == [draining]
    assert sorted(ecs.list_container_instances(cluster=name)["containerInstanceArns"]) == sorted([active, draining])


def test_list_container_instances_with_a_cluster_query_filter(ecs, unique):
    name = cluster(ecs, unique)
    p5 = register(ecs, name, instance_type="p5.48xlarge",
                  attributes=[{"name": "stack", "value": "prod"}])["containerInstanceArn"]
    g5 = register(ecs, name, instance_type="g5.xlarge",
                  attributes=[{"name": "stack", "value": "dev"}])["containerInstanceArn"]
    p4 = register(ecs, name, instance_type="p4d.24xlarge")["containerInstanceArn"]

    def matching(expression):
        return ecs.list_container_instances(cluster=name, filter=expression)["containerInstanceArns"]

    assert matching("attribute:ecs.instance-type =~ p5.*") == [p5]
    assert matching("attribute:stack == prod") == [p5]
    assert sorted(matching("attribute:stack != prod")) == sorted([g5, p4])
    with pytest.raises(ecs.exceptions.InvalidParameterException):
        matching("attribute:stack ==")


def test_draining_and_reactivating_emit_instance_state_changes(server, ecs, unique):
    name = cluster(ecs, unique)
    arn = register(ecs, name)["containerInstanceArn"]
    drained = ecs.update_container_instances_state(cluster=name, containerInstances=[arn], status="DRAINING")
    assert drained["failures"] == [] and drained["containerInstances"][0]["status"] == "DRAINING"
    ecs.update_container_instances_state(cluster=name, containerInstances=[arn], status="ACTIVE")
    changes = events_for(server, arn)
    assert {e["detail-type"] for e in changes} == {"ECS Container Instance State Change"}
    assert [e["detail"]["status"] for e in changes] == ["ACTIVE", "DRAINING", "ACTIVE"]
    versions = [e["detail"]["version"] for e in changes]
    assert versions == sorted(set(versions))


def test_deregistering_an_instance_with_a_live_task_needs_force(ecs, unique):
    name = cluster(ecs, unique)
    arn = register(ecs, name)["containerInstanceArn"]
    ecs.start_task(cluster=name, taskDefinition=family(ecs, unique("f"))["family"], containerInstances=[arn])
    with pytest.raises(ecs.exceptions.InvalidParameterException):
        ecs.deregister_container_instance(cluster=name, containerInstance=arn)
    assert ecs.list_container_instances(cluster=name)["containerInstanceArns"] == [arn]
    gone = ecs.deregister_container_instance(cluster=name, containerInstance=arn, force=True)["containerInstance"]
    assert gone["status"] == "INACTIVE"
    assert ecs.list_container_instances(cluster=name)["containerInstanceArns"] == []


# --- attributes ----------------------------------------------------------------------------------

def test_put_list_and_delete_attributes(ecs, unique):
    name = cluster(ecs, unique)
    arn = register(ecs, name)["containerInstanceArn"]
    other = register(ecs, name)["containerInstanceArn"]
    ecs.put_attributes(cluster=name, attributes=[
        {"name": "stack", "value": "prod", "targetType": "container-instance", "targetId": short(arn)},
        {"name": "stack", "value": "dev", "targetType": "container-instance", "targetId": other}])

    def listed(**query):
        return sorted((a["targetId"], a.get("value")) for a in ecs.list_attributes(
            cluster=name, targetType="container-instance", **query)["attributes"])

    assert listed(attributeName="stack") == sorted([(arn, "prod"), (other, "dev")])
    assert listed(attributeName="stack", attributeValue="prod") == [(arn, "prod")]
    assert listed(attributeName="stack", attributeValue="staging") == []
    ecs.delete_attributes(cluster=name, attributes=[{"name": "stack", "targetId": arn}])
    assert listed(attributeName="stack") == [(other, "dev")]


# --- tags ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["cluster", "task-definition", "task"])
def test_tag_list_and_untag_a_resource(ecs, unique, kind):
    name = cluster(ecs, unique)
    td = family(ecs, unique("f"))
    arn = {
        "cluster": lambda: ecs.describe_clusters(clusters=[name])["clusters"][0]["clusterArn"],
        "task-definition": lambda: td["taskDefinitionArn"],
        "task": lambda: ecs.run_task(cluster=name, taskDefinition=td["family"])["tasks"][0]["taskArn"],
    }[kind]()
    ecs.tag_resource(resourceArn=arn, tags=[{"key": "team", "value": "ml"}, {"key": "cost", "value": "42"}])
    ecs.tag_resource(resourceArn=arn, tags=[{"key": "team", "value": "infra"}])
    tags = ecs.list_tags_for_resource(resourceArn=arn)["tags"]
    assert sorted((t["key"], t["value"]) for t in tags) == [("cost", "42"), ("team", "infra")]
    ecs.untag_resource(resourceArn=arn, tagKeys=["cost"])
    assert ecs.list_tags_for_resource(resourceArn=arn)["tags"] == [{"key": "team", "value": "infra"}]


def test_describe_tasks_shows_tags_only_when_included(ecs, unique):
    name = cluster(ecs, unique)
    task = ecs.run_task(cluster=name, taskDefinition=family(ecs, unique("f"))["family"],
                        tags=[{"key": "owner", "value": "alice"}])["tasks"][0]
    ecs.tag_resource(resourceArn=task["taskArn"], tags=[{"key": "stage", "value": "eval"}])
    with_tags = ecs.describe_tasks(cluster=name, tasks=[task["taskArn"]], include=["TAGS"])["tasks"][0]
    assert sorted((t["key"], t["value"]) for t in with_tags["tags"]) == [("owner", "alice"), ("stage", "eval")]
    plain = ecs.describe_tasks(cluster=name, tasks=[task["taskArn"]])["tasks"][0]
    assert "tags" not in plain


# --- names and ARNs ------------------------------------------------------------------------------

@pytest.mark.parametrize("cluster_form", ["name", "arn"])
@pytest.mark.parametrize("task_form", ["id", "arn"])
def test_tasks_and_clusters_accept_a_name_or_an_arn(ecs, unique, cluster_form, task_form):
    name = cluster(ecs, unique)
    cluster_arn = ecs.describe_clusters(clusters=[name])["clusters"][0]["clusterArn"]
    cluster_ref = name if cluster_form == "name" else cluster_arn
    arn = ecs.run_task(cluster=cluster_ref, taskDefinition=family(ecs, unique("f"))["family"])["tasks"][0]["taskArn"]
    ref = short(arn) if task_form == "id" else arn
    described = ecs.describe_tasks(cluster=cluster_ref, tasks=[ref])
    assert described["failures"] == [] and [t["taskArn"] for t in described["tasks"]] == [arn]
    stopped = ecs.stop_task(cluster=cluster_ref, task=ref)["task"]
    assert (stopped["taskArn"], stopped["lastStatus"]) == (arn, "STOPPED")
    assert ecs.list_tasks(cluster=cluster_ref, desiredStatus="STOPPED")["taskArns"] == [arn]


def test_describe_tasks_reports_unknown_tasks_as_missing_failures(ecs, unique):
    name = cluster(ecs, unique)
    described = ecs.describe_tasks(cluster=name, tasks=["0123456789abcdef0123456789abcdef"])
    assert described["tasks"] == []
    assert [f["reason"] for f in described["failures"]] == ["MISSING"]


def test_unknown_cluster_is_cluster_not_found(ecs):
    with pytest.raises(ClientError) as excinfo:
        ecs.list_tasks(cluster="no-such-cluster")
    assert error_code(excinfo) == "ClusterNotFoundException"
