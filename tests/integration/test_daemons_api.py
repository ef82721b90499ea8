"""The managed-daemon API through boto3 against a real server, on SQLite and PostgreSQL: daemon task
definitions, daemons, their revisions and deployments, the host counts of DescribeDaemon, events,
tags, idempotency, and bad input that names its field and leaves nothing behind.

No daemon reconciler runs yet, so nothing here starts daemon tasks: the tests write the daemon
tasks' rows into the server's database themselves (as the reconciler will) to check the counting,
and advance deployments through the functions the reconciler calls, on the same database.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from botocore.exceptions import ClientError
from sqlalchemy import create_engine, insert, inspect, update

from shoal.api.ecs import daemons as daemons_api
from shoal.api.operations import Context
from shoal.domain.arns import ArnFactory
from shoal.store import migrate
from shoal.store.db import Store
from shoal.store.tables import container_instances, metadata, tasks
from tests.support import database_url_for, wait_for

ARN = "arn:shoal:ecs:local:000000000000"
DEPLOYMENT_CHANGE = "ECS Daemon Deployment State Change"
MI_CONFIG = {
    "infrastructureRoleArn": "arn:aws:iam::000000000000:role/shoal-infra",
    "instanceLaunchTemplate": {"ec2InstanceProfileArn": "arn:aws:iam::000000000000:instance-profile/p",
                               "networkConfiguration": {"subnets": ["subnet-local"]}},
}
ASG_CONFIG = {"autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:x"}
AGENT = {"name": "agent", "image": "busybox", "memory": 64, "command": ["sleep", "3600"]}


def error_code(excinfo) -> str:
    return excinfo.value.response["Error"]["Code"]


def error_message(excinfo) -> str:
    return excinfo.value.response["Error"]["Message"]


@pytest.fixture(scope="module")
def raw(server):
    """A client that skips botocore's own validation, so that the server's is what answers."""
    return server.client("ecs", validate=False)


@pytest.fixture
def env(ecs, unique):
    """A cluster with a self-managed and a managed capacity provider, and a daemon task definition."""
    cluster = unique("dmn")
    ecs.create_cluster(clusterName=cluster)
    asg, managed = unique("asg"), unique("mi")
    ecs.create_capacity_provider(name=asg, autoScalingGroupProvider=ASG_CONFIG)
    ecs.create_capacity_provider(name=managed, cluster=cluster, managedInstancesProvider=MI_CONFIG)
    ecs.put_cluster_capacity_providers(cluster=cluster, capacityProviders=[asg, managed],
                                       defaultCapacityProviderStrategy=[])
    td = ecs.register_daemon_task_definition(family=unique("logs"), containerDefinitions=[AGENT])
    return {"cluster": cluster, "asg": asg, "managed": managed, "td": td["daemonTaskDefinitionArn"]}


def create(ecs, env, name: str = "logs", **kw) -> dict:
    args = {"daemonName": name, "clusterArn": env["cluster"], "daemonTaskDefinitionArn": env["td"],
            "capacityProviderArns": [env["asg"]], **kw}
    return ecs.create_daemon(**args)


def deployment(ecs, arn: str) -> dict:
    out = ecs.describe_daemon_deployments(daemonDeploymentArns=[arn])
    assert out["failures"] == []
    return out["daemonDeployments"][0]


def revision(ecs, arn: str) -> dict:
    return ecs.describe_daemon_revisions(daemonRevisionArns=[arn])["daemonRevisions"][0]


def deployment_events(server, daemon_arn: str) -> list[dict]:
    return [e for e in server.events() if e["detail-type"] == DEPLOYMENT_CHANGE and daemon_arn in e["resources"]]


def add_host(ecs, engine, cluster: str, provider: str) -> str:
    """An ACTIVE container instance of `provider`. RegisterContainerInstance has no capacity
    provider to give, so the provider is written into the row, as an agent's registration sets it."""
    arn = ecs.register_container_instance(cluster=cluster, totalResources=[
        {"name": "CPU", "type": "INTEGER", "integerValue": 2048},
        {"name": "MEMORY", "type": "INTEGER", "integerValue": 4096}])["containerInstance"]["containerInstanceArn"]
    with engine.begin() as conn:
        conn.execute(update(container_instances).where(container_instances.c.arn == arn)
                     .values(capacity_provider_name=provider))
    return arn


def add_daemon_task(engine, cluster: str, daemon_arn: str, host: str, last_status: str) -> str:
    """A daemon task's row as the daemon reconciler writes it: startedBy the daemon, group
    "daemon:<name>", daemon_name set."""
    name = daemon_arn.rsplit("/", 1)[-1]
    task_id = uuid.uuid4().hex
    arn = f"{ARN}:task/{cluster}/{task_id}"
    doc = {"taskArn": arn, "clusterArn": f"{ARN}:cluster/{cluster}", "lastStatus": last_status,
           "desiredStatus": "STOPPED" if last_status == "STOPPED" else "RUNNING", "containers": [],
           "group": f"daemon:{name}", "startedBy": daemon_arn, "containerInstanceArn": host, "version": 1,
           "createdAt": 0.0, "attributes": [], "tags": []}
    with engine.begin() as conn:
        conn.execute(insert(tasks).values(
            arn=arn, id=task_id, cluster_name=cluster, last_status=last_status, desired_status=doc["desiredStatus"],
            family="logs", started_by=daemon_arn, launch_type="EC2", container_instance_arn=host, created_at=0.0,
            version=1, doc=json.dumps(doc), daemon_name=name))
    return arn


