"""The ECS operations. Importing the modules registers their handlers on `shoal.api.operations.ecs`."""


def register_all() -> None:
    from shoal.api.ecs import (  # noqa: F401
        attributes, capacity_providers, clusters, container_instances, daemon_task_definitions, daemons,
        service_deployments, services, tags, task_definitions, tasks,
    )
