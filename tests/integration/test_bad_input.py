"""Bad input: every invalid request gets the AWS error class, a message naming the field, and
changes nothing in the store.

Each case runs a real boto3 client (client-side validation off, so the server's own validation
is what answers) or a raw HTTP request against a real server, and compares a snapshot of the
observable state taken before and after: the event log, clusters, task definition families and
revisions, the test cluster's tasks (RUNNING and STOPPED), capacity providers, the test
cluster itself (tags included), its container instances and their attributes.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Callable
from unittest import mock

import boto3
import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

TARGET_PREFIX = "AmazonEC2ContainerServiceV20141113"
CONTENT_TYPE = "application/x-amz-json-1.1"
MI_CONFIG = {
    "infrastructureRoleArn": "arn:aws:iam::000000000000:role/shoal-infra",
    "instanceLaunchTemplate": {"ec2InstanceProfileArn": "arn:aws:iam::000000000000:instance-profile/p",
                               "networkConfiguration": {"subnets": ["subnet-local"]}},
}
ASG_CONFIG = {"autoScalingGroupArn": "arn:aws:autoscaling:local:000000000000:autoScalingGroup:x"}
MPS = {"nvidiaMps": {"memory": 1024}}


# --- setup and snapshots -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(server):
    """The resources the cases refer to, created once per server before any snapshot."""
    ecs = server.client("ecs")
    cluster = ecs.create_cluster(clusterName="bad-input", tags=[{"key": "team", "value": "qa"}])["cluster"]
    td = ecs.register_task_definition(family="bad-input-app", containerDefinitions=[
        {"name": "app", "image": "busybox", "memory": 128}])["taskDefinition"]
    host = ecs.register_container_instance(
        cluster="bad-input", totalResources=[{"name": "CPU", "type": "INTEGER", "integerValue": 4096},
                                             {"name": "MEMORY", "type": "INTEGER", "integerValue": 8192}],
    )["containerInstance"]
    full = ecs.register_container_instance(
        cluster="bad-input", attributes=[{"name": f"custom-{i}", "value": "x"} for i in range(10)],
    )["containerInstance"]
    # One task in each desired status, so that the ListTasks snapshots are not trivially empty.
    running = ecs.run_task(cluster="bad-input", taskDefinition=td["taskDefinitionArn"], launchType="EC2")
    stopped = ecs.run_task(cluster="bad-input", taskDefinition=td["taskDefinitionArn"], launchType="EC2")
    ecs.stop_task(cluster="bad-input", task=stopped["tasks"][0]["taskArn"])
    assert running["failures"] == []
    setup = SimpleNamespace(
        ecs=ecs, raw=server.client("ecs", validate=False), http=httpx.Client(timeout=10),
        cluster="bad-input", cluster_arn=cluster["clusterArn"], family=td["family"],
        td_arn=td["taskDefinitionArn"], instance_arn=host["containerInstanceArn"],
        full_instance_arn=full["containerInstanceArn"],
    )
    assert len(all_events(server, setup.http)) == len(server.events()) > 0
    yield setup
    setup.http.close()


def all_events(server, http: httpx.Client) -> list[dict]:
    """The whole event log, as `server.events()` reads it, over one kept-alive connection (faster)."""
    creds = server.credentials
    found, cursor = [], None
    while True:
        params = {"limit": 1000, **({"after": cursor} if cursor else {})}
        url = str(httpx.URL(server.endpoint + "/v1/events", params=params))
        request = AWSRequest(method="GET", url=url)
        SigV4Auth(Credentials(creds["accessKeyId"], creds["secretAccessKey"]), "ecs", "local").add_auth(request)
        response = http.get(url, headers=dict(request.headers.items()))
        assert response.status_code == 200, response.text
        page = response.json()
        found += page["events"]
        if not page["events"]:
            return found
        cursor = page["cursor"]


def _pages(call: Callable[..., dict], key: str, **kwargs) -> list:
    items, token = [], None
    while True:
        page = call(**kwargs, **({"nextToken": token} if token else {}))
        items += page[key]
        token = page.get("nextToken")
        if not token:
            return items


def snapshot(server, env) -> dict:
    """Everything a bad request could have changed, as seen through the API and the event log
    (the whole log, not only its length)."""
    ecs = env.ecs
    instances = ecs.describe_container_instances(
        cluster=env.cluster, containerInstances=[env.instance_arn, env.full_instance_arn], include=["TAGS"])
    return {
        "events": all_events(server, env.http),
        "clusters": _pages(ecs.list_clusters, "clusterArns"),
        "families": _pages(ecs.list_task_definition_families, "families", status="ALL"),
        "task_definitions": [_pages(ecs.list_task_definitions, "taskDefinitionArns", status=s)
                             for s in ("ACTIVE", "INACTIVE")],
        "tasks_running": _pages(ecs.list_tasks, "taskArns", cluster=env.cluster, desiredStatus="RUNNING"),
        "tasks_stopped": _pages(ecs.list_tasks, "taskArns", cluster=env.cluster, desiredStatus="STOPPED"),
        "capacity_providers": _pages(ecs.describe_capacity_providers, "capacityProviders", include=["TAGS"]),
        "cluster": ecs.describe_clusters(clusters=[env.cluster], include=["TAGS"])["clusters"],
        "instances": sorted((i["containerInstanceArn"], i["status"], i["version"],
                             json.dumps(i["attributes"], sort_keys=True), json.dumps(i.get("tags")))
                            for i in instances["containerInstances"]),
        "attributes": _pages(ecs.list_attributes, "attributes", cluster=env.cluster,
                             targetType="container-instance"),
    }


# --- the cases -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    operation: str  # boto3 method name
    params: Callable[[SimpleNamespace], dict]
    code: str
    fragments: tuple[str, ...]  # all must appear in the message
    marks: tuple = ()


def td(*containers: dict, **extra) -> Callable[[SimpleNamespace], dict]:
    """RegisterTaskDefinition params on the existing family: a wrongful write would add a revision."""
    return lambda e: {"family": e.family, "containerDefinitions": list(containers), **extra}


def c(name: str = "app", **fields) -> dict:
    return {"name": name, "image": "busybox", "memory": 128, **fields}


def gpu(**req) -> dict:
    return {"type": "GPU", **req}


RR0 = "containerDefinitions[0].resourceRequirements[0]"

CASES = [
    # missing required members
    Case("missing-taskDefinition", "run_task", lambda e: {"cluster": e.cluster},
         "InvalidParameterException", ("Missing required parameter", "'taskDefinition'")),
    Case("missing-containerDefinitions", "register_task_definition", lambda e: {"family": e.family},
         "InvalidParameterException", ("Missing required parameter", "'containerDefinitions'")),
    Case("missing-dependsOn-condition", "register_task_definition",
         td(c("a"), c("b", dependsOn=[{"containerName": "a"}])),
         "InvalidParameterException", ("containerDefinitions[1].dependsOn[0].condition",)),
    # wrong types
    Case("count-as-string", "run_task",
         lambda e: {"cluster": e.cluster, "taskDefinition": e.td_arn, "count": "3"},
         "InvalidParameterException", ("'count'", "expected an integer, got string")),
    Case("essential-as-string", "register_task_definition", td(c(essential="yes")),
         "InvalidParameterException", ("'containerDefinitions[0].essential'", "expected a boolean")),
    Case("clusterName-as-number", "create_cluster", lambda e: {"clusterName": 12345},
         "InvalidParameterException", ("'clusterName'", "expected a string")),
    # enums and ranges
    Case("launchType-SPACESHIP", "run_task",
         lambda e: {"cluster": e.cluster, "taskDefinition": e.td_arn, "launchType": "SPACESHIP"},
         "InvalidParameterException", ("'launchType'", "SPACESHIP")),
    Case("count-11", "run_task", lambda e: {"cluster": e.cluster, "taskDefinition": e.td_arn, "count": 11},
         "InvalidParameterException", ("'count'", "between 1 and 10")),
    Case("maxComputePercent-101", "register_task_definition",
         td(c(resourceRequirements=[gpu(sharingStrategy={"nvidiaMps": {"memory": 1024, "maxComputePercent": 101}})])),
         "InvalidParameterException", (f"{RR0}.sharingStrategy.nvidiaMps.maxComputePercent",)),
    Case("maxComputePercent-0", "register_task_definition",
         td(c(resourceRequirements=[gpu(sharingStrategy={"nvidiaMps": {"memory": 1024, "maxComputePercent": 0}})])),
         "InvalidParameterException", (f"{RR0}.sharingStrategy.nvidiaMps.maxComputePercent",)),
    Case("nvidiaMps-memory-0", "register_task_definition",
         td(c(resourceRequirements=[gpu(sharingStrategy={"nvidiaMps": {"memory": 0}})])),
         "InvalidParameterException", (f"{RR0}.sharingStrategy.nvidiaMps.memory",)),
    # GPU rules
    Case("gpu-value-and-sharingStrategy", "register_task_definition",
         td(c(resourceRequirements=[gpu(value="1", sharingStrategy=MPS)])),
         "InvalidParameterException", (RR0, "mutually exclusive")),
    Case("gpu-neither-value-nor-sharingStrategy", "register_task_definition",
         td(c(resourceRequirements=[gpu()])),
         "InvalidParameterException", (RR0, "'value' or 'sharingStrategy'")),
    Case("sharingStrategy-on-InferenceAccelerator", "register_task_definition",
         td(c(resourceRequirements=[{"type": "InferenceAccelerator", "sharingStrategy": MPS}])),
         "InvalidParameterException", (f"{RR0}.sharingStrategy", "only valid with type GPU")),
    Case("gpu-whole-and-mps-in-one-task", "register_task_definition",
         td(c("whole", resourceRequirements=[gpu(value="1")]),
            c("shared", resourceRequirements=[gpu(sharingStrategy=MPS)])),
         "InvalidParameterException", ("'containerDefinitions'", "same option")),
    Case("gpu-value-abc", "register_task_definition", td(c(resourceRequirements=[gpu(value="abc")])),
         "InvalidParameterException", (f"{RR0}.value", "'abc'")),
    # task definition consistency
    Case("duplicate-container-names", "register_task_definition", td(c("app"), c("app")),
         "InvalidParameterException", ("containerDefinitions[1].name", "duplicate")),
    Case("dependsOn-unknown-container", "register_task_definition",
         td(c("a", dependsOn=[{"containerName": "ghost", "condition": "START"}])),
         "InvalidParameterException", ("containerDefinitions[0].dependsOn[0].containerName", "ghost")),
    Case("no-essential-container", "register_task_definition",
         td(c("a", essential=False), c("b", essential=False)),
         "InvalidParameterException", ("'containerDefinitions'", "essential")),
    Case("no-memory-anywhere", "register_task_definition", td({"name": "app", "image": "busybox"}),
         "InvalidParameterException", ("'memory'", "'memoryReservation'", "'app'")),
    Case("distinctInstance-in-task-definition", "register_task_definition",
         td(c(), placementConstraints=[{"type": "distinctInstance"}]),
         "InvalidParameterException", ("placementConstraints[0].type",)),
    Case("tags-aws-prefix-on-register", "register_task_definition",
         td(c(), tags=[{"key": "aws:owner", "value": "me"}]),
         "InvalidParameterException", ("tags[0].key", "aws:")),
    # references
    Case("unknown-cluster", "run_task", lambda e: {"cluster": "no-such-cluster", "taskDefinition": e.td_arn},
         "ClusterNotFoundException", ("no-such-cluster",)),
    Case("unknown-task-definition", "run_task", lambda e: {"cluster": e.cluster, "taskDefinition": "ghost-family"},
         "ClientException", ("ghost-family",)),
    Case("malformed-arn-tag-resource", "tag_resource",
         lambda e: {"resourceArn": "arn:nonsense", "tags": [{"key": "k", "value": "v"}]},
         "InvalidParameterException", ("resourceArn", "arn:nonsense")),
    Case("untaggable-arn-type", "tag_resource",
         lambda e: {"resourceArn": e.cluster_arn.replace(":cluster/bad-input", ":container/bad-input/t/x"),
                    "tags": [{"key": "k", "value": "v"}]},
         "InvalidParameterException", ("resourceArn", "'container'")),
    Case("cluster-arn-where-task-definition-expected", "run_task",
         lambda e: {"cluster": e.cluster, "taskDefinition": e.cluster_arn},
         "InvalidParameterException", ("taskDefinition", "task-definition")),
    # sizes and counts
    Case("cluster-name-300-chars", "create_cluster", lambda e: {"clusterName": "c" * 300},
         "InvalidParameterException", ("clusterName",)),
    Case("startedBy-200-chars", "run_task",
         lambda e: {"cluster": e.cluster, "taskDefinition": e.td_arn, "startedBy": "s" * 200},
         "InvalidParameterException", ("'startedBy'", "128")),
    Case("clientToken-65-chars", "run_task",
         lambda e: {"cluster": e.cluster, "taskDefinition": e.td_arn, "clientToken": "t" * 65},
         "InvalidParameterException", ("'clientToken'",)),
    Case("51-tags", "tag_resource",
         lambda e: {"resourceArn": e.cluster_arn, "tags": [{"key": f"k{i}", "value": "v"} for i in range(51)]},
         "InvalidParameterException", ("'tags'", "50")),
    Case("tag-key-aws-prefix", "tag_resource",
         lambda e: {"resourceArn": e.cluster_arn, "tags": [{"key": "ok", "value": "v"},
                                                           {"key": "aws:cloudformation", "value": "v"}]},
         "InvalidParameterException", ("tags[1].key", "aws:")),
    # capacity providers
    Case("capacity-provider-both-kinds", "create_capacity_provider",
         lambda e: {"name": "bad-both", "cluster": e.cluster, "autoScalingGroupProvider": ASG_CONFIG,
                    "managedInstancesProvider": MI_CONFIG},
         "InvalidParameterException", ("autoScalingGroupProvider", "managedInstancesProvider")),
    Case("capacity-provider-neither-kind", "create_capacity_provider", lambda e: {"name": "bad-neither"},
         "InvalidParameterException", ("autoScalingGroupProvider", "managedInstancesProvider")),
    Case("managed-capacity-provider-without-cluster", "create_capacity_provider",
         lambda e: {"name": "bad-no-cluster", "managedInstancesProvider": MI_CONFIG},
         "InvalidParameterException", ("'cluster'",)),
    Case("capacity-provider-reserved-name", "create_capacity_provider",
         lambda e: {"name": "ecs-mine", "autoScalingGroupProvider": ASG_CONFIG},
         "InvalidParameterException", ("'name'",)),
    # container instances and attributes
    Case("instance-state-REGISTERING", "update_container_instances_state",
         lambda e: {"cluster": e.cluster, "containerInstances": [e.instance_arn], "status": "REGISTERING"},
         "InvalidParameterException", ("'status'", "REGISTERING")),
    Case("negative-cpu-on-register-instance", "register_container_instance",
         lambda e: {"cluster": e.cluster, "totalResources": [{"name": "CPU", "type": "INTEGER", "integerValue": -1}]},
         "InvalidParameterException", ("totalResources[0].integerValue",)),
    Case("identity-document-not-an-object", "register_container_instance",
         lambda e: {"cluster": e.cluster, "instanceIdentityDocument": "[1]"},
         "InvalidParameterException", ("instanceIdentityDocument",)),
    Case("forged-nextToken", "list_tasks",
         lambda e: {"cluster": e.cluster, "nextToken": base64.urlsafe_b64encode(b'{"o": "x"}').decode()},
         "InvalidParameterException", ("nextToken",)),
    Case("revision-out-of-range", "describe_task_definition",
         lambda e: {"taskDefinition": f"{e.family}:99999999999999999999"},
         "InvalidParameterException", ("taskDefinition", "revision")),
    Case("cpu-overflows", "register_task_definition", td(c(), cpu="1" * 400 + " vCPU"),
         "InvalidParameterException", ("'cpu'",)),
    Case("duplicate-tag-keys", "create_cluster",
         lambda e: {"clusterName": "dup-tags", "tags": [{"key": "a", "value": "1"}, {"key": "a", "value": "2"}]},
         "InvalidParameterException", ("tags[1].key", "duplicate")),
    Case("put-builtin-ecs-attribute", "put_attributes",
         lambda e: {"cluster": e.cluster, "attributes": [{"name": "ecs.os-type", "value": "windows",
                                                          "targetId": e.instance_arn}]},
         "InvalidParameterException", ("attributes[0].name", "ecs.")),
    # placement and launch
    Case("bad-memberOf-expression", "run_task",
         lambda e: {"cluster": e.cluster, "taskDefinition": e.td_arn,
                    "placementConstraints": [{"type": "memberOf", "expression": "attribute:ecs.os-type ~~ linux"}]},
         "InvalidParameterException", ("placementConstraints[0].expression", "at position 22")),
    Case("launchType-and-capacityProviderStrategy", "run_task",
         lambda e: {"cluster": e.cluster, "taskDefinition": e.td_arn, "launchType": "EC2",
                    "capacityProviderStrategy": [{"capacityProvider": "whatever", "weight": 1}]},
         "InvalidParameterException", ("'launchType'", "'capacityProviderStrategy'")),
    Case("deregister-without-revision", "deregister_task_definition", lambda e: {"taskDefinition": e.family},
         "InvalidParameterException", ("'taskDefinition'", "family:revision")),
]


def _http_status(err: ClientError) -> int:
    return err.response["ResponseMetadata"]["HTTPStatusCode"]


@pytest.mark.parametrize("case", [pytest.param(k, id=k.id, marks=k.marks) for k in CASES])
def test_invalid_request_is_rejected_and_changes_nothing(server, env, case):
    ecs = env.raw
    before = snapshot(server, env)

    with pytest.raises(ClientError) as caught:
        getattr(ecs, case.operation)(**case.params(env))

    err = caught.value
    assert isinstance(err, getattr(ecs.exceptions, case.code)), type(err).__name__
    assert err.response["Error"]["Code"] == case.code
    assert 400 <= _http_status(err) < 500
    message = err.response["Error"]["Message"]
    for fragment in case.fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert snapshot(server, env) == before


def test_case_table_is_big_and_distinct():
    assert len(CASES) >= 25
    assert len({k.id for k in CASES}) == len(CASES)


# --- protocol and authentication, over raw HTTP ---------------------------------------------------


def signed_post(server, target: str, body: bytes, *, access_key: str | None = None, secret: str | None = None,
                signed_body: bytes | None = None, headers: dict | None = None, payload_signing: bool = True,
                signed_at: datetime | None = None) -> httpx.Response:
    """POST `body`, signed with SigV4 as botocore signs; `signed_body` signs other bytes than are sent."""
    creds = server.credentials
    request = AWSRequest(method="POST", url=server.endpoint + "/", data=body if signed_body is None else signed_body,
                         headers={"Content-Type": CONTENT_TYPE, "X-Amz-Target": target, **(headers or {})})
    request.context["payload_signing_enabled"] = payload_signing
    signer = SigV4Auth(Credentials(access_key or creds["accessKeyId"], secret or creds["secretAccessKey"]),
                       "ecs", "local")
    if signed_at is None:
        signer.add_auth(request)
    else:
        with mock.patch("botocore.auth.get_current_datetime", return_value=signed_at):
            signer.add_auth(request)
    return httpx.post(server.endpoint + "/", content=body, headers=dict(request.headers.items()), timeout=10)


def unsigned_post(server, target: str, body: bytes, headers: dict | None = None) -> httpx.Response:
    return httpx.post(server.endpoint + "/", content=body, timeout=10,
                      headers={"Content-Type": CONTENT_TYPE, "X-Amz-Target": target, **(headers or {})})


CREATE_TARGET = f"{TARGET_PREFIX}.CreateCluster"
CREATE = json.dumps({"clusterName": "raw-http-cluster"}).encode()
TAMPERED = json.dumps({"clusterName": "tampered-cluster"}).encode()
RAW_CASES = [
    pytest.param(lambda s, e: signed_post(s, f"{TARGET_PREFIX}.LaunchRockets", CREATE),
                 "UnknownOperationException", 400, ("LaunchRockets",), id="unknown-operation"),
    pytest.param(lambda s, e: signed_post(s, "NotAService.CreateCluster", CREATE),
                 "UnknownOperationException", 400, ("NotAService.CreateCluster",), id="unknown-target-prefix"),
    pytest.param(lambda s, e: signed_post(s, CREATE_TARGET, b'{"clusterName": "raw-http'),
                 "SerializationException", 400, ("JSON",), id="body-not-json"),
    pytest.param(lambda s, e: signed_post(s, CREATE_TARGET, b'["raw-http-cluster"]'),
                 "InvalidParameterException", 400, ("body", "JSON object"), id="body-not-an-object"),
    pytest.param(lambda s, e: unsigned_post(s, CREATE_TARGET, CREATE),
                 "UnrecognizedClientException", 403, ("Authentication",), id="no-authorization-header"),
    pytest.param(lambda s, e: signed_post(s, CREATE_TARGET, CREATE, access_key="AKIDNOSUCHKEY0000000"),
                 "UnrecognizedClientException", 403, ("security token",), id="unknown-access-key"),
    pytest.param(lambda s, e: unsigned_post(s, CREATE_TARGET, CREATE,
                                         {"Authorization": "AWS4-HMAC-SHA256 Credential=x"}),
                 "InvalidSignatureException", 403, ("SignedHeaders",), id="authorization-header-incomplete"),
    pytest.param(lambda s, e: signed_post(s, CREATE_TARGET, CREATE,
                                       signed_at=datetime.now(timezone.utc) - timedelta(minutes=20)),
                 "InvalidSignatureException", 403, ("expired",), id="signature-expired"),
    pytest.param(lambda s, e: signed_post(s, CREATE_TARGET, TAMPERED, signed_body=CREATE),
                 "InvalidSignatureException", 403, ("signature",), id="body-tampered-after-signing"),
    pytest.param(lambda s, e: signed_post(s, CREATE_TARGET, TAMPERED, signed_body=CREATE,
                                       headers={"X-Amz-Content-SHA256": hashlib.sha256(CREATE).hexdigest()}),
                 "InvalidSignatureException", 403, ("signature",),
                 id="body-tampered-after-signing-with-content-sha256-header"),
    pytest.param(lambda s, e: signed_post(s, CREATE_TARGET, TAMPERED, payload_signing=False),
                 "InvalidSignatureException", 403, ("signature",),
                 id="unsigned-payload"),
    pytest.param(lambda s, e: signed_post(s, CREATE_TARGET, b" " * (5 * 1024 * 1024)),
                 "SerializationException", 413, ("exceeds",), id="body-too-large"),
    pytest.param(lambda s, e: signed_post(s, CREATE_TARGET, b"[" * 100_000),
                 "SerializationException", 400, ("JSON",), id="body-nested-too-deep"),
    pytest.param(lambda s, e: signed_post(s, f"{TARGET_PREFIX}.TagResource", json.dumps(
                     {"resourceArn": e.cluster_arn, "tags": [{"key": "aws:owner", "value": None}]}).encode()),
                 "InvalidParameterException", 400, ("tags[0].key", "aws:"),
                 id="tag-value-null-and-aws-prefix"),
]


@pytest.mark.parametrize("send, code, status, fragments", RAW_CASES)
def test_protocol_and_auth_errors_change_nothing(server, env, send, code, status, fragments):
    before = snapshot(server, env)
    response = send(server, env)
    assert response.status_code == status
    body = response.json()
    assert body["__type"] == code
    for fragment in fragments:
        assert fragment in body["message"], f"{fragment!r} not in {body['message']!r}"
    assert snapshot(server, env) == before


def test_wrong_secret_is_an_invalid_signature_and_changes_nothing(server, env):
    creds = server.credentials
    forged = boto3.client("ecs", endpoint_url=server.endpoint, region_name="local",
                          aws_access_key_id=creds["accessKeyId"], aws_secret_access_key="not-the-secret",
                          config=Config(retries={"max_attempts": 1}))
    before = snapshot(server, env)
    with pytest.raises(ClientError) as caught:
        forged.create_cluster(clusterName="forged-cluster")
    err = caught.value
    assert err.response["Error"]["Code"] == "InvalidSignatureException"
    assert _http_status(err) == 403
    assert "signature" in err.response["Error"]["Message"]
    assert snapshot(server, env) == before


# --- requests that fail halfway leave no partial writes ---------------------------------------------


def _attribute_names(ecs, env) -> set[tuple[str, str]]:
    found = _pages(ecs.list_attributes, "attributes", cluster=env.cluster, targetType="container-instance")
    return {(a["targetId"], a["name"]) for a in found}


def test_put_attributes_with_one_unknown_target_writes_nothing(server, env):
    ecs = env.raw
    before = snapshot(server, env)
    with pytest.raises(ecs.exceptions.TargetNotFoundException) as caught:
        ecs.put_attributes(cluster=env.cluster, attributes=[
            {"name": "halfway-good", "value": "yes", "targetId": env.instance_arn},
            {"name": "halfway-bad", "value": "yes", "targetId": "0123456789abcdef0123456789abcdef"},
        ])
    assert 400 <= _http_status(caught.value) < 500
    assert "0123456789abcdef0123456789abcdef" in caught.value.response["Error"]["Message"]
    assert (env.instance_arn, "halfway-good") not in _attribute_names(ecs, env)
    assert snapshot(server, env) == before


def test_put_attributes_over_the_limit_on_second_target_rolls_back_the_first(server, env):
    """The first target's attribute is written before the second target's limit check fails;
    the transaction must take it back."""
    ecs = env.raw
    before = snapshot(server, env)
    with pytest.raises(ecs.exceptions.AttributeLimitExceededException):
        ecs.put_attributes(cluster=env.cluster, attributes=[
            {"name": "rollback-good", "value": "yes", "targetId": env.instance_arn},
            {"name": "one-too-many", "value": "yes", "targetId": env.full_instance_arn},
        ])
    assert (env.instance_arn, "rollback-good") not in _attribute_names(ecs, env)
    assert snapshot(server, env) == before


def test_valid_requests_after_the_bad_ones_still_work(server, env):
    """The server is healthy after the bad input, and the snapshot does see real changes."""
    ecs = env.ecs
    before = snapshot(server, env)
    ecs.put_attributes(cluster=env.cluster, attributes=[{"name": "probe", "value": "ok", "targetId": env.instance_arn}])
    after = snapshot(server, env)
    assert after["attributes"] != before["attributes"]
    assert after["events"] == before["events"]  # attributes emit no event
    ecs.delete_attributes(cluster=env.cluster, attributes=[{"name": "probe", "targetId": env.instance_arn}])