def stop_task(engine, arn: str) -> None:
    with engine.begin() as conn:
        conn.execute(update(tasks).where(tasks.c.arn == arn).values(last_status="STOPPED", desired_status="STOPPED"))


@pytest.fixture(scope="module")
def reconciler(server):
    """What the daemon reconciler will have: a Store on the server's database and the functions
    of shoal.api.ecs.daemons, each call one unit of work."""
    store = Store(server.database_url)

    def call(fn, *args, **kwargs):
        return store.submit(lambda conn: fn(Context(conn, ArnFactory()), *args, **kwargs)).result(30)

    yield call
    store.close()


# --- daemon task definitions ---------------------------------------------------------------------


def test_daemon_task_definitions_have_families_revisions_and_a_deletion(ecs, unique):
    family = unique("fam")
    first = ecs.register_daemon_task_definition(
        family=family, cpu="0.5 vCPU", memory="512", pidMode="shared",
        volumes=[{"name": "logs", "host": {"sourcePath": "/var/log"}}],
        containerDefinitions=[{**AGENT, "mountPoints": [{"sourceVolume": "logs", "containerPath": "/logs"}]}],
        tags=[{"key": "team", "value": "obs"}])
    assert first == {"daemonTaskDefinitionArn": f"{ARN}:daemon-task-definition/{family}:1",
                     "ResponseMetadata": first["ResponseMetadata"]}
    second = ecs.register_daemon_task_definition(family=family, containerDefinitions=[AGENT])
    assert second["daemonTaskDefinitionArn"].endswith(f"{family}:2")

    td = ecs.describe_daemon_task_definition(daemonTaskDefinition=f"{family}:1")["daemonTaskDefinition"]
    assert (td["family"], td["revision"], td["status"], td["registeredBy"]) == (family, 1, "ACTIVE", "shoal")
    assert (td["cpu"], td["memory"], td["pidMode"]) == ("512", "512", "shared")  # "0.5 vCPU" is 512 units
    [container] = td["containerDefinitions"]
    assert container["essential"] is True and container["mountPoints"][0]["sourceVolume"] == "logs"
    assert "portMappings" not in container, "only DaemonContainerDefinition's members"
    assert isinstance(td["registeredAt"], datetime) and "tags" not in td
    latest = ecs.describe_daemon_task_definition(daemonTaskDefinition=family)["daemonTaskDefinition"]
    assert latest["revision"] == 2
    assert ecs.describe_daemon_task_definition(daemonTaskDefinition=first["daemonTaskDefinitionArn"])[
        "daemonTaskDefinition"]["revision"] == 1
    assert ecs.list_tags_for_resource(resourceArn=first["daemonTaskDefinitionArn"])["tags"] == \
        [{"key": "team", "value": "obs"}]

    listed = ecs.list_daemon_task_definitions(family=family)["daemonTaskDefinitions"]
    assert [(s["arn"].rsplit(":", 1)[-1], s["status"], s["registeredBy"]) for s in listed] == \
        [("1", "ACTIVE", "shoal"), ("2", "ACTIVE", "shoal")]
    assert [s["arn"] for s in ecs.list_daemon_task_definitions(familyPrefix=family, sort="DESC")[
        "daemonTaskDefinitions"]] == [second["daemonTaskDefinitionArn"], first["daemonTaskDefinitionArn"]]
    assert [s["arn"] for s in ecs.list_daemon_task_definitions(family=family, revision="LAST_REGISTERED")[
        "daemonTaskDefinitions"]] == [second["daemonTaskDefinitionArn"]]
    page = ecs.list_daemon_task_definitions(family=family, maxResults=1)
    rest = ecs.list_daemon_task_definitions(family=family, nextToken=page["nextToken"])
    assert [s["arn"] for s in page["daemonTaskDefinitions"] + rest["daemonTaskDefinitions"]] == \
        [s["arn"] for s in listed] and "nextToken" not in rest

    # No daemon runs revision 2: deleting it finishes at once, and it stays describable.
    deleted = ecs.delete_daemon_task_definition(daemonTaskDefinition=f"{family}:2")
    assert deleted["daemonTaskDefinitionArn"] == second["daemonTaskDefinitionArn"]
    gone = ecs.describe_daemon_task_definition(daemonTaskDefinition=f"{family}:2")["daemonTaskDefinition"]
    assert gone["status"] == "DELETED" and isinstance(gone["deleteRequestedAt"], datetime)
    assert ecs.describe_daemon_task_definition(daemonTaskDefinition=family)["daemonTaskDefinition"]["revision"] == 1
    assert [s["status"] for s in ecs.list_daemon_task_definitions(family=family, status="ALL")[
        "daemonTaskDefinitions"]] == ["ACTIVE", "DELETED"]
    assert ecs.list_daemon_task_definitions(family=family, status="DELETE_IN_PROGRESS")[
        "daemonTaskDefinitions"] == []
    with pytest.raises(ClientError) as err:
        ecs.delete_daemon_task_definition(daemonTaskDefinition=f"{family}:2")
    assert error_code(err) == "ClientException" and "only an ACTIVE one" in error_message(err)
    with pytest.raises(ClientError) as err:
        ecs.delete_daemon_task_definition(daemonTaskDefinition=family)
    assert error_code(err) == "InvalidParameterException" and "'daemonTaskDefinition'" in error_message(err)
    with pytest.raises(ClientError) as err:
        ecs.describe_daemon_task_definition(daemonTaskDefinition=f"{family}:9")
    assert error_code(err) == "ClientException" and "'daemonTaskDefinition'" in error_message(err)


