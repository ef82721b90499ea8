"""A small signed HTTP client for the CLI's calls to a running server."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
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


def get(path: str, params: dict) -> httpx.Response:
    url = str(httpx.URL(endpoint() + path, params={k: v for k, v in params.items() if v is not None}))
    request = AWSRequest(method="GET", url=url)
    SigV4Auth(_credentials(), "ecs", os.environ.get("AWS_DEFAULT_REGION", "local")).add_auth(request)
    return httpx.get(url, headers=dict(request.headers.items()), timeout=30)
