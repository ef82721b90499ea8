"""Request validation against botocore's ECS model, and the task definition rules."""

import pytest

from shoal.api.protocol.validation import service_model, validate
from shoal.domain import task_definitions
from shoal.domain.errors import InvalidParameter

ECS = service_model("ecs")


def check(op, params):
    validate(ECS.operation_model(op), params)


@pytest.mark.parametrize("op, params, fragment", [
    ("RunTask", {}, "'taskDefinition'"),
    ("RunTask", {"taskDefinition": "x", "count": "2"}, "'count': expected an integer"),
    ("RunTask", {"taskDefinition": "x", "count": True}, "'count': expected an integer"),
    ("RunTask", {"taskDefinition": "x", "launchType": "SPACESHIP"}, "'launchType'"),
    ("RunTask", {"taskDefinition": "x", "tags": [{"key": "k"}] * 51}, "'tags': must have at most 50"),
    ("RegisterTaskDefinition", {"family": "f", "containerDefinitions": [{"name": "c", "resourceRequirements": [
        {"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 8, "maxComputePercent": 101}}}]}]},
     "containerDefinitions[0].resourceRequirements[0].sharingStrategy.nvidiaMps.maxComputePercent"),
    ("RegisterTaskDefinition", {"family": "f", "containerDefinitions": [{"name": "c", "resourceRequirements": [
        {"type": "GPU", "sharingStrategy": {}}]}]}, "exactly one of"),
    ("RegisterTaskDefinition", {"family": "f", "containerDefinitions": {"name": "c"}}, "expected an array"),
])
def test_model_violations_name_the_field(op, params, fragment):
    with pytest.raises(InvalidParameter) as err:
        check(op, params)
    assert fragment in err.value.message


def test_valid_requests_pass():
    check("RunTask", {"taskDefinition": "x", "count": 3, "launchType": "EC2", "overrides": {"containerOverrides": []}})


def gpu(req):
    return {"family": "f", "containerDefinitions": [
        {"name": "a", "image": "i", "memory": 64, "resourceRequirements": [req]}]}


@pytest.mark.parametrize("request_, fragment", [
    (gpu({"type": "GPU", "value": "1", "sharingStrategy": {"nvidiaMps": {"memory": 1}}}), "mutually exclusive"),
    (gpu({"type": "InferenceAccelerator", "value": "x", "sharingStrategy": {"nvidiaMps": {"memory": 1}}}),
     "only valid with type GPU"),
    (gpu({"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 0}}}), "memory': must be at least 1"),
    (gpu({"type": "GPU", "value": "two"}), "positive integer or ALL"),
    ({"family": "f", "containerDefinitions": [
        {"name": "a", "memory": 64, "resourceRequirements": [{"type": "GPU", "value": "1"}]},
        {"name": "b", "memory": 64, "resourceRequirements": [{"type": "GPU", "sharingStrategy": {
            "nvidiaMps": {"memory": 1024}}}]}]}, "same option"),
    ({"family": "f", "containerDefinitions": [{"name": "a"}]}, "'memory' or 'memoryReservation'"),
    ({"family": "f", "containerDefinitions": [{"name": "a", "memory": 64, "essential": False}]}, "essential"),
    ({"family": "f", "containerDefinitions": [{"name": "a", "memory": 64}, {"name": "a", "memory": 64}]},
     "duplicate container name"),
    ({"family": "f", "containerDefinitions": [{"name": "a", "memory": 64}],
      "placementConstraints": [{"type": "memberOf", "expression": "attribute:x =="}]},
     "placementConstraints[0].expression"),
])
def test_task_definition_rules(request_, fragment):
    with pytest.raises(InvalidParameter) as err:
        task_definitions.validate(request_)
    assert fragment in err.value.message


def test_mps_task_definition_requires_the_mps_capability():
    doc = task_definitions.validate(gpu({"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 4096}}}))
    assert doc["requiresAttributes"] == [{"name": "ecs.capability.gpu-sharing-mps"}]
    assert doc["containerDefinitions"][0]["essential"] is True


def test_task_cpu_and_memory_are_stored_as_ecs_returns_them():
    doc = task_definitions.validate({"family": "f", "cpu": "1 vCPU", "memory": "2 GB",
                                     "containerDefinitions": [{"name": "a"}]})
    assert (doc["cpu"], doc["memory"]) == ("1024", "2048")


@pytest.mark.parametrize("text, units", [("1024", 1024), ("1 vCPU", 1024), ("0.5 vcpu", 512)])
def test_task_cpu_forms(text, units):
    assert task_definitions.parse_cpu(text) == units