BAD_DEFINITIONS = [
    ({"containerDefinitions": [{**AGENT, "essential": False}]}, "containerDefinitions"),
    ({"containerDefinitions": [AGENT, AGENT]}, "containerDefinitions[1].name"),
    ({"containerDefinitions": [{"name": "a", "image": "busybox"}]}, "memoryReservation"),
    ({"containerDefinitions": [{**AGENT, "mountPoints": [{"sourceVolume": "nope", "containerPath": "/x"}]}]},
     "containerDefinitions[0].mountPoints[0].sourceVolume"),
    ({"volumes": [{"name": "v", "host": {"sourcePath": "relative"}}]}, "volumes[0].host.sourcePath"),
    ({"volumes": [{"name": "v"}]}, "volumes[0].host.sourcePath"),
    ({"volumes": [{"name": "v", "host": {"sourcePath": "/a"}}, {"name": "v", "host": {"sourcePath": "/b"}}]},
     "volumes[1].name"),
    ({"cpu": "lots"}, "cpu"),
    ({"pidMode": "host"}, "pidMode"),
    ({"containerDefinitions": []}, "containerDefinitions"),
]


@pytest.mark.parametrize("change,field", BAD_DEFINITIONS, ids=[f for _, f in BAD_DEFINITIONS])
def test_a_bad_daemon_task_definition_names_its_field_and_registers_nothing(raw, unique, change, field):
    family = unique("bad")
    with pytest.raises(ClientError) as err:
        raw.register_daemon_task_definition(**{"family": family, "containerDefinitions": [AGENT], **change})
    assert error_code(err) == "InvalidParameterException" and field in error_message(err), error_message(err)
    assert raw.list_daemon_task_definitions(family=family, status="ALL")["daemonTaskDefinitions"] == []


# --- daemons -----------------------------------------------------------------------------------------


