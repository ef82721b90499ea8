"""Who owns recovery, per capacity provider (`shoal explain recovery`, issue #6 point 3).

Built from the live configuration every time: the providers attached to the cluster and their
kind and auto-repair setting, the daemons on them (critical or not), the server's settings
(agent timeout, daemon start timeout), the repair controller's rules and the hosts' own agent
settings (MPS probe interval, watched Xids, as each agent advertises them). Nothing here is
prose that could drift from what the code does: each figure is read from the place that acts on it.
"""

from __future__ import annotations

import json

from sqlalchemy import func, select

from shoal.control import daemons as daemon_scheduler
from shoal.control import repair
from shoal.store.tables import capacity_providers, clusters, container_instances as cis, daemon_capacity_providers, \
    daemon_revisions, daemons

PROBE_INTERVAL_ATTRIBUTE = "shoal.mps.probe-interval"  # seconds, advertised by each agent
XID_SET_ATTRIBUTE = "shoal.gpu.xid-set"  # comma-separated Xids an agent treats as critical
RESUMPTION = ("Tasks are re-run, not resumed: a moved task starts again from its image, and what it held in "
              "memory is lost unless it checkpoints.")


def explain(conn, cluster: str, settings, provider: str | None = None) -> dict[str, dict]:
    """{provider name: what detects a fault on its hosts, what is done and by whom, the rate
    limits, and where task resumption ends}."""
    row = conn.execute(select(clusters.c.doc).where(clusters.c.name == cluster, clusters.c.status != "INACTIVE")).first()
    if row is None:
        raise LookupError(cluster)
    names = json.loads(row.doc).get("capacityProviders", [])
    if provider is not None:
        names = [n for n in names if n == provider]
    out = {}
    for name in names:
        cp = conn.execute(select(capacity_providers).where(capacity_providers.c.name == name)).first()
        if cp is not None:
            out[name] = _provider(conn, cluster, cp, settings)
    return out


def _provider(conn, cluster: str, cp, settings) -> dict:
    doc = json.loads(cp.doc)
    managed = cp.kind == "MANAGED_INSTANCES"
    actions = ((doc.get("managedInstancesProvider", {}).get("autoRepairConfiguration") or {})
               .get("actionsStatus", "ENABLED") if managed else None)
    repairs = managed and actions != "DISABLED"
    hosts = conn.execute(select(func.count()).where(cis.c.capacity_provider_name == cp.name,
                                                    cis.c.status != "INACTIVE")).scalar_one()
    attrs = _agent_settings(conn, cp.name)
    on_it = _daemons(conn, cluster, cp.name)
    critical = [d["name"] for d in on_it if d["critical"]]
    detectors = [
        {"check": "DAEMON", "detector": "shoal server (daemon scheduler), from the agent's task reports",
         "fault": "a critical daemon's task stops or turns UNHEALTHY on an ACTIVE host",
         "threshold": "at once: the agent reports the exit as it happens", "daemons": on_it},
        {"check": "DAEMON", "detector": "shoal server (daemon scheduler)",
         "fault": "a critical daemon does not run on a new host",
         "threshold": f"daemonStartTimeout {settings.daemon_start_timeout:g} s after the first start"},
        {"check": "ACCELERATED_COMPUTE", "detector": "the host's agent (MPS control daemon probe)",
         "fault": "the MPS control daemon of a GPU does not answer, crashes or enters FAULT",
         "threshold": (f"3 probes in a row fail, one probe every {attrs['probe']} s; a crash at once; "
                       "one probe that succeeds returns it to OK")},
        {"check": "ACCELERATED_COMPUTE", "detector": "the host's agent (NVML Xid events)",
         "fault": "a critical GPU Xid", "threshold": f"any Xid in {attrs['xids']}"},
        {"check": "AGENT_CONNECTIVITY", "detector": "shoal server (agent sweep)",
         "fault": "the host's agent stops polling",
         "threshold": (f"no poll for {settings.agent_timeout:g} s"
                       + (f"; repaired once lost for {repair.LOST_AGENT_GRACE:g} s more" if repairs else ""))},
    ]
    if repairs:
        action = {"by": "shoal (repair controller)",
                  "what": ("the impaired host is set DRAINING, a replacement of the same instance type is launched "
                           "first, its daemons start before it takes work, service tasks move through their "
                           "services, standalone tasks are re-run once (tag shoal:rerun-of), then the old host "
                           "is terminated")}
        limits = {"maxDrainingAtOnce": repair.rate_limit(hosts), "hosts": hosts,
                  "rule": "20 % of the provider's hosts (rounded down, at least 1); 1 below 9 hosts; daemon "
                          "deployments count against it too",
                  "coolDownSeconds": repair.COOLDOWN}
        resumption = RESUMPTION
    else:
        why = "auto repair is DISABLED on this provider" if managed else "the capacity is self-managed"
        action = {"by": "the operator",
                  "what": (f"shoal reports ({why}): the health check goes IMPAIRED with an ECS Container Instance "
                           "Health Change event and an action-log entry; a host whose critical daemon is down takes "
                           "no new application tasks, and a GPU whose MPS daemon is down no new MPS work; the "
                           f"daemon scheduler restarts a daemon with backoff ({daemon_scheduler.BACKOFF_BASE:g} s up "
                           f"to {daemon_scheduler.BACKOFF_MAX:g} s) and the host returns to service once it runs; "
                           "shoal never drains, replaces or terminates the host")}
        limits = None
        resumption = ("Nothing is moved: tasks keep running on the impaired host. A task that dies is replaced only "
                      "if a service owns it. " + RESUMPTION)
    return {"kind": cp.kind, "managed": managed, "autoRepair": actions or "n/a (self-managed)",
            "criticalDaemons": critical, "detectors": detectors, "action": action, "rateLimit": limits,
            "taskResumption": resumption}


def _daemons(conn, cluster: str, provider: str) -> list[dict]:
    rows = conn.execute(select(daemons.c.name, daemon_revisions.c.doc)
                        .select_from(daemons.join(daemon_capacity_providers,
                                                  daemon_capacity_providers.c.daemon_arn == daemons.c.arn)
                                     .join(daemon_revisions, daemon_revisions.c.arn == daemons.c.revision_arn))
                        .where(daemons.c.cluster_name == cluster,
                               daemon_capacity_providers.c.capacity_provider_name == provider)
                        .order_by(daemons.c.name)).all()
    return [{"name": name, "critical": json.loads(doc).get("critical", True)} for name, doc in rows]


def _agent_settings(conn, provider: str) -> dict[str, str]:
    """What the provider's agents advertise (distinct values), or what an agent uses by default."""
    probes, xids = set(), set()
    for (text,) in conn.execute(select(cis.c.doc).where(cis.c.capacity_provider_name == provider,
                                                        cis.c.status != "INACTIVE")):
        attributes = {a["name"]: a.get("value") for a in json.loads(text).get("attributes", [])}
        if attributes.get(PROBE_INTERVAL_ATTRIBUTE):
            probes.add(attributes[PROBE_INTERVAL_ATTRIBUTE])
        if attributes.get(XID_SET_ATTRIBUTE):
            xids.add(attributes[XID_SET_ATTRIBUTE])
    return {"probe": " or ".join(sorted(probes)) if probes else "(the agent's setting; no host has joined yet)",
            "xids": " or ".join(f"{{{x}}}" for x in sorted(xids)) if xids else
            "the agent's set (no host has joined yet)"}
