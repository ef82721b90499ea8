"""Daemon SLIs over REST (SigV4-signed like the API):

  GET /v1/daemons/sli[?cluster=C][&daemon=D][&window=1h]
      → {"windowSeconds": 3600.0, "daemons": [{...}, ...]}

Per daemon (of cluster C, named D, when given; by cluster, then name): start success rate,
restarts per hour, mean times to repair, hosts without it now. The figures and their
definitions: shoal.control.daemon_sli. `window` is `30m`, `1h`, `2d`, `90s` or seconds
(default 1h). `daemon` is a name or a daemon ARN; a bare name without `cluster` matches that
daemon in every cluster. A named cluster or daemon must exist.

The report reads a window of history, so it runs on a thread of its own rather than inline on
the event loop (where SQLite reads otherwise run).
"""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import select
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shoal.api.ecs.daemons import daemon_not_found
from shoal.control import daemon_sli
from shoal.domain import arns
from shoal.domain.errors import ApiError, ClusterNotFound, InvalidParameter
from shoal.store.db import Store
from shoal.store.tables import clusters, daemons

DEFAULT_WINDOW = "1h"


def daemon_sli_routes(store: Store, authenticate) -> list[Route]:
    async def report(request: Request) -> JSONResponse:
        try:
            authenticate(request.method, request.url.path, request.url.query,
                         {k.lower(): v for k, v in request.headers.items()}, b"")
            params = _params(request.query_params)
            now = time.time()
            found = await asyncio.to_thread(store.read_sync, lambda conn: _report(conn, now=now, **params))
        except ApiError as err:
            return JSONResponse({"__type": err.code, "message": err.message}, err.status)
        return JSONResponse({"windowSeconds": params["window_s"], "daemons": found})

    return [Route("/v1/daemons/sli", report, methods=["GET"])]


def _params(query) -> dict:
    cluster = daemon = None
    cluster_ref = query.get("cluster")
    if cluster_ref is not None:
        cluster = arns.short_name(cluster_ref, "cluster", "cluster")
        if not 1 <= len(cluster) <= 255:
            raise InvalidParameter("Invalid parameter 'cluster': a cluster name or ARN.")
    daemon_ref = query.get("daemon")
    if daemon_ref is not None:
        if arns.is_arn(daemon_ref):
            arn = arns.parse(daemon_ref, "daemon")
            parts = arn.path.split("/")
            if arn.resource_type != "daemon" or len(parts) != 2 or not all(parts):
                raise InvalidParameter(f"Invalid parameter 'daemon': '{daemon_ref}' is not a daemon ARN "
                                       "(…:daemon/<cluster>/<name>).")
            if cluster is not None and parts[0] != cluster:
                raise InvalidParameter(f"Invalid parameter 'daemon': '{daemon_ref}' is a daemon of cluster "
                                       f"'{parts[0]}', not of '{cluster}'.")
            cluster, daemon = parts
            cluster_ref = cluster_ref or cluster
        else:
            daemon = daemon_ref
        if not 1 <= len(daemon) <= 255:
            raise InvalidParameter("Invalid parameter 'daemon': a daemon name or ARN.")
    window = query.get("window", DEFAULT_WINDOW)
    try:
        window_s = daemon_sli.parse_window(window)
    except ValueError:
        raise InvalidParameter(f"Invalid parameter 'window': '{window}' is not a duration such as 30m, 1h or 2d, "
                               f"or seconds, from more than 0 up to {int(daemon_sli.MAX_WINDOW // 86400)}d.") from None
    return {"cluster_ref": cluster_ref, "cluster": cluster, "daemon": daemon, "daemon_ref": daemon_ref,
            "window_s": window_s}


def _report(conn, *, cluster_ref, cluster, daemon, daemon_ref, window_s, now) -> list[dict]:
    if cluster is not None and conn.execute(select(clusters.c.name).where(clusters.c.name == cluster)).first() is None:
        raise ClusterNotFound(f"Cluster not found: '{cluster_ref}'.")
    if daemon is not None:
        stmt = select(daemons.c.arn).where(daemons.c.name == daemon)
        if cluster is not None:
            stmt = stmt.where(daemons.c.cluster_name == cluster)
        if conn.execute(stmt.limit(1)).first() is None:
            raise daemon_not_found(daemon_ref)
    return daemon_sli.compute(conn, cluster=cluster, daemon=daemon, window_s=window_s, now=now)
