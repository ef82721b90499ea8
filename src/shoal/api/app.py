"""Assemble the control plane's ASGI application."""

from __future__ import annotations

import contextlib

from starlette.applications import Starlette
from starlette.routing import Route

from shoal.api.ecs import register_all
from shoal.api.operations import ecs
from shoal.api.protocol.awsjson import AwsJsonEndpoint
from shoal.api.rest import events_endpoint, healthz
from shoal.config import Settings
from shoal.domain.arns import ArnFactory
from shoal.store.db import Store


def create_app(settings: Settings, store: Store | None = None):
    store = store or Store(settings.database_url)
    store.migrate()
    register_all()
    aws = AwsJsonEndpoint(store, [ecs], arns=ArnFactory(settings.region, settings.account),
                          credentials=settings.credentials if settings.auth else None)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        store.close()

    app = Starlette(
        routes=[
            Route("/v1/events", events_endpoint(store, aws.authenticate), methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        lifespan=lifespan,
    )

    async def shoal(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/" and scope["method"] == "POST":
            await aws(scope, receive, send)
        else:
            await app(scope, receive, send)

    return shoal