def test_create_daemon_records_a_daemon_its_revision_and_a_pending_deployment(server, ecs, env):
    cluster = env["cluster"]
    out = create(ecs, env, capacityProviderArns=[env["asg"], f"{ARN}:capacity-provider/{env['managed']}"],
                 tags=[{"key": "team", "value": "obs"}])
    daemon_arn = f"{ARN}:daemon/{cluster}/logs"
    assert (out["daemonArn"], out["status"]) == (daemon_arn, "ACTIVE") and isinstance(out["createdAt"], datetime)
    assert out["deploymentArn"].startswith(f"{ARN}:daemon-deployment/{cluster}/logs/")

    daemon = ecs.describe_daemon(daemonArn=daemon_arn)["daemon"]
    assert daemon["clusterArn"] == f"{ARN}:cluster/{cluster}" and daemon["status"] == "ACTIVE"
    assert daemon["deploymentArn"] == out["deploymentArn"] and daemon["createdAt"] == daemon["updatedAt"]
    [current] = daemon["currentRevisions"]
    assert current["arn"].startswith(f"{ARN}:daemon-revision/{cluster}/logs/")
    assert sorted(current["capacityProviders"], key=lambda p: p["arn"]) == sorted(
        [{"arn": f"{ARN}:capacity-provider/{p}", "runningCount": 0, "withoutDaemonCount": 0}
         for p in (env["asg"], env["managed"])], key=lambda p: p["arn"])
    assert (current["totalRunningCount"], current["totalWithoutDaemonCount"]) == (0, 0)

    rev = revision(ecs, current["arn"])
    assert rev["daemonArn"] == daemon_arn and rev["daemonTaskDefinitionArn"] == env["td"]
    assert (rev["critical"], rev["propagateTags"], rev["enableECSManagedTags"], rev["enableExecuteCommand"]) == \
        (True, "NONE", False, False), "critical by default"
    assert rev["containerImages"] == [{"containerName": "agent", "image": "busybox"}]

    dep = deployment(ecs, out["deploymentArn"])
    assert (dep["status"], dep["clusterArn"], dep["sourceDaemonRevisions"]) == ("PENDING", daemon["clusterArn"], [])
    assert dep["deploymentConfiguration"] == {"drainPercent": 25.0, "bakeTimeInMinutes": 0,
                                              "alarms": {"alarmNames": [], "enable": False}}
    assert dep["circuitBreaker"] == {"failureCount": 0, "status": "MONITORING", "threshold": 3}
    assert dep["alarms"] == {"status": "DISABLED", "alarmNames": [], "triggeredAlarmNames": []}
    target = dep["targetDaemonRevision"]
    assert target["arn"] == current["arn"] and target["totalRunningInstanceCount"] == 0
    assert [p["arn"] for p in target["capacityProviders"]] == \
        [f"{ARN}:capacity-provider/{env['asg']}", f"{ARN}:capacity-provider/{env['managed']}"]
    [brief] = ecs.list_daemon_deployments(daemonArn=daemon_arn)["daemonDeployments"]
    assert (brief["daemonDeploymentArn"], brief["daemonArn"], brief["status"], brief["targetDaemonRevisionArn"]) == \
        (out["deploymentArn"], daemon_arn, "PENDING", current["arn"])

    [event] = deployment_events(server, daemon_arn)
    assert event["source"] == "shoal.ecs" and event["resources"] == [daemon_arn]
    assert set(event["detail"]) == {"eventType", "eventName", "clusterArn", "daemonArn", "daemonDeploymentArn",
                                    "targetDaemonRevisionArn", "updatedAt"}
    assert (event["detail"]["eventType"], event["detail"]["eventName"]) == ("INFO", "DAEMON_DEPLOYMENT_PENDING")
    assert event["detail"]["daemonDeploymentArn"] == out["deploymentArn"]
    assert event["detail"]["targetDaemonRevisionArn"] == current["arn"]

    # Listing, by cluster and capacity provider; tags, on the daemon's ARN.
    summaries = ecs.list_daemons(clusterArn=cluster)["daemonSummariesList"]
    assert [(s["daemonArn"], s["status"]) for s in summaries] == [(daemon_arn, "ACTIVE")]
    assert len(ecs.list_daemons(clusterArn=cluster, capacityProviderArns=[env["managed"]])["daemonSummariesList"]) == 1
    other = create(ecs, env, name="metrics", capacityProviderArns=[env["managed"]])["daemonArn"]
    assert [s["daemonArn"] for s in ecs.list_daemons(clusterArn=f"{ARN}:cluster/{cluster}",
                                                     capacityProviderArns=[env["asg"]])["daemonSummariesList"]] == \
        [daemon_arn]
    page = ecs.list_daemons(clusterArn=cluster, maxResults=1)
    rest = ecs.list_daemons(clusterArn=cluster, nextToken=page["nextToken"])
    assert [s["daemonArn"] for s in page["daemonSummariesList"] + rest["daemonSummariesList"]] == [daemon_arn, other]
    assert ecs.list_tags_for_resource(resourceArn=daemon_arn)["tags"] == [{"key": "team", "value": "obs"}]
    ecs.tag_resource(resourceArn=daemon_arn, tags=[{"key": "tier", "value": "1"}])
    assert len(ecs.list_tags_for_resource(resourceArn=daemon_arn)["tags"]) == 2
    assert "tags" not in ecs.describe_daemon(daemonArn=daemon_arn)["daemon"]


