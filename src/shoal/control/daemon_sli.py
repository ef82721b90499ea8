"""Daemon SLIs (issue #5, point 10): per daemon, over a window ending now, from what the daemon
scheduler (shoal.control.daemons) and the repair workflow leave in the store. Read-only.

- start success rate: the daemon's tasks created in the window whose start is decided, the share
  that started. A start succeeded when the task reached RUNNING and did not fail within
  START_GRACE seconds of starting (the scheduler's own rule: it then stays up, or stopped later,
  or was stopped by shoal or a user after RUNNING). It failed when the task stopped on its own
  before RUNNING or within START_GRACE of it. Undecided, and so out of both counts: a task not
  yet RUNNING, RUNNING for less than START_GRACE, or stopped by shoal or a user before RUNNING.
  None when no start is decided. (A task that cannot even be created, TASK_CREATION_FAILED,
  has no row: it shows in DAEMON_TASK_START_IMPAIRED and in hostsWithoutDaemon, not here.)
- restarts per hour: DAEMON_TASK_RESTARTED action-log entries in the window (the scheduler's
  restart, with backoff, of a daemon that failed on a host), per hour of window. A first start
  on a host, and a deployment's replacement of a task, are not restarts.
- mttrReplaceSeconds: the mean `durationSeconds` of the HOST_REPAIR_COMPLETED entries in the
  window for hosts whose repair the daemon caused (the entry's daemon, its detail's `daemon`, or
  that of the host's HOST_REPAIR_STARTED before it); None when there is none.
- mttrRecoverSeconds: self-managed recovery. An episode opens, on a (daemon, host), at its first
  DAEMON_TASK_STOPPED (critical or not) or DAEMON_TASK_START_IMPAIRED, and closes at the next
  DAEMON_TASK_RUNNING there: the daemon runs again. The mean length of the episodes that closed
  in the window; None when none did. An episode the host left instead (repair, registration
  failure) or a new first start cut short is not counted, nor one opened more than
  EPISODE_LOOKBACK before the window.
- hostsWithoutDaemon: DescribeDaemon's withoutDaemonCount over the daemon's capacity providers,
  now: ACTIVE hosts without a RUNNING task of it (`host_counts`). hostsRunning: its runningCount.

Cost. Tasks: one range scan of the cluster's tasks created in the window (index on cluster,
desired status, creation time), each document parsed once. Action log: the first id at the
window's start (less the lookback) is found by a binary search on the primary key, so the scan
of the cluster's entries (index on cluster, id) starts there; only the entry kinds used here
come back. Nothing reads history older than the window plus EPISODE_LOOKBACK.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import func, or_, select

from shoal import jsonio
from shoal.api.ecs.daemons import host_counts
from shoal.api.operations import Context
from shoal.control.daemons import START_GRACE, STOP_CODE
from shoal.domain.arns import ArnFactory
from shoal.domain.daemons import daemon_counts
from shoal.store.tables import action_logs, daemon_capacity_providers as daemon_cps, daemons, tasks

EPISODE_LOOKBACK = 86400.0  # how far before the window an episode's or a repair's start is looked for
SKEW = 60.0  # PostgreSQL writers may commit ids a little out of their timestamps' order
MAX_WINDOW = 90 * 86400.0
EXPECTED_STOPS = (STOP_CODE, "UserInitiated")  # stops shoal or a user asked for
HEALTH_STOP = "Task failed container health checks"  # …except this one, which the scheduler makes
DESIRED = ("PENDING", "RUNNING", "STOPPED")  # every desired status: lets the creation-time index serve

STARTED, RESTARTED, RUNNING = "DAEMON_TASK_STARTED", "DAEMON_TASK_RESTARTED", "DAEMON_TASK_RUNNING"
STOPPED, IMPAIRED = "DAEMON_TASK_STOPPED", "DAEMON_TASK_START_IMPAIRED"
REGISTRATION_FAILED = "CONTAINER_INSTANCE_REGISTRATION_FAILED"
REPAIR_STARTED, REPAIR_COMPLETED = "HOST_REPAIR_STARTED", "HOST_REPAIR_COMPLETED"
LOG_NAMES = (STARTED, RESTARTED, RUNNING, STOPPED, IMPAIRED, REGISTRATION_FAILED, REPAIR_STARTED, REPAIR_COMPLETED)

_WINDOW = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_window(value: str) -> float:
    """Seconds from `30m`, `1h`, `2d`, `90s` or `90`; ValueError unless it is more than 0 and at
    most MAX_WINDOW."""
    m = _WINDOW.match(value.strip())
    if not m:
        raise ValueError(value)
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not 0 < seconds <= MAX_WINDOW:
        raise ValueError(value)
    return seconds


def compute(conn, *, cluster: str | None, daemon: str | None, window_s: float, now: float) -> list[dict]:
    """The SLIs of each daemon (of `cluster`, named `daemon`, when given) over (now - window_s, now],
    ordered by cluster and name."""
    since = now - window_s
    stmt = select(daemons.c.arn, daemons.c.name, daemons.c.cluster_name, daemons.c.status)
    if cluster is not None:
        stmt = stmt.where(daemons.c.cluster_name == cluster)
    if daemon is not None:
        stmt = stmt.where(daemons.c.name == daemon)
    rows = conn.execute(stmt.order_by(daemons.c.cluster_name, daemons.c.name)).all()
    by_cluster: dict[str, list] = defaultdict(list)
    for row in rows:
        by_cluster[row.cluster_name].append(row)
    ctx = Context(conn, ArnFactory(), now=now)  # host_counts reads through a context
    out = []
    for cluster_name, views in by_cluster.items():
        names = {v.name for v in views}
        starts = _starts(conn, cluster_name, names, since, now)
        logged = _from_action_log(conn, cluster_name, names, since, now)
        providers: dict[str, list[str]] = defaultdict(list)
        for arn, provider in conn.execute(select(daemon_cps.c.daemon_arn, daemon_cps.c.capacity_provider_name)
                                          .where(daemon_cps.c.daemon_arn.in_([v.arn for v in views]))
                                          .order_by(daemon_cps.c.capacity_provider_name)):
            providers[arn].append(provider)
        for view in views:
            counts = host_counts(ctx, cluster_name, view.name, providers[view.arn])
            running = without = 0
            for per_provider in counts.values():
                r, w = daemon_counts(per_provider)
                running, without = running + r, without + w
            s, log = starts[view.name], logged[view.name]
            decided = s.succeeded + s.failed
            out.append({
                "cluster": cluster_name, "daemonName": view.name, "daemonArn": view.arn, "status": view.status,
                "windowSeconds": window_s,
                "starts": s.created, "startsSucceeded": s.succeeded, "startsFailed": s.failed,
                "startSuccessRate": s.succeeded / decided if decided else None,
                "restarts": log.restarts, "restartsPerHour": log.restarts * 3600.0 / window_s,
                "repairs": len(log.repairs), "mttrReplaceSeconds": _mean(log.repairs),
                "recoveries": len(log.recoveries), "mttrRecoverSeconds": _mean(log.recoveries),
                "hostsRunning": running, "hostsWithoutDaemon": without,
            })
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


# --- starts, from the daemon's tasks ----------------------------------------------------------------

@dataclass
class _Starts:
    created: int = 0
    succeeded: int = 0
    failed: int = 0


def start_outcome(last_status: str, doc: dict, now: float) -> bool | None:
    """True: the start succeeded; False: it failed; None: not decided (see the module's notes)."""
    started = doc.get("startedAt")
    if last_status == "STOPPED":
        stopped = doc.get("stoppedAt") or doc.get("stoppingAt") or now
        if started is not None and stopped - started >= START_GRACE:
            return True
        expected = (doc.get("stopCode") in EXPECTED_STOPS
                    and not str(doc.get("stoppedReason") or "").startswith(HEALTH_STOP))
        if expected:
            return True if started is not None else None
        return False
    if last_status == "RUNNING" and started is not None and now - started >= START_GRACE:
        return True
    return None


def _starts(conn, cluster: str, names: set[str], since: float, now: float) -> dict[str, _Starts]:
    out: dict[str, _Starts] = defaultdict(_Starts)
    rows = conn.execute(select(tasks.c.daemon_name, tasks.c.last_status, tasks.c.doc).where(
        tasks.c.cluster_name == cluster, tasks.c.desired_status.in_(DESIRED),
        tasks.c.created_at > since, tasks.c.created_at <= now,
        # Not `daemon_name IS NOT NULL`: SQLite would take it as a range of the (cluster, daemon)
        # index and read every daemon task ever created instead of the window's tasks.
        func.coalesce(tasks.c.daemon_name, "") != ""))
    for name, last_status, doc in rows:
        if name not in names:
            continue
        s = out[name]
        s.created += 1
        outcome = start_outcome(last_status, jsonio.loads(doc), now)
        if outcome is True:
            s.succeeded += 1
        elif outcome is False:
            s.failed += 1
    return out


# --- restarts, recoveries and repairs, from the action log -----------------------------------------

@dataclass
class _Logged:
    restarts: int = 0
    repairs: list[float] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)


