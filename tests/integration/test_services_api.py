"""The services API through boto3 against a real server, on SQLite and PostgreSQL: shapes, defaults,
listing, deployments, deletion, and bad input that names its field and leaves nothing behind.

No agent runs here: a cluster without hosts keeps service tasks waiting for one, which is all
these tests need from the scheduler (it still creates, counts and stops tasks).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from botocore.exceptions import ClientError

from tests.support import wait_for

ARN = "arn:shoal:ecs:local:000000000000"
NO_HOSTS = "No Container Instances were found in your cluster."


def error_code(excinfo) -> str:
    return excinfo.value.response["Error"]["Code"]


@pytest.fixture
def env(ecs, unique):
    """A cluster of its own and a task definition."""
    cluster = unique("svc")
    ecs.create_cluster(clusterName=cluster)
    td = ecs.register_task_definition(family=unique("web"), containerDefinitions=[
        {"name": "app", "image": "busybox", "memory": 64, "command": ["sleep", "60"]}])["taskDefinition"]
    return cluster, td["taskDefinitionArn"]


def describe(ecs, cluster: str, name: str, **kw) -> dict:
    return ecs.describe_services(cluster=cluster, services=[name], **kw)["services"][0]


def service_events(server, service_arn: str, detail_type: str | None = None) -> list[dict]:
    return [e for e in server.events() if service_arn in e["resources"]
            and (detail_type is None or e["detail-type"] == detail_type)]


def test_a_service_has_ecs_shapes_and_defaults_and_its_tasks_wait_for_a_host(server, ecs, env):
    cluster, td = env
    svc = ecs.create_service(cluster=cluster, serviceName="web", taskDefinition=td, desiredCount=2,
                             tags=[{"key": "team", "value": "ml"}])["service"]
    assert svc["serviceArn"] == f"{ARN}:service/{cluster}/web"
    assert svc["clusterArn"] == f"{ARN}:cluster/{cluster}"
    assert (svc["status"], svc["desiredCount"], svc["launchType"], svc["schedulingStrategy"]) == \
        ("ACTIVE", 2, "EC2", "REPLICA")
    assert svc["deploymentController"] == {"type": "ECS"} and svc["propagateTags"] == "NONE"
    assert svc["deploymentConfiguration"] == {"maximumPercent": 200, "minimumHealthyPercent": 100,
                                              "deploymentCircuitBreaker": {"enable": False, "rollback": False}}
    assert svc["placementStrategy"] == [] and svc["placementConstraints"] == [] and "tags" not in svc
    [dep] = svc["deployments"]
    assert re.fullmatch(r"ecs-svc/\d{19}", dep["id"])
    assert (dep["status"], dep["rolloutState"], dep["taskDefinition"], dep["desiredCount"]) == \
        ("PRIMARY", "IN_PROGRESS", td, 2)
    number = dep["id"].split("/")[1]
    assert svc["currentServiceDeployment"] == f"{ARN}:service-deployment/{cluster}/web/{number}"

    # The scheduler starts both tasks right after the commit; with no host they wait, saying why.
    svc = wait_for(lambda: (lambda s: s if s["pendingCount"] == 2 else None)(describe(ecs, cluster, "web")),
                   message="two pending tasks")
    assert svc["runningCount"] == 0 and svc["deployments"][0]["pendingCount"] == 2
    arns = ecs.list_tasks(cluster=cluster, serviceName="web")["taskArns"]
    tasks = ecs.describe_tasks(cluster=cluster, tasks=arns)["tasks"]
    assert {(t["group"], t["startedBy"], t["lastStatus"]) for t in tasks} == {("service:web", dep["id"], "PENDING")}
    assert describe(ecs, cluster, "web", include=["TAGS"])["tags"] == [{"key": "team", "value": "ml"}]
    assert "(service web) was unable to place a task" in svc["events"][0]["message"]

    # One SERVICE_TASK_PLACEMENT_FAILURE per episode, however many passes and tasks follow.
    ecs.update_service(cluster=cluster, service="web", desiredCount=3)
    wait_for(lambda: describe(ecs, cluster, "web")["pendingCount"] == 3, message="three pending tasks")
    actions = [e["detail"] for e in service_events(server, svc["serviceArn"], "ECS Service Action")]
    failures = [a for a in actions if a["eventName"] == "SERVICE_TASK_PLACEMENT_FAILURE"]
    assert len(failures) == 1 and failures[0]["eventType"] == "ERROR" and failures[0]["reasons"] == [NO_HOSTS]
    assert failures[0]["clusterArn"] == svc["clusterArn"]
    assert [a["desiredCount"] for a in actions if a["eventName"] == "SERVICE_DESIRED_COUNT_UPDATED"] == [3]

    [c] = ecs.describe_clusters(clusters=[cluster])["clusters"]
    assert c["activeServicesCount"] == 1 and c["pendingTasksCount"] == 3
    with pytest.raises(ClientError) as err:
        ecs.delete_cluster(cluster=cluster)
    assert error_code(err) == "ClusterContainsServicesException"


def test_list_and_describe(ecs, env):
    cluster, td = env
    for name in ("a", "b", "c"):
        ecs.create_service(cluster=cluster, serviceName=name, taskDefinition=td, desiredCount=0)
    page = ecs.list_services(cluster=cluster, maxResults=2)
    rest = ecs.list_services(cluster=cluster, nextToken=page["nextToken"])
    assert page["serviceArns"] + rest["serviceArns"] == [f"{ARN}:service/{cluster}/{n}" for n in "abc"]
    assert "nextToken" not in rest
    assert ecs.list_services(cluster=cluster, launchType="EXTERNAL")["serviceArns"] == []
    assert len(ecs.list_services(cluster=cluster, schedulingStrategy="REPLICA")["serviceArns"]) == 3

    out = ecs.describe_services(cluster=cluster, services=["a", f"{ARN}:service/{cluster}/b", "nope"])
    assert [s["serviceName"] for s in out["services"]] == ["a", "b"]
    assert out["failures"] == [{"arn": f"{ARN}:service/{cluster}/nope", "reason": "MISSING"}]
    with pytest.raises(ClientError) as err:
        ecs.describe_services(cluster=cluster, services=[str(i) for i in range(11)])
    assert error_code(err) == "InvalidParameterException" and "'services'" in str(err.value)
    # desiredCount 0: the deployment is complete at once, and the service steady.
    wait_for(lambda: describe(ecs, cluster, "a")["deployments"][0]["rolloutState"] == "COMPLETED",
             message="the empty deployment to complete")


def test_client_token_makes_create_service_idempotent(ecs, env):
    cluster, td = env
    first = ecs.create_service(cluster=cluster, serviceName="web", taskDefinition=td, desiredCount=0,
                               clientToken="token-1")["service"]
    again = ecs.create_service(cluster=cluster, serviceName="web", taskDefinition=td, desiredCount=0,
                               clientToken="token-1")["service"]
    assert again["serviceArn"] == first["serviceArn"]
    assert again["deployments"][0]["id"] == first["deployments"][0]["id"], "no second deployment"
    with pytest.raises(ClientError) as err:
        ecs.create_service(cluster=cluster, serviceName="web", taskDefinition=td, desiredCount=1,
                           clientToken="token-1")
    assert error_code(err) == "ConflictException"
    with pytest.raises(ClientError) as err:
        ecs.create_service(cluster=cluster, serviceName="web", taskDefinition=td, desiredCount=0)
    assert error_code(err) == "InvalidParameterException" and "not idempotent" in str(err.value)


def test_update_service_starts_deployments_and_lists_them_newest_first(server, ecs, env):
    cluster, td = env
    v2 = ecs.register_task_definition(family=td.split("/")[1].split(":")[0], containerDefinitions=[
        {"name": "app", "image": "busybox", "memory": 64, "command": ["sleep", "61"]}])["taskDefinition"]
    svc = ecs.create_service(cluster=cluster, serviceName="web", taskDefinition=td, desiredCount=1,
                             deploymentConfiguration={"deploymentCircuitBreaker": {"enable": True,
                                                                                   "rollback": False}})["service"]
    first_sd = svc["currentServiceDeployment"]
    updated = ecs.update_service(cluster=cluster, service="web", taskDefinition=v2["taskDefinitionArn"],
                                 deploymentConfiguration={"maximumPercent": 150})["service"]
    assert [d["status"] for d in updated["deployments"]] == ["PRIMARY", "ACTIVE"]
    assert updated["deployments"][0]["taskDefinition"] == v2["taskDefinitionArn"]
    assert updated["deploymentConfiguration"]["maximumPercent"] == 150
    assert updated["deploymentConfiguration"]["deploymentCircuitBreaker"] == {"enable": True, "rollback": False}
    second_sd = updated["currentServiceDeployment"]
    assert second_sd != first_sd

    briefs = ecs.list_service_deployments(cluster=cluster, service="web")["serviceDeployments"]
    assert [b["serviceDeploymentArn"] for b in briefs] == [second_sd, first_sd]
    assert [b["status"] for b in briefs] == ["IN_PROGRESS", "STOPPED"], "a superseded deployment is STOPPED"
    assert briefs[0]["targetServiceRevisionArn"].startswith(f"{ARN}:service-revision/{cluster}/web/")
    only = ecs.list_service_deployments(cluster=cluster, service="web", status=["STOPPED"])["serviceDeployments"]
    assert [b["serviceDeploymentArn"] for b in only] == [first_sd]
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    assert ecs.list_service_deployments(cluster=cluster, service="web",
                                        createdAt={"after": later})["serviceDeployments"] == []

    out = ecs.describe_service_deployments(serviceDeploymentArns=[second_sd, first_sd.replace("/web/", "/web/1")])
    [sd] = out["serviceDeployments"]
    assert out["failures"] == [{"arn": first_sd.replace("/web/", "/web/1"), "reason": "MISSING"}]
    assert sd["serviceArn"] == svc["serviceArn"] and sd["status"] == "IN_PROGRESS"
    assert sd["deploymentCircuitBreaker"] == {"status": "MONITORING", "failureCount": 0, "threshold": 3}
    assert sd["targetServiceRevision"]["requestedTaskCount"] == 1
    assert [r["arn"] for r in sd["sourceServiceRevisions"]] == \
        [first_sd.replace("service-deployment", "service-revision")]
    with pytest.raises(ClientError) as err:
        ecs.describe_service_deployments(serviceDeploymentArns=[svc["serviceArn"]])
    assert error_code(err) == "InvalidParameterException" and "serviceDeploymentArns[0]" in str(err.value)

    # forceNewDeployment: a third deployment; the old tasks (waiting, nowhere to run) go at once.
    forced = ecs.update_service(cluster=cluster, service="web", forceNewDeployment=True)["service"]
    assert len(ecs.list_service_deployments(cluster=cluster, service="web")["serviceDeployments"]) == 3
    wait_for(lambda: len(describe(ecs, cluster, "web")["deployments"]) == 1, message="old deployments to go")
    [task] = ecs.describe_tasks(cluster=cluster, tasks=ecs.list_tasks(cluster=cluster, serviceName="web")[
        "taskArns"])["tasks"]
    assert task["startedBy"] == forced["deployments"][0]["id"]
    changes = [e["detail"]["eventName"] for e in service_events(server, svc["serviceArn"],
                                                                "ECS Deployment State Change")]
    assert changes == ["SERVICE_DEPLOYMENT_IN_PROGRESS"] * 3


def test_delete_service_drains_it_to_inactive_and_frees_the_name(ecs, env):
    cluster, td = env
    svc = ecs.create_service(cluster=cluster, serviceName="web", taskDefinition=td, desiredCount=2)["service"]
    wait_for(lambda: describe(ecs, cluster, "web")["pendingCount"] == 2, message="two waiting tasks")
    with pytest.raises(ClientError) as err:
        ecs.delete_service(cluster=cluster, service="web")
    assert error_code(err) == "InvalidParameterException" and "scaled above 0" in str(err.value)

    deleted = ecs.delete_service(cluster=cluster, service="web", force=True)["service"]
    assert deleted["status"] == "DRAINING" and deleted["desiredCount"] == 0
    wait_for(lambda: describe(ecs, cluster, "web")["status"] == "INACTIVE", message="the service to be INACTIVE")
    assert ecs.list_services(cluster=cluster)["serviceArns"] == []
    assert ecs.list_tasks(cluster=cluster, serviceName="web")["taskArns"] == []
    stopped = ecs.list_tasks(cluster=cluster, serviceName="web", desiredStatus="STOPPED")["taskArns"]
    assert len(stopped) == 2
    assert ecs.list_service_deployments(cluster=cluster, service="web")["serviceDeployments"][0]["status"] == "STOPPED"
    for call in (lambda: ecs.update_service(cluster=cluster, service="web", desiredCount=1),
                 lambda: ecs.delete_service(cluster=cluster, service="web", force=True)):
        with pytest.raises(ClientError) as err:
            call()
        assert error_code(err) == "ServiceNotActiveException"
    with pytest.raises(ClientError) as err:
        ecs.update_service(cluster=cluster, service="nope", desiredCount=1)
    assert error_code(err) == "ServiceNotFoundException"

    again = ecs.create_service(cluster=cluster, serviceName="web", taskDefinition=td, desiredCount=0)["service"]
    assert again["status"] == "ACTIVE" and again["deployments"][0]["id"] != svc["deployments"][0]["id"]
    assert len(ecs.list_service_deployments(cluster=cluster, service="web")["serviceDeployments"]) == 1
    [c] = ecs.describe_clusters(clusters=[cluster])["clusters"]
    assert c["activeServicesCount"] == 1


def test_service_tags_and_propagation(ecs, env):
    cluster, td = env
    svc = ecs.create_service(cluster=cluster, serviceName="web", taskDefinition=td, desiredCount=1,
                             propagateTags="SERVICE", tags=[{"key": "team", "value": "ml"}])["service"]
    ecs.tag_resource(resourceArn=svc["serviceArn"], tags=[{"key": "env", "value": "dev"}])
    assert ecs.list_tags_for_resource(resourceArn=svc["serviceArn"])["tags"] == [
        {"key": "team", "value": "ml"}, {"key": "env", "value": "dev"}]
    arns = wait_for(lambda: ecs.list_tasks(cluster=cluster, serviceName="web")["taskArns"], message="a task")
    [task] = ecs.describe_tasks(cluster=cluster, tasks=arns, include=["TAGS"])["tasks"]
    assert task["tags"] == [{"key": "team", "value": "ml"}], "tags as the service had them when the task started"


# --- bad input --------------------------------------------------------------------------------

BAD_CREATE = [
    ({"schedulingStrategy": "DAEMON"}, "schedulingStrategy", "InvalidParameterException"),
    ({"desiredCount": -1}, "desiredCount", "InvalidParameterException"),
    ({"desiredCount": None}, "desiredCount", "InvalidParameterException"),
    ({"taskDefinition": None}, "taskDefinition", "InvalidParameterException"),
    ({"taskDefinition": "no-such-family"}, "no-such-family", "ClientException"),
    ({"serviceName": "bad name!"}, "serviceName", "InvalidParameterException"),
    ({"launchType": "FARGATE"}, "launchType", "InvalidParameterException"),
    ({"capacityProviderStrategy": [{"capacityProvider": "nope", "weight": 1}]},
     "capacityProviderStrategy[0].capacityProvider", "InvalidParameterException"),
    ({"deploymentConfiguration": {"maximumPercent": 50}}, "deploymentConfiguration.maximumPercent",
     "InvalidParameterException"),
    ({"deploymentConfiguration": {"minimumHealthyPercent": 101}}, "deploymentConfiguration.minimumHealthyPercent",
     "InvalidParameterException"),
    ({"deploymentConfiguration": {"strategy": "BLUE_GREEN"}}, "deploymentConfiguration.strategy",
     "InvalidParameterException"),
    ({"deploymentController": {"type": "CODE_DEPLOY"}}, "deploymentController.type", "InvalidParameterException"),
    ({"placementConstraints": [{"type": "memberOf", "expression": "nosuchsubject == 3"}]},
     "placementConstraints[0].expression", "InvalidParameterException"),
    ({"placementStrategy": [{"type": "binpack", "field": "gpu"}]}, "placementStrategy[0].field",
     "InvalidParameterException"),
    ({"loadBalancers": [{"containerName": "app", "containerPort": 80}]}, "loadBalancers",
     "InvalidParameterException"),
    ({"tags": [{"key": "aws:x", "value": "y"}]}, "tags[0].key", "InvalidParameterException"),
    ({"healthCheckGracePeriodSeconds": -1}, "healthCheckGracePeriodSeconds", "InvalidParameterException"),
]


def _snapshot(server, ecs, cluster: str) -> tuple:
    described = ecs.describe_services(cluster=cluster, services=["bad"])
    return (len(server.events()), ecs.list_services(cluster=cluster)["serviceArns"], described["services"],
            ecs.list_tasks(cluster=cluster)["taskArns"])


@pytest.mark.parametrize("change, field, code", BAD_CREATE, ids=[c[1] for c in BAD_CREATE])
def test_bad_create_service_names_the_field_and_writes_nothing(server, env, change, field, code):
    ecs = server.client(validate=False)  # the server's own validation answers
    cluster, td = env
    request = {"cluster": cluster, "serviceName": "bad", "taskDefinition": td, "desiredCount": 1, **change}
    before = _snapshot(server, ecs, cluster)
    with pytest.raises(ClientError) as err:
        ecs.create_service(**{k: v for k, v in request.items() if v is not None})
    assert error_code(err) == code and field in str(err.value), str(err.value)
    assert _snapshot(server, ecs, cluster) == before


BAD_UPDATE = [
    ({"desiredCount": 5001}, "desiredCount"),
    ({"deploymentConfiguration": {"minimumHealthyPercent": -5}}, "deploymentConfiguration.minimumHealthyPercent"),
    ({"deploymentConfiguration": {"alarms": {"alarmNames": ["a"], "enable": True, "rollback": True}}},
     "deploymentConfiguration.alarms.enable"),
    ({"capacityProviderStrategy": [{"capacityProvider": "nope", "weight": 1}]},
     "capacityProviderStrategy[0].capacityProvider"),
    ({"placementStrategy": [{"type": "spread"}]}, "placementStrategy[0].field"),
]


@pytest.mark.parametrize("change, field", BAD_UPDATE, ids=[c[1] for c in BAD_UPDATE])
def test_bad_update_service_names_the_field_and_changes_nothing(server, env, change, field):
    ecs = server.client(validate=False)
    cluster, td = env
    ecs.create_service(cluster=cluster, serviceName="ok", taskDefinition=td, desiredCount=0)
    wait_for(lambda: describe(ecs, cluster, "ok")["deployments"][0]["rolloutState"] == "COMPLETED",
             message="the service to settle")
    events, before = len(server.events()), describe(ecs, cluster, "ok")
    with pytest.raises(ClientError) as err:
        ecs.update_service(cluster=cluster, service="ok", taskDefinition=td.rsplit(":", 1)[0] + ":1", **change)
    assert error_code(err) == "InvalidParameterException" and field in str(err.value), str(err.value)
    assert describe(ecs, cluster, "ok") == before and len(server.events()) == events