def test_update_daemon_resets_what_it_leaves_out_and_supersedes_the_deployment(server, ecs, env, unique):
    created = create(ecs, env, critical=False, enableExecuteCommand=True, propagateTags="DAEMON",
                     deploymentConfiguration={"drainPercent": 50, "bakeTimeInMinutes": 5,
                                              "alarms": {"alarmNames": ["errors"], "enable": True}})
    arn = created["daemonArn"]
    first = ecs.describe_daemon(daemonArn=arn)["daemon"]["currentRevisions"][0]["arn"]
    assert revision(ecs, first)["critical"] is False and revision(ecs, first)["enableExecuteCommand"] is True
    dep1 = deployment(ecs, created["deploymentArn"])
    assert dep1["deploymentConfiguration"] == {"drainPercent": 50.0, "bakeTimeInMinutes": 5,
                                               "alarms": {"alarmNames": ["errors"], "enable": True}}
    assert dep1["alarms"]["status"] == "MONITORING"

    v2 = ecs.register_daemon_task_definition(family=env["td"].rsplit("/", 1)[1].split(":")[0],
                                             containerDefinitions=[{**AGENT, "image": "busybox:2"}])
    updated = ecs.update_daemon(daemonArn=arn, daemonTaskDefinitionArn=v2["daemonTaskDefinitionArn"],
                                capacityProviderArns=[env["managed"]])
    assert updated["status"] == "ACTIVE" and updated["updatedAt"] > updated["createdAt"]
    assert updated["deploymentArn"] != created["deploymentArn"]
    daemon = ecs.describe_daemon(daemonArn=arn)["daemon"]
    second = daemon["currentRevisions"][0]["arn"]
    assert second != first and daemon["deploymentArn"] == updated["deploymentArn"]
    assert [p["arn"] for p in daemon["currentRevisions"][0]["capacityProviders"]] == \
        [f"{ARN}:capacity-provider/{env['managed']}"]
    rev = revision(ecs, second)
    assert (rev["critical"], rev["enableExecuteCommand"], rev["propagateTags"]) == (True, False, "NONE"), \
        "UpdateDaemon carries nothing over: omitted fields take their defaults"
    assert rev["containerImages"] == [{"containerName": "agent", "image": "busybox:2"}]
    assert revision(ecs, first)["critical"] is False, "a revision never changes"

    dep2 = deployment(ecs, updated["deploymentArn"])
    assert dep2["deploymentConfiguration"]["drainPercent"] == 25.0 and dep2["alarms"]["status"] == "DISABLED"
    assert [s["arn"] for s in dep2["sourceDaemonRevisions"]] == [first]
    assert [p["arn"] for p in dep2["sourceDaemonRevisions"][0]["capacityProviders"]] == \
        [f"{ARN}:capacity-provider/{env['asg']}"]
    dep1 = deployment(ecs, created["deploymentArn"])
    assert dep1["status"] == "STOPPED" and dep1["statusReason"] == \
        f"Superseded by daemon deployment {updated['deploymentArn']}."
    assert isinstance(dep1["stoppedAt"], datetime) and dep1["alarms"]["status"] == "MONITORING_COMPLETE"

    briefs = ecs.list_daemon_deployments(daemonArn=arn)["daemonDeployments"]
    assert [(b["daemonDeploymentArn"], b["status"]) for b in briefs] == \
        [(updated["deploymentArn"], "PENDING"), (created["deploymentArn"], "STOPPED")], "newest first"
    assert [b["daemonDeploymentArn"] for b in ecs.list_daemon_deployments(daemonArn=arn, status=["STOPPED"])[
        "daemonDeployments"]] == [created["deploymentArn"]]
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    assert ecs.list_daemon_deployments(daemonArn=arn, createdAt={"after": later})["daemonDeployments"] == []
    page = ecs.list_daemon_deployments(daemonArn=arn, maxResults=1)
    assert ecs.list_daemon_deployments(daemonArn=arn, nextToken=page["nextToken"])["daemonDeployments"][0][
        "daemonDeploymentArn"] == created["deploymentArn"]
    assert [(e["detail"]["eventName"], e["detail"]["daemonDeploymentArn"]) for e in deployment_events(server, arn)] == [
        ("DAEMON_DEPLOYMENT_PENDING", created["deploymentArn"]),
        ("DAEMON_DEPLOYMENT_STOPPED", created["deploymentArn"]),
        ("DAEMON_DEPLOYMENT_PENDING", updated["deploymentArn"])]


def test_delete_daemon_starts_a_deployment_without_target_and_keeps_its_definition_in_use(server, ecs, env):
    created = create(ecs, env)
    arn = created["daemonArn"]
    rev = ecs.describe_daemon(daemonArn=arn)["daemon"]["currentRevisions"][0]["arn"]
    # A definition a daemon runs can be deleted; it stays DELETE_IN_PROGRESS while the daemon runs it.
    ecs.delete_daemon_task_definition(daemonTaskDefinition=env["td"])
    assert ecs.describe_daemon_task_definition(daemonTaskDefinition=env["td"])["daemonTaskDefinition"][
        "status"] == "DELETE_IN_PROGRESS"
    with pytest.raises(ClientError) as err:
        create(ecs, env, name="again")
    assert error_code(err) == "ClientException" and "'daemonTaskDefinitionArn'" in error_message(err)

    deleted = ecs.delete_daemon(daemonArn=arn)
    assert deleted["status"] == "DELETE_IN_PROGRESS" and deleted["deploymentArn"] != created["deploymentArn"]
    assert deployment(ecs, created["deploymentArn"])["status"] == "STOPPED"
    # No host runs it: the daemon scheduler finishes the deletion at once and forgets the daemon.
    wait_for(lambda: not ecs.list_daemons(clusterArn=env["cluster"])["daemonSummariesList"], timeout=15,
             message="the deleted daemon to be forgotten")
    with pytest.raises(ClientError) as err:
        ecs.describe_daemon(daemonArn=arn)
    assert error_code(err) == "DaemonNotFoundException"
    dep = deployment(ecs, deleted["deploymentArn"])
    assert dep["status"] == "SUCCESSFUL" and "targetDaemonRevision" not in dep
    assert [s["arn"] for s in dep["sourceDaemonRevisions"]] == [rev]
    removal = [e["detail"] for e in deployment_events(server, arn)
               if e["detail"]["daemonDeploymentArn"] == deleted["deploymentArn"]]
    assert [d["eventName"] for d in removal] == ["DAEMON_DEPLOYMENT_PENDING", "DAEMON_DEPLOYMENT_IN_PROGRESS",
                                                 "DAEMON_DEPLOYMENT_SUCCESSFUL"]
    assert all("targetDaemonRevisionArn" not in d for d in removal)
    with pytest.raises(ClientError) as err:
        ecs.tag_resource(resourceArn=arn, tags=[{"key": "k", "value": "v"}])
    assert error_code(err) == "ResourceNotFoundException"
    assert ecs.describe_daemon_task_definition(daemonTaskDefinition=env["td"])["daemonTaskDefinition"][
        "status"] == "DELETED", "no daemon runs it any more"


