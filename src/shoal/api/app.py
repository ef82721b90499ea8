"""Assemble the control plane's ASGI application."""

from __future__ import annotations

import asyncio
import contextlib

from starlette.applications import Starlette
from starlette.routing import Route

from shoal.api.action_logs import action_log_routes
from shoal.api.agent.routes import AgentProtocol
from shoal.api.alarms import alarm_routes
from shoal.api.chaos import chaos_routes
from shoal.api.daemon_sli import daemon_sli_routes
from shoal.api.ecs import register_all as register_ecs
from shoal.api.eventbridge import register_all as register_eventbridge
from shoal.api.metrics import metrics_route
from shoal.api.operations import ecs, eventbridge
from shoal.api.protocol.awsjson import AwsJsonEndpoint
from shoal.api.queues import queue_routes
from shoal.api.recovery import recovery_routes
from shoal.api.rest import events_endpoint, healthz
from shoal.config import Settings
from shoal.control.daemons import DaemonScheduler
from shoal.control.hub import Hub
from shoal.control.services import ServiceScheduler
from shoal.domain.arns import ArnFactory
from shoal.events.action_log import FileSink
from shoal.events.dispatcher import Dispatcher
from shoal.scheduler import placement
from shoal.store.db import Store


def create_app(settings: Settings, store: Store | None = None, capacity=None):
    store = store or Store(settings.database_url)
    store.migrate()
    sink = None
    if settings.action_log_file is not None:  # committed action-log entries also go to this file
        sink = FileSink(settings.action_log_file)
        sink.attach(store.write_engine)
    register_ecs()
    register_eventbridge()
    placement.configure(max_mps_clients=settings.mps_max_clients)
    arns = ArnFactory(settings.region, settings.account)
    dispatcher = Dispatcher(store, settings.webhook_secret.encode())
    hub = Hub(store, arns, capacity=capacity, dispatcher=dispatcher, agent_timeout=settings.agent_timeout,
              services=ServiceScheduler(healthy_after=settings.service_healthy_after),
              daemons=DaemonScheduler(start_timeout=settings.daemon_start_timeout))
    aws = AwsJsonEndpoint(store, [ecs, eventbridge], arns=arns, credentials=settings.credentials if settings.auth else None,
                          committed=hub.committed)
    agents = AgentProtocol(store, arns, settings.join_token, hub)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        loops = [asyncio.create_task(hub.run()), asyncio.create_task(dispatcher.run())]
        yield
        for loop in loops:
            loop.cancel()
        for loop in loops:
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        store.close()
        if sink is not None:  # after the store: the last batch's entries are queued by now
            sink.close()

    app = Starlette(
        routes=[
            Route("/v1/events", events_endpoint(store, aws.authenticate), methods=["GET"]),
            *queue_routes(store, aws.authenticate),
            *action_log_routes(store, aws.authenticate),
            *alarm_routes(store, arns, aws.authenticate),
            *chaos_routes(hub, aws.authenticate),
            *daemon_sli_routes(store, aws.authenticate),
            *recovery_routes(store, settings, aws.authenticate),
            Route("/healthz", healthz, methods=["GET"]),
            metrics_route(store),  # unauthenticated, like /healthz: see docs/decisions.md
        ],
        lifespan=lifespan,
    )

    async def shoal(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/" and scope["method"] == "POST":
            await aws(scope, receive, send)
        elif scope["type"] == "http" and scope["path"].startswith(agents.PREFIX):
            await agents(scope, receive, send)
        else:
            await app(scope, receive, send)

    shoal.end_long_polls = hub.signals.close  # for the server, when it starts shutting down
    return shoal
