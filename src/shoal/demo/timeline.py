"""The demo's timeline, read back from what shoal recorded: the event log (EventBridge envelopes)
and the cluster's action log, merged in time order. Nothing here is measured by the demo's own
clock: every time is the one shoal stamped on the record."""

from __future__ import annotations

from datetime import datetime

TASK, HOST = "ECS Task State Change", "ECS Container Instance State Change"
HEALTH, DAEMON_ACTION = "ECS Container Instance Health Change", "ECS Daemon Service Action"


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _short(arn: str | None) -> str:
    return (arn or "?").rsplit("/", 1)[-1][:8]


def _event_line(e: dict, hosts: dict[str, str]) -> tuple[float, str] | None:
    d, kind = e["detail"], e["detail-type"]
    if kind == TASK:
        where = hosts.get(d.get("containerInstanceArn"), "-")
        why = f" ({d['stoppedReason'][:70]})" if d["lastStatus"] == "STOPPED" and d.get("stoppedReason") else ""
        return epoch(d["updatedAt"]), f"task {d.get('group', '?')} {_short(d['taskArn'])} {d['lastStatus']} on {where}{why}"
    if kind == HOST:
        return epoch(d["updatedAt"]), f"host {d['ec2InstanceId']} ({d.get('capacityProviderName')}) {d['status']}"
    if kind == HEALTH:
        changed = max(d["healthChecks"], key=lambda c: c.get("lastStatusChange", ""))
        reason = f": {changed['statusReason']}" if changed.get("statusReason") else ""
        return epoch(d["updatedAt"]), (f"host {d['ec2InstanceId']} {changed['type']} {changed['status']}{reason} "
                                       f"(overall {d['overallStatus']})")
    if kind == DAEMON_ACTION:
        return epoch(d.get("createdAt") or e["time"]), f"daemon event {d.get('eventName')}: {d.get('reason', '')[:90]}"
    return None


def _action_line(entry: dict) -> tuple[float, str] | None:
    name, detail = entry["eventName"], entry["detail"]
    if name.startswith("CHAOS_"):
        what = detail.get("result") or " ".join(str(detail[k]) for k in ("action", "mode", "daemon", "xid")
                                                if detail.get(k) is not None)
        return epoch(entry["timestamp"]), f"action log {name} on {detail.get('ec2InstanceId', '')}: {what}".replace(
            " on : ", ": ")
    if name.startswith(("HOST_REPAIR", "HOST_REPLACEMENT", "REPAIR_", "TASK_RERUN")):
        return epoch(entry["timestamp"]), f"action log {name}"
    return None


def build(events: list[dict], actions: list[dict], since: float) -> list[tuple[float, str]]:
    """(epoch seconds, line) of what happened from `since` on, oldest first."""
    hosts = {e["detail"]["containerInstanceArn"]: e["detail"]["ec2InstanceId"]
             for e in events if e["detail-type"] == HOST}
    seen: set[tuple[str, str]] = set()  # a task's RUNNING and STOPPED, once each
    lines = []
    for e in events:
        if e["detail-type"] == TASK:
            key = (e["detail"]["taskArn"], e["detail"]["lastStatus"])
            if key[1] not in ("RUNNING", "STOPPED") or key in seen:
                continue
            seen.add(key)
        if line := _event_line(e, hosts):
            lines.append(line)
    lines += [line for a in actions if (line := _action_line(a))]
    return sorted((t, text) for t, text in lines if t >= since - 0.001)


def first(events: list[dict], kind: str, since: float, match) -> float | None:
    """The time of the first event of `kind` at or after `since` whose detail matches."""
    times = [epoch(e["detail"].get("updatedAt") or e["time"]) for e in events
             if e["detail-type"] == kind and match(e["detail"])]
    times = [t for t in times if t >= since - 0.001]
    return min(times, default=None)


def accelerated(status: str):
    def match(d: dict) -> bool:
        return any(c["type"] == "ACCELERATED_COMPUTE" and c["status"] == status for c in d["healthChecks"])
    return match