def test_update_daemon_off_a_deleted_definition_finishes_its_deletion(ecs, env):
    arn = create(ecs, env)["daemonArn"]
    ecs.delete_daemon_task_definition(daemonTaskDefinition=env["td"])
    v2 = ecs.register_daemon_task_definition(family=env["td"].rsplit("/", 1)[1].split(":")[0],
                                             containerDefinitions=[AGENT])["daemonTaskDefinitionArn"]
    ecs.update_daemon(daemonArn=arn, daemonTaskDefinitionArn=v2, capacityProviderArns=[env["asg"]])
    assert ecs.describe_daemon_task_definition(daemonTaskDefinition=env["td"])["daemonTaskDefinition"][
        "status"] == "DELETED"


def test_describe_daemon_counts_hosts_with_and_without_the_daemon(ecs, env, engine):
    cluster = env["cluster"]
    arn = create(ecs, env, capacityProviderArns=[env["asg"], env["managed"]])["daemonArn"]
    other = create(ecs, env, name="other")["daemonArn"]
    a, b, c = (add_host(ecs, engine, cluster, env["asg"]) for _ in range(3))
    add_host(ecs, engine, cluster, None)  # no capacity provider: no daemon's business
    add_daemon_task(engine, cluster, arn, a, "RUNNING")
    add_daemon_task(engine, cluster, arn, a, "RUNNING")  # two on one host still count the host once
    add_daemon_task(engine, cluster, arn, b, "PENDING")  # not running yet
    add_daemon_task(engine, cluster, arn, c, "STOPPED")
    add_daemon_task(engine, cluster, other, c, "RUNNING")  # another daemon's task

    def counts() -> dict:
        [current] = ecs.describe_daemon(daemonArn=arn)["daemon"]["currentRevisions"]
        by = {p["arn"].rsplit("/", 1)[1]: (p["runningCount"], p["withoutDaemonCount"])
              for p in current["capacityProviders"]}
        assert (current["totalRunningCount"], current["totalWithoutDaemonCount"]) == \
            tuple(map(sum, zip(*by.values())))
        return by

    assert counts() == {env["asg"]: (1, 2), env["managed"]: (0, 0)}
    # A DRAINING host with the daemon still runs it; one without it is not missing it.
    ecs.update_container_instances_state(cluster=cluster, containerInstances=[a, b], status="DRAINING")
    assert counts() == {env["asg"]: (1, 1), env["managed"]: (0, 0)}
    # The deployment's counts are disjoint: ACTIVE with, ACTIVE without, DRAINING.
    [target] = [deployment(ecs, ecs.describe_daemon(daemonArn=arn)["daemon"]["deploymentArn"])[
        "targetDaemonRevision"]["capacityProviders"][0]]
    assert (target["runningInstanceCount"], target["withoutDaemonInstanceCount"], target["drainingInstanceCount"]) \
        == (0, 1, 2)
    ecs.update_container_instances_state(cluster=cluster, containerInstances=[a, b], status="ACTIVE")
    ecs.deregister_container_instance(cluster=cluster, containerInstance=c, force=True)
    assert counts() == {env["asg"]: (1, 1), env["managed"]: (0, 0)}, "a deregistered host is no host"


