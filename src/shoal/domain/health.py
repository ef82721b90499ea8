"""A container instance's health: four checks and the overall status (ecs-semantics §1.10).

Pure rules, no store. The overall status is the most severe check, with the precedence
IMPAIRED > INSUFFICIENT_DATA > INITIALIZING > OK. One exception: a DAEMON check impaired only by
non-critical daemons shows the failure but does not count (issue #5: `overallStatus` ignores
non-critical daemons); such a detail carries `NON_CRITICAL_MARK` at the end of its reason.
"""

from __future__ import annotations

CHECKS = ("CONTAINER_RUNTIME", "ACCELERATED_COMPUTE", "DAEMON", "AGENT_CONNECTIVITY")
STATUSES = ("OK", "IMPAIRED", "INSUFFICIENT_DATA", "INITIALIZING")
_SEVERITY = ("IMPAIRED", "INSUFFICIENT_DATA", "INITIALIZING")
NON_CRITICAL_MARK = " (non-critical daemon: the host stays in service)"


def initial(now: float) -> dict:
    return {"overallStatus": "INITIALIZING",
            "details": [{"type": t, "status": "INITIALIZING", "lastUpdated": now, "lastStatusChange": now}
                        for t in CHECKS]}


def check(health: dict, kind: str) -> dict:
    return next((d for d in health["details"] if d["type"] == kind), {"type": kind, "status": "INITIALIZING"})


def counts(detail: dict) -> bool:
    """Whether a check counts toward the overall status."""
    return not (detail["type"] == "DAEMON" and detail.get("statusReason", "").endswith(NON_CRITICAL_MARK))


def set_check(health: dict, kind: str, status: str, reason: str | None, now: float) -> bool:
    """Set one check (and the overall status); return whether this is a transition, of the check
    or of the overall status: what "ECS Container Instance Health Change" reports. (A new reason
    alone is recorded, not announced.)"""
    details = {d["type"]: d for d in health["details"]}
    detail = details.setdefault(kind, {"type": kind, "status": "INITIALIZING", "lastStatusChange": now})
    changed = detail["status"] != status
    reason = reason[:1024] if reason else None
    if changed or detail.get("statusReason") != reason:
        if changed:
            detail["lastStatusChange"] = now
        detail.update(status=status, lastUpdated=now)
        if reason:
            detail["statusReason"] = reason
        else:
            detail.pop("statusReason", None)
    counted = [d["status"] for d in details.values() if counts(d)]
    overall = next((s for s in _SEVERITY if s in counted), "OK")
    changed = changed or health.get("overallStatus") != overall
    health.update(overallStatus=overall, details=list(details.values()))
    return changed
