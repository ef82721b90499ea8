"""The "ECS Task State Change" event, written with every task change that moves its version."""

from __future__ import annotations

from shoal.events.envelope import TASK_STATE_CHANGE, event_detail, iso


def emit_task_change(ctx, doc: dict) -> None:
    detail = event_detail(doc, drop=("tags", "healthStatus"))  # task events carry no health
    detail["updatedAt"] = iso(ctx.now)
    ctx.emit(TASK_STATE_CHANGE, [doc["taskArn"]], detail)
