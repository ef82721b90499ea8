"""A small signed HTTP client for the CLI's calls to a running server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import typer
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shoal.cli.server import DEFAULT_PORT
from shoal.config import load_credentials


def endpoint() -> str:
    return os.environ.get("SHOAL_ENDPOINT", f"http://127.0.0.1:{DEFAULT_PORT}").rstrip("/")


def _credentials() -> Credentials:
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not (key and secret):
        data_dir = Path(os.environ.get("SHOAL_DATA_DIR", ".shoal"))
        found = load_credentials(data_dir)
        if found is None:
            raise SystemExit(f"no credentials: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (printed by "
                             f"`shoal up`) or SHOAL_DATA_DIR (none in {data_dir}/credentials.json)")
        key, secret = found
    return Credentials(key, secret)


def _region() -> str:
    return os.environ.get("AWS_DEFAULT_REGION", "local")


def send(method: str, path: str, params: dict | None = None, body: dict | None = None) -> httpx.Response:
    """A SigV4-signed request to one of the server's REST extras (a JSON body, if given)."""
    url = str(httpx.URL(endpoint() + path, params={k: v for k, v in (params or {}).items() if v is not None}))
    data = json.dumps(body).encode() if body is not None else b""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    request = AWSRequest(method=method, url=url, data=data, headers=headers)
    SigV4Auth(_credentials(), "ecs", _region()).add_auth(request)
    return httpx.request(method, url, content=data or None, headers=dict(request.headers.items()), timeout=30)


def get(path: str, params: dict) -> httpx.Response:
    return send("GET", path, params)


def post(path: str, body: dict, params: dict | None = None) -> httpx.Response:
    return send("POST", path, params, body)


def fail(message: str, code: int = 1):
    """Print `error: <message>` and exit with `code` (1: the server said no or is unreachable)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def call(method: str, path: str, params: dict | None = None, body: dict | None = None) -> dict:
    """The JSON answer of a REST extra; an error response or an unreachable server exits 1."""
    try:
        resp = send(method, path, params, body)
    except httpx.HTTPError as err:
        fail(f"cannot reach shoal at {endpoint()}: {err}")
    if resp.status_code != 200:
        fail(error_of(resp))
    return resp.json()


def error_of(resp: httpx.Response) -> str:
    """`<Code>: <message>` of a REST error response, whatever its body."""
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    return f"{body.get('__type', resp.status_code)}: {body.get('message', resp.text.strip())}"


def aws(service: str):
    """A boto3 client for one of the server's AWS APIs (`ecs`, `events`): endpoint from
    SHOAL_ENDPOINT, region from AWS_DEFAULT_REGION (default `local`), credentials as for `get`."""
    import boto3
    from botocore.config import Config

    creds = _credentials()
    return boto3.client(service, endpoint_url=endpoint(), region_name=_region(),
                        aws_access_key_id=creds.access_key, aws_secret_access_key=creds.secret_key,
                        config=Config(retries={"max_attempts": 2, "mode": "standard"}))