def test_a_reconciler_advances_deployments_and_forgets_a_deleted_daemon(server, ecs, env, engine, reconciler):
    cluster = env["cluster"]
    created = create(ecs, env)
    arn, dep_arn = created["daemonArn"], created["deploymentArn"]
    host = add_host(ecs, engine, cluster, env["asg"])
    task = add_daemon_task(engine, cluster, arn, host, "RUNNING")

    started = reconciler(daemons_api.set_deployment_status, dep_arn, "IN_PROGRESS")
    assert started["status"] == "IN_PROGRESS"
    assert reconciler(daemons_api.set_deployment_status, dep_arn, "IN_PROGRESS") is None, "no second event"
    breaker = {**started["circuitBreaker"], "failureCount": 1}
    assert reconciler(daemons_api.update_deployment, dep_arn, circuitBreaker=breaker)["circuitBreaker"] == breaker
    assert deployment(ecs, dep_arn)["circuitBreaker"] == breaker
    done = reconciler(daemons_api.set_deployment_status, dep_arn, "SUCCESSFUL", "Every host runs the daemon.")
    assert done["status"] == "SUCCESSFUL"
    assert reconciler(daemons_api.set_deployment_status, dep_arn, "IN_PROGRESS") is None, "an ended one stays ended"
    assert reconciler(daemons_api.update_deployment, dep_arn, circuitBreaker=breaker) is None
    dep = deployment(ecs, dep_arn)
    assert (dep["status"], dep["statusReason"]) == ("SUCCESSFUL", "Every host runs the daemon.")
    assert dep["startedAt"] <= dep["finishedAt"] and "stoppedAt" not in dep
    assert dep["circuitBreaker"] == {**breaker, "status": "MONITORING_COMPLETE"}
    assert dep["targetDaemonRevision"]["totalRunningInstanceCount"] == 1, "the counts it ended with"
    assert [e["detail"]["eventName"] for e in deployment_events(server, arn)] == [
        "DAEMON_DEPLOYMENT_PENDING", "DAEMON_DEPLOYMENT_IN_PROGRESS", "DAEMON_DEPLOYMENT_SUCCESSFUL"]

    ecs.delete_daemon_task_definition(daemonTaskDefinition=env["td"])
    removal = ecs.delete_daemon(daemonArn=arn)["deploymentArn"]
    assert reconciler(daemons_api.remove, arn) is False, "a task of it still runs"
    assert ecs.describe_daemon(daemonArn=arn)["daemon"]["status"] == "DELETE_IN_PROGRESS"
    for call in (lambda: ecs.delete_daemon(daemonArn=arn),
                 lambda: ecs.update_daemon(daemonArn=arn, daemonTaskDefinitionArn=env["td"],
                                           capacityProviderArns=[env["asg"]])):
        with pytest.raises(ClientError) as err:
            call()
        assert error_code(err) == "DaemonNotActiveException"
    assert ecs.describe_daemon_task_definition(daemonTaskDefinition=env["td"])["daemonTaskDefinition"][
        "status"] == "DELETE_IN_PROGRESS", "the daemon still runs it until its tasks are gone"
    stop_task(engine, task)  # its last task is gone: the daemon scheduler finishes the deletion
    wait_for(lambda: not ecs.list_daemons(clusterArn=cluster)["daemonSummariesList"], timeout=15,
             message="the deleted daemon to be forgotten")
    with pytest.raises(ClientError) as err:
        ecs.describe_daemon(daemonArn=arn)
    assert error_code(err) == "DaemonNotFoundException"
    assert ecs.describe_daemon_task_definition(daemonTaskDefinition=env["td"])["daemonTaskDefinition"][
        "status"] == "DELETED", "no daemon runs it any more"
    assert deployment(ecs, removal)["status"] == "SUCCESSFUL", "its deployments stay describable"
    # The name is free again, and the new daemon's deployments are its own.
    v2 = ecs.register_daemon_task_definition(family=env["td"].rsplit("/", 1)[1].split(":")[0],
                                             containerDefinitions=[AGENT])["daemonTaskDefinitionArn"]
    again = create(ecs, env, daemonTaskDefinitionArn=v2)
    assert again["daemonArn"] == arn
    assert [b["daemonDeploymentArn"] for b in ecs.list_daemon_deployments(daemonArn=arn)["daemonDeployments"]] == \
        [again["deploymentArn"]]


def test_client_token_makes_create_daemon_idempotent(server, ecs, env):
    first = create(ecs, env, clientToken="token-1")
    again = create(ecs, env, clientToken="token-1")
    assert {k: again[k] for k in ("daemonArn", "deploymentArn", "createdAt")} == \
        {k: first[k] for k in ("daemonArn", "deploymentArn", "createdAt")}
    assert len(ecs.list_daemon_deployments(daemonArn=first["daemonArn"])["daemonDeployments"]) == 1
    assert len(deployment_events(server, first["daemonArn"])) == 1
    with pytest.raises(ClientError) as err:
        create(ecs, env, clientToken="token-1", critical=False)
    assert error_code(err) == "ConflictException"
    with pytest.raises(ClientError) as err:
        create(ecs, env)
    assert error_code(err) == "InvalidParameterException" and "already exists" in error_message(err)


def test_unknown_daemons_revisions_and_deployments(ecs, env):
    arn = create(ecs, env)["daemonArn"]
    for call in (lambda: ecs.describe_daemon(daemonArn=arn + "x"),
                 lambda: ecs.list_daemon_deployments(daemonArn=arn + "x"),
                 lambda: ecs.delete_daemon(daemonArn="no-such-daemon")):
        with pytest.raises(ClientError) as err:
            call()
        assert error_code(err) == "DaemonNotFoundException"
    for call, field in ((lambda: ecs.describe_daemon(daemonArn=f"{ARN}:service/{env['cluster']}/logs"), "daemonArn"),
                        (lambda: ecs.describe_daemon_revisions(daemonRevisionArns=[arn]), "daemonRevisionArns[0]"),
                        (lambda: ecs.describe_daemon_deployments(daemonDeploymentArns=["x"]),
                         "daemonDeploymentArns[0]"),
                        (lambda: ecs.describe_daemon_revisions(daemonRevisionArns=[arn] * 21), "daemonRevisionArns")):
        with pytest.raises(ClientError) as err:
            call()
        assert error_code(err) == "InvalidParameterException" and field in error_message(err)
    missing = f"{ARN}:daemon-revision/{env['cluster']}/logs/0"
    out = ecs.describe_daemon_revisions(daemonRevisionArns=[missing])
    assert out["daemonRevisions"] == [] and out["failures"] == [{"arn": missing, "reason": "MISSING"}]


