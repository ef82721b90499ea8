"""`GET /v1/explain/recovery?cluster=C[&capacityProvider=P]` (SigV4-signed like the API):
who owns recovery on each of the cluster's capacity providers, from the live configuration
(shoal.control.recovery). One JSON object keyed by capacity provider name."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shoal.control import recovery
from shoal.domain import arns
from shoal.domain.errors import ApiError, ClusterNotFound, InvalidParameter
from shoal.store.db import Store


def recovery_routes(store: Store, settings, authenticate) -> list[Route]:
    async def explain(request: Request) -> JSONResponse:
        try:
            authenticate(request.method, request.url.path, request.url.query,
                         {k.lower(): v for k, v in request.headers.items()}, b"")
            cluster_ref = request.query_params.get("cluster") or "default"
            cluster = arns.short_name(cluster_ref, "cluster", "cluster")
            provider = request.query_params.get("capacityProvider")
            if provider is not None:
                provider = arns.short_name(provider, "capacity-provider", "capacityProvider")
            try:
                found = await store.read(lambda conn: recovery.explain(conn, cluster, settings, provider))
            except LookupError:
                raise ClusterNotFound(f"Cluster not found: '{cluster_ref}'.") from None
            if provider is not None and not found:
                raise InvalidParameter(f"Invalid parameter 'capacityProvider': '{provider}' is not a capacity "
                                       f"provider of cluster '{cluster}'.")
        except ApiError as err:
            return JSONResponse({"__type": err.code, "message": err.message}, err.status)
        return JSONResponse(found)

    return [Route("/v1/explain/recovery", explain, methods=["GET"])]
