"""Tasks: lifecycle states and the document a new task starts from."""

from __future__ import annotations

from shoal.domain.errors import InvalidParameter
from shoal.domain.task_definitions import parse_cpu, parse_memory

# The lastStatus values before RUNNING (lifecycle: PROVISIONING → PENDING → ACTIVATING → RUNNING
# → DEACTIVATING → STOPPING → DEPROVISIONING → STOPPED).
PENDING_STATES = ("PROVISIONING", "PENDING", "ACTIVATING")


def check_overrides(task_definition: dict, overrides: dict) -> None:
    if overrides.get("cpu"):
        parse_cpu(str(overrides["cpu"]), "overrides.cpu")
    if overrides.get("memory"):
        parse_memory(str(overrides["memory"]), "overrides.memory")
    names = {c["name"] for c in task_definition["containerDefinitions"]}
    for i, co in enumerate(overrides.get("containerOverrides", [])):
        if co.get("name") not in names:
            raise InvalidParameter(f"Invalid parameter 'overrides.containerOverrides[{i}].name': no container "
                                   f"named '{co.get('name')}' in the task definition.")


def new_task(*, task_arn: str, cluster_arn: str, task_definition: dict, container_arns: list[str],
             overrides: dict, last_status: str, launch_type: str | None, group: str | None, started_by: str | None, tags: list[dict], now: float,
             container_instance_arn: str | None = None) -> dict:
    """The document of a task as RunTask/StartTask create it: nothing has run yet."""
    by_name = {co["name"]: co for co in overrides.get("containerOverrides", [])}
    containers = []
    for cdef, arn in zip(task_definition["containerDefinitions"], container_arns):
        co = by_name.get(cdef["name"], {})
        c = {
            "containerArn": arn,
            "taskArn": task_arn,
            "name": cdef["name"],
            "image": cdef.get("image", ""),
            "lastStatus": "PENDING",
            "networkInterfaces": [],
            "healthStatus": "UNKNOWN",
            "cpu": str(co.get("cpu", cdef.get("cpu", 0))),
        }
        memory = co.get("memory", cdef.get("memory"))
        if memory is not None:
            c["memory"] = str(memory)
        reservation = co.get("memoryReservation", cdef.get("memoryReservation"))
        if reservation is not None:
            c["memoryReservation"] = str(reservation)
        for req in cdef.get("resourceRequirements", []):
            if req["type"] == "GPU" and req.get("sharingStrategy"):
                c["gpuSharingStrategy"] = req["sharingStrategy"]
        containers.append(c)
    doc = {
        "taskArn": task_arn,
        "clusterArn": cluster_arn,
        "taskDefinitionArn": task_definition["taskDefinitionArn"],
        "overrides": {"containerOverrides": overrides.get("containerOverrides", []),
                      "inferenceAcceleratorOverrides": []},
        "lastStatus": last_status,
        "desiredStatus": "RUNNING",
        "containers": containers,
        "version": 1,
        "createdAt": now,
        "group": group or f"family:{task_definition['family']}",
        "healthStatus": "UNKNOWN",
        "enableExecuteCommand": False,
        "attachments": [],
        "attributes": [],
        "tags": tags,
    }
    cpu = str(parse_cpu(str(overrides["cpu"]))) if overrides.get("cpu") else task_definition.get("cpu")
    memory = str(parse_memory(str(overrides["memory"]))) if overrides.get("memory") else task_definition.get("memory")
    for key, value in (("cpu", cpu), ("memory", memory),
                       ("launchType", launch_type), ("startedBy", started_by), ("containerInstanceArn", container_instance_arn)):
        if value is not None:
            doc[key] = value
    return doc


def stop_unstarted(doc: dict, reason: str, stop_code: str, now: float) -> dict:
    """A task that never started goes straight to STOPPED."""
    doc = dict(doc)
    doc.update(lastStatus="STOPPED", desiredStatus="STOPPED", stopCode=stop_code, stoppedReason=reason,
               stoppingAt=now, stoppedAt=now, executionStoppedAt=now, version=doc["version"] + 1)
    doc["containers"] = [{**c, "lastStatus": "STOPPED"} for c in doc["containers"]]
    return doc