BAD_DAEMONS = [
    (lambda e: {"capacityProviderArns": ["nope"]}, "InvalidParameterException", "capacityProviderArns[0]"),
    (lambda e: {"capacityProviderArns": [e["asg"], e["foreign"]]}, "InvalidParameterException",
     "capacityProviderArns[1]"),
    (lambda e: {"capacityProviderArns": [e["asg"], e["asg"]]}, "InvalidParameterException", "capacityProviderArns[1]"),
    (lambda e: {"capacityProviderArns": []}, "InvalidParameterException", "capacityProviderArns"),
    (lambda e: {"capacityProviderArns": [f"{ARN}:cluster/x"]}, "InvalidParameterException", "capacityProviderArns[0]"),
    (lambda e: {"daemonTaskDefinitionArn": "nope:1"}, "ClientException", "daemonTaskDefinitionArn"),
    (lambda e: {"daemonName": "bad name"}, "InvalidParameterException", "daemonName"),
    (lambda e: {"daemonName": "d" * 249}, "InvalidParameterException", "daemonName"),
    (lambda e: {"deploymentConfiguration": {"drainPercent": 101.0}}, "InvalidParameterException",
     "deploymentConfiguration.drainPercent"),
    (lambda e: {"deploymentConfiguration": {"bakeTimeInMinutes": 1441}}, "InvalidParameterException",
     "deploymentConfiguration.bakeTimeInMinutes"),
    (lambda e: {"deploymentConfiguration": {"alarms": {"enable": True}}}, "InvalidParameterException",
     "deploymentConfiguration.alarms.alarmNames"),
    (lambda e: {"propagateTags": "TASK_DEFINITION"}, "InvalidParameterException", "propagateTags"),
    (lambda e: {"critical": "yes"}, "InvalidParameterException", "critical"),
    (lambda e: {"tags": [{"key": "aws:x", "value": "1"}]}, "InvalidParameterException", "tags[0].key"),
    (lambda e: {"clientToken": "t" * 37}, "InvalidParameterException", "clientToken"),
    (lambda e: {"clusterArn": "no-such-cluster"}, "ClusterNotFoundException", "no-such-cluster"),
]


@pytest.fixture
def foreign(ecs, unique) -> str:
    """A capacity provider that exists, attached to another cluster."""
    cluster, provider = unique("other"), unique("asg")
    ecs.create_cluster(clusterName=cluster)
    ecs.create_capacity_provider(name=provider, autoScalingGroupProvider=ASG_CONFIG)
    ecs.put_cluster_capacity_providers(cluster=cluster, capacityProviders=[provider],
                                       defaultCapacityProviderStrategy=[])
    return provider


@pytest.mark.parametrize("change,code,field", BAD_DAEMONS, ids=[f"{c}:{f}" for _, c, f in BAD_DAEMONS])
def test_bad_create_daemon_names_the_field_and_writes_nothing(server, ecs, raw, env, foreign, change, code, field):
    before = len(server.events())
    with pytest.raises(ClientError) as err:
        create(raw, env, **change({**env, "foreign": foreign}))
    assert error_code(err) == code and field in error_message(err), error_message(err)
    assert ecs.list_daemons(clusterArn=env["cluster"])["daemonSummariesList"] == []
    assert not [e for e in server.events()[before:] if e["detail-type"] == DEPLOYMENT_CHANGE
                and e["detail"]["clusterArn"] == f"{ARN}:cluster/{env['cluster']}"]


def test_bad_update_daemon_names_the_field_and_changes_nothing(server, ecs, raw, env):
    created = create(ecs, env, critical=False)
    arn = created["daemonArn"]
    before = ecs.describe_daemon(daemonArn=arn)["daemon"]
    events_before = len(server.events())
    for changed, code, field in (({"capacityProviderArns": ["nope"]}, "InvalidParameterException",
                                  "capacityProviderArns[0]"),
                                 ({"daemonTaskDefinitionArn": "nope:1"}, "ClientException", "daemonTaskDefinitionArn"),
                                 ({"deploymentConfiguration": {"drainPercent": -1.0}}, "InvalidParameterException",
                                  "deploymentConfiguration.drainPercent")):
        with pytest.raises(ClientError) as err:
            raw.update_daemon(**{"daemonArn": arn, "daemonTaskDefinitionArn": env["td"],
                                 "capacityProviderArns": [env["asg"]], **changed})
        assert error_code(err) == code and field in error_message(err), error_message(err)
    assert ecs.describe_daemon(daemonArn=arn)["daemon"] == before
    assert deployment(ecs, created["deploymentArn"])["status"] == "PENDING", "not superseded"
    assert len(ecs.list_daemon_deployments(daemonArn=arn)["daemonDeployments"]) == 1
    assert [e for e in server.events()[events_before:] if arn in e["resources"]] == []


# --- the schema ------------------------------------------------------------------------------------


def test_the_daemon_migration_creates_what_tables_declares_and_downgrades(backend, tmp_path):
    url = database_url_for(backend) or f"sqlite:///{tmp_path / 'schema.db'}"
    engine = create_engine(url)
    try:
        migrate.upgrade(engine)
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata)
        mine = [d for d in diffs if "daemon" in repr(d)]
        assert mine == []
        cfg = Config()
        cfg.set_main_option("script_location", str(migrate._MIGRATIONS))
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0004")
        schema = inspect(engine)
        assert not [t for t in schema.get_table_names() if t.startswith("daemon")]
        assert "daemon_name" not in {c["name"] for c in schema.get_columns("tasks")}
        migrate.upgrade(engine)
    finally:
        engine.dispose()
