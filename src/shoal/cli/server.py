"""`shoal server`: the control plane."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
import uvicorn

from shoal.config import Settings, load_or_create_credentials, load_or_create_join_token, load_or_create_secret

DEFAULT_PORT = 8642


def capacity_controller(settings: Settings, kind: str, launch: str | None, terminate: str | None,
                        list_: str | None, scale_in_after: float):
    """The managed-capacity controller with the provisioner the flags name (local hosts live in
    <data-dir>/hosts)."""
    from shoal.control.capacity import CapacityController
    from shoal.providers import from_settings

    try:
        provisioner = from_settings(kind, settings.data_dir.resolve() / "hosts", launch, terminate, list_)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--provisioner") from None
    return CapacityController(provisioner, settings.join_token, scale_in_after=scale_in_after)


def tune_gc() -> None:
    """Start-up is done: the API models validation reads are loaded now rather than on first
    use, then see shoal.gctune."""
    from shoal import gctune
    from shoal.api.protocol.validation import service_model

    for service in ("ecs", "events"):
        service_model(service)
    gctune.tune()


class _Server(uvicorn.Server):
    """uvicorn's server, which first has the agents' long-polls answer when it shuts down:
    otherwise each waits out the grace period and is cancelled (a connection cut, and a
    traceback in the log for every connected host)."""

    def __init__(self, config: uvicorn.Config, on_shutdown) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown

    async def shutdown(self, sockets=None) -> None:
        self._on_shutdown()
        await super().shutdown(sockets)


def _serve(settings: Settings, host: str, port: int, on_ready=None, capacity=None) -> None:
    from shoal.api.app import create_app

    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler
    # that was installed before it; make that a clean exit rather than death by signal.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    app = create_app(settings, capacity=capacity)
    tune_gc()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            loop="auto", http="auto", lifespan="on",
                            timeout_graceful_shutdown=2)  # agents' long-polls must not hold a shutdown
    srv = _Server(config, on_shutdown=app.end_long_polls)

    async def main():
        serving = asyncio.create_task(srv.serve())
        while not srv.started and not serving.done():
            await asyncio.sleep(0.02)
        if srv.started:
            bound = srv.servers[0].sockets[0].getsockname()[1]
            if capacity is not None:  # hosts it launches join through loopback unless told otherwise
                capacity.server_url = capacity.server_url or f"http://127.0.0.1:{bound}"
            if on_ready:
                on_ready(bound)
        await serving

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:  # uvloop where installed
        runner.run(main())


def server(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0 picks a free one).")] = DEFAULT_PORT,
    db: Annotated[Optional[str], typer.Option(help="Database URL, e.g. postgresql+psycopg://u@host/db. "
                                                   "Default: SQLite in the data dir.", envvar="SHOAL_DB")] = None,
    data_dir: Annotated[Path, typer.Option(help="Where the SQLite store and credentials live.",
                                           envvar="SHOAL_DATA_DIR")] = Path(".shoal"),
    region: Annotated[str, typer.Option(envvar="SHOAL_REGION")] = "local",
    account: Annotated[str, typer.Option(envvar="SHOAL_ACCOUNT")] = "000000000000",
    insecure_no_auth: Annotated[bool, typer.Option("--insecure-no-auth",
                                                   help="Accept unsigned requests. Development only.")] = False,
    join_token: Annotated[Optional[str], typer.Option(help="The secret agents register with. Default: kept in "
                                                          "<data-dir>/join-token.", envvar="SHOAL_JOIN_TOKEN")] = None,
    webhook_secret: Annotated[Optional[str], typer.Option(help="Signs webhook deliveries. Default: kept in "
                                                              "<data-dir>/webhook-secret; replicas sharing a "
                                                              "database need the same one.",
                                                          envvar="SHOAL_WEBHOOK_SECRET")] = None,
    provisioner: Annotated[str, typer.Option(help="How managed capacity providers get hosts: local (agent "
                                                  "processes on this machine) or command.")] = "local",
    provisioner_launch: Annotated[Optional[str], typer.Option(help="command provisioner: launch executable "
                                                                   "(JSON on stdin and stdout).")] = None,
    provisioner_terminate: Annotated[Optional[str], typer.Option(help="command provisioner: terminate "
                                                                      "executable.")] = None,
    provisioner_list: Annotated[Optional[str], typer.Option(help="command provisioner: list executable.")] = None,
    advertise_url: Annotated[Optional[str], typer.Option(help="The URL launched hosts join (default: "
                                                              "http://127.0.0.1:<port>).")] = None,
    scale_in_after: Annotated[float, typer.Option(help="Seconds a managed host sits idle before it is "
                                                       "retired.")] = 300.0,
    agent_timeout: Annotated[float, typer.Option(help="Seconds without a poll before a host's agent counts as "
                                                      "disconnected (agents poll at least every 20 s).",
                                                 envvar="SHOAL_AGENT_TIMEOUT")] = 30.0,
    service_healthy_after: Annotated[float, typer.Option(help="Seconds a service task without health checks must "
                                                              "run before it counts as healthy (ECS waits 40).",
                                                         envvar="SHOAL_SERVICE_HEALTHY_AFTER")] = 40.0,
    action_log_file: Annotated[Optional[Path], typer.Option(help="Also append every action-log entry to this "
                                                                 "file, one JSON line each, once committed.",
                                                            envvar="SHOAL_ACTION_LOG_FILE")] = None,
    daemon_start_timeout: Annotated[float, typer.Option(help="Seconds a critical daemon may take to run on a new "
                                                             "host before the host is given up on.",
                                                        envvar="SHOAL_DAEMON_START_TIMEOUT")] = 300.0,
    mps_max_clients: Annotated[int, typer.Option(min=1, max=48, help="MPS clients (containers) placed per GPU at "
                                                                     "most (the MPS server's limit is 48).",
                                                 envvar="SHOAL_MPS_MAX_CLIENTS")] = 48,
) -> None:
    """Run the control plane (ECS JSON API, events, REST extras)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per webhook delivery, URL included
    if action_log_file is not None:  # an unwritable path fails here, not at the first entry
        try:
            action_log_file.parent.mkdir(parents=True, exist_ok=True)
            action_log_file.open("a").close()
        except OSError as err:
            raise typer.BadParameter(f"cannot append to {action_log_file}: {err.strerror or err}",
                                     param_hint="--action-log-file") from None
    key_id, secret = load_or_create_credentials(data_dir)
    settings = Settings(data_dir=data_dir, db_url=db, region=region, account=account,
                        auth=not insecure_no_auth, credentials={key_id: secret},
                        join_token=join_token or load_or_create_join_token(data_dir),
                        webhook_secret=webhook_secret or load_or_create_secret(data_dir, "webhook-secret"),
                        agent_timeout=agent_timeout, service_healthy_after=service_healthy_after,
                        action_log_file=action_log_file, daemon_start_timeout=daemon_start_timeout,
                        mps_max_clients=mps_max_clients)
    capacity = capacity_controller(settings, provisioner, provisioner_launch, provisioner_terminate,
                                   provisioner_list, scale_in_after)
    capacity.server_url = advertise_url
    _serve(settings, host, port,
           lambda bound: print(f"shoal server listening on http://{host}:{bound}", flush=True), capacity)
