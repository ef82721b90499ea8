"""`shoal server` and `shoal up`."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
import uvicorn

from shoal.config import Settings, load_or_create_credentials, load_or_create_join_token

DEFAULT_PORT = 8642


def _serve(settings: Settings, host: str, port: int, on_ready=None) -> None:
    from shoal.api.app import create_app

    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler
    # that was installed before it; make that a clean exit rather than death by signal.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    app = create_app(settings)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            loop="auto", http="auto", lifespan="on")
    srv = uvicorn.Server(config)

    async def main():
        serving = asyncio.create_task(srv.serve())
        while not srv.started and not serving.done():
            await asyncio.sleep(0.02)
        if srv.started and on_ready:
            bound = srv.servers[0].sockets[0].getsockname()[1]
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
) -> None:
    """Run the control plane (ECS JSON API, events, REST extras)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    key_id, secret = load_or_create_credentials(data_dir)
    settings = Settings(data_dir=data_dir, db_url=db, region=region, account=account,
                        auth=not insecure_no_auth, credentials={key_id: secret},
                        join_token=join_token or load_or_create_join_token(data_dir))
    _serve(settings, host, port,
           lambda bound: print(f"shoal server listening on http://{host}:{bound}", flush=True))


def up(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = DEFAULT_PORT,
    data_dir: Annotated[Path, typer.Option(help="Where the store and credentials live.",
                                           envvar="SHOAL_DATA_DIR")] = Path(".shoal"),
) -> None:
    """Run shoal on this machine: the control plane on SQLite under ./.shoal/."""
    key_id, secret = load_or_create_credentials(data_dir)
    settings = Settings(data_dir=data_dir, credentials={key_id: secret})

    def ready(bound: int) -> None:
        print(f"export SHOAL_ENDPOINT=http://127.0.0.1:{bound}\n"
              f"export AWS_ACCESS_KEY_ID={key_id}\n"
              f"export AWS_SECRET_ACCESS_KEY={secret}\n"
              f"export AWS_DEFAULT_REGION=local\n"
              f'# try: aws ecs --endpoint-url "$SHOAL_ENDPOINT" list-clusters\n'
              f"# events: shoal events list   (store: {settings.database_url}; Ctrl-C stops)", flush=True)

    try:
        _serve(settings, "127.0.0.1", port, ready)
    except KeyboardInterrupt:  # uvicorn has already shut down gracefully
        pass
