"""`GET /metrics`: Prometheus text exposition format 0.0.4, unauthenticated like /healthz (a
Prometheus scraper cannot sign SigV4; restrict the port by network if the names are sensitive).

Per daemon (labels cluster, daemon), computed at scrape time over the last hour with
shoal.control.daemon_sli, which defines the figures:

  shoal_daemon_start_success_ratio       startSuccessRate (no sample while no start is decided)
  shoal_daemon_restarts_per_hour         restartsPerHour
  shoal_daemon_mttr_seconds{kind=...}    kind="replace": mttrReplaceSeconds, kind="recover":
                                         mttrRecoverSeconds (no sample while there is none)
  shoal_daemon_hosts_without_daemon      hostsWithoutDaemon

and for the fleet, now:

  shoal_container_instances{cluster,status}   hosts that are not INACTIVE, by status
  shoal_tasks{cluster,last_status}            tasks that are not STOPPED, by last status

The text format is written here (no client library): a HELP and a TYPE line per family, then
its samples, label values escaped.
"""

from __future__ import annotations

import asyncio
import math
import time

from sqlalchemy import func, select
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from shoal.control import daemon_sli
from shoal.store.db import Store
from shoal.store.tables import clusters, container_instances as cis, tasks

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
WINDOW_S = 3600.0
LIVE_TASK_STATUSES = ("PROVISIONING", "PENDING", "ACTIVATING", "RUNNING", "DEACTIVATING", "STOPPING",
                      "DEPROVISIONING")


def metrics_route(store: Store) -> Route:
    async def metrics(_request: Request) -> Response:
        now = time.time()
        # A window of history: on a thread, not inline on the event loop (SQLite reads run there).
        text = await asyncio.to_thread(store.read_sync, lambda conn: render(conn, now))
        return Response(text, media_type=CONTENT_TYPE)

    return Route("/metrics", metrics, methods=["GET"])


def render(conn, now: float) -> str:
    out = Exposition()
    slis = daemon_sli.compute(conn, cluster=None, daemon=None, window_s=WINDOW_S, now=now)

    def per_daemon(key: str, **extra) -> list[tuple[dict, float | None]]:
        return [({"cluster": s["cluster"], "daemon": s["daemonName"], **extra}, s[key]) for s in slis]

    out.gauge("shoal_daemon_start_success_ratio",
              "Share of the daemon's decided task starts in the last hour that reached RUNNING and "
              "did not fail within 10 s.", per_daemon("startSuccessRate"))
    out.gauge("shoal_daemon_restarts_per_hour",
              "Restarts of the daemon after a failure (DAEMON_TASK_RESTARTED) per hour, over the last hour.",
              per_daemon("restartsPerHour"))
    out.gauge("shoal_daemon_mttr_seconds",
              "Mean time to repair hosts impaired by the daemon, over repairs that ended in the last hour: "
              "kind=replace, host replaced (HOST_REPAIR_COMPLETED); kind=recover, the daemon ran again "
              "on the host.",
              per_daemon("mttrReplaceSeconds", kind="replace") + per_daemon("mttrRecoverSeconds", kind="recover"))
    out.gauge("shoal_daemon_hosts_without_daemon",
              "ACTIVE hosts of the daemon's capacity providers without a RUNNING task of it (withoutDaemonCount).",
              per_daemon("hostsWithoutDaemon"))

    live = [name for (name,) in conn.execute(select(clusters.c.name).where(clusters.c.status == "ACTIVE")
                                             .order_by(clusters.c.name))]
    hosts = conn.execute(select(cis.c.cluster_name, cis.c.status, func.count())
                         .where(cis.c.status != "INACTIVE")
                         .group_by(cis.c.cluster_name, cis.c.status)
                         .order_by(cis.c.cluster_name, cis.c.status)).all()
    out.gauge("shoal_container_instances", "Container instances that are not INACTIVE, by cluster and status.",
              [({"cluster": c, "status": s}, n) for c, s, n in hosts])
    task_samples = []
    for cluster in live:  # one index range per cluster (cluster, last status): no scan of STOPPED history
        for status, n in conn.execute(select(tasks.c.last_status, func.count())
                                      .where(tasks.c.cluster_name == cluster,
                                             tasks.c.last_status.in_(LIVE_TASK_STATUSES))
                                      .group_by(tasks.c.last_status).order_by(tasks.c.last_status)):
            task_samples.append(({"cluster": cluster, "last_status": status}, n))
    out.gauge("shoal_tasks", "Tasks that are not STOPPED, by cluster and last status.", task_samples)
    return out.text()


# --- the text format ---------------------------------------------------------------------------------

class Exposition:
    """Metric families in the Prometheus text format 0.0.4."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def gauge(self, name: str, help_text: str, samples: list[tuple[dict, float | None]]) -> None:
        """A gauge family; samples whose value is None are left out (no data is no sample)."""
        self._lines.append(f"# HELP {name} {escape_help(help_text)}")
        self._lines.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            if value is None:
                continue
            self._lines.append(f"{name}{format_labels(labels)} {format_value(value)}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_labels(labels: dict) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label(str(v))}"' for k, v in labels.items()) + "}"


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
