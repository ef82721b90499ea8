"""The "ECS Task State Change" event, written with every task change that moves its version."""

from __future__ import annotations

from shoal.events.envelope import TASK_STATE_CHANGE, event_detail, iso


def task_change_detail(ctx, doc: dict) -> dict:
    detail = event_detail(doc, drop=("tags", "healthStatus"))  # task events carry no health
    detail["updatedAt"] = iso(ctx.now)
    return detail


def emit_task_change(ctx, doc: dict) -> None:
    ctx.emit(TASK_STATE_CHANGE, [doc["taskArn"]], task_change_detail(ctx, doc))


def emit_task_changes(ctx, docs: list[dict]) -> None:
    """One event per task, in order, written together (RunTask's tasks)."""
    ctx.emit_many(TASK_STATE_CHANGE, [([doc["taskArn"]], task_change_detail(ctx, doc)) for doc in docs])