def first_id_at(conn, at: float) -> int | None:
    """The lowest action-log id from which entries are at `at` or later, taking ids to grow with
    timestamps (the caller allows for SKEW); None when the log is empty. A binary search over the
    primary key: a few dozen index lookups, whatever the log's length."""
    lo, hi = conn.execute(select(func.min(action_logs.c.id), func.max(action_logs.c.id))).one()
    if lo is None:
        return None
    hi += 1  # the answer lies in [lo, hi]; hi: no entry is that late
    while lo < hi:
        mid = (lo + hi) // 2
        row = conn.execute(select(action_logs.c.id, action_logs.c.timestamp).where(action_logs.c.id >= mid)
                           .order_by(action_logs.c.id).limit(1)).first()
        if row.timestamp >= at:
            hi = mid  # no id lies in [mid, row.id): mid bounds the answer as well as row.id does
        else:
            lo = row.id + 1
    return lo


def _daemon_of(ref) -> str | None:
    """A daemon's name from a name or a daemon ARN (…:daemon/<cluster>/<name>)."""
    if not isinstance(ref, str) or not ref:
        return None
    return ref.rsplit("/", 1)[-1] if ref.startswith("arn:") else ref


def _from_action_log(conn, cluster: str, names: set[str], since: float, now: float) -> dict[str, _Logged]:
    out: dict[str, _Logged] = defaultdict(_Logged)
    start = first_id_at(conn, since - EPISODE_LOOKBACK - SKEW)
    if start is None:
        return out
    stmt = (select(action_logs.c.id, action_logs.c.timestamp, action_logs.c.event_name, action_logs.c.daemon_name,
                   action_logs.c.detail)
            .where(action_logs.c.cluster_name == cluster, action_logs.c.id >= start,
                   action_logs.c.event_name.in_(LOG_NAMES),
                   # before the window only what opens or closes an episode or a repair matters
                   or_(action_logs.c.event_name != RESTARTED, action_logs.c.timestamp > since))
            .order_by(action_logs.c.id))
    episodes: dict[tuple[str, str], float] = {}  # (daemon, host) -> when its open episode began
    repairs: dict[str, tuple[float, str | None]] = {}  # host -> (repair started at, the daemon that caused it)
    for _id, at, event_name, daemon_name, detail in conn.execute(stmt):
        if at > now:
            continue
        in_window = at > since
        if event_name == RESTARTED:
            if daemon_name in names and in_window:
                out[daemon_name].restarts += 1
            continue
        d = jsonio.loads(detail)
        host = d.get("containerInstanceArn")
        if event_name in (REPAIR_STARTED, REPAIR_COMPLETED, REGISTRATION_FAILED):
            for key in [k for k in episodes if k[1] == host]:
                del episodes[key]  # the host leaves: its daemons do not recover there
            if event_name == REPAIR_STARTED:
                repairs[host] = (at, _daemon_of(daemon_name) or _daemon_of(d.get("daemon")))
            elif event_name == REPAIR_COMPLETED:
                began, cause = repairs.pop(host, (None, None))
                cause = _daemon_of(daemon_name) or _daemon_of(d.get("daemon")) or cause
                duration = d.get("durationSeconds")
                if not isinstance(duration, (int, float)) or isinstance(duration, bool):
                    duration = at - began if began is not None else None
                if in_window and cause in names and duration is not None:
                    out[cause].repairs.append(float(duration))
            continue
        if daemon_name not in names or host is None:
            continue
        key = (daemon_name, host)
        if event_name in (STOPPED, IMPAIRED):
            episodes.setdefault(key, at)
        elif event_name == RUNNING:
            began = episodes.pop(key, None)
            if began is not None and in_window:
                out[daemon_name].recoveries.append(at - began)
        elif event_name == STARTED:
            episodes.pop(key, None)  # a first start: whatever was open there is over
    return out
