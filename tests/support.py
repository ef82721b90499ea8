"""Test helpers: a real `shoal server` process, databases for it, and waiting on conditions.

PostgreSQL comes from SHOAL_TEST_POSTGRES_URL (an admin URL; .ci/run starts a throwaway server
and sets it); each server gets a fresh database of its own.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

POSTGRES_URL = os.environ.get("SHOAL_TEST_POSTGRES_URL")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def fresh_postgres_database() -> str:
    admin = make_url(POSTGRES_URL)
    name = "shoal_" + uuid.uuid4().hex[:12]
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return admin.set(database=name).render_as_string(hide_password=False)


class ServerProcess:
    """`shoal server` as a child process."""

    def __init__(self, data_dir: Path, db_url: str | None = None, extra_args: tuple[str, ...] = ()):
        self.data_dir = data_dir
        self.db_url = db_url
        self.extra_args = extra_args
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def database_url(self) -> str:
        """The server's own database (tests that write what only a reconciler would)."""
        return self.db_url or f"sqlite:///{self.data_dir / 'shoal.db'}"

    @property
    def credentials(self) -> dict:
        return json.loads((self.data_dir / "credentials.json").read_text())

    def start(self) -> "ServerProcess":
        cmd = [sys.executable, "-m", "shoal.cli.main", "server", "--port", str(self.port),
               "--data-dir", str(self.data_dir), *self.extra_args]
        if self.db_url:
            cmd += ["--db", self.db_url]
        self.log = open(self.data_dir.parent / f"server-{self.port}.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self._healthy, timeout=30, message=f"server on {self.endpoint}")
        return self

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited with {self.proc.returncode}; see {self.log.name}")
        try:
            return httpx.get(self.endpoint + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """kill -9: no shutdown hooks, no flushing."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self, service: str = "ecs", validate: bool = True, **config):
        creds = self.credentials
        return boto3.client(
            service, endpoint_url=self.endpoint, region_name="local",
            aws_access_key_id=creds["accessKeyId"], aws_secret_access_key=creds["secretAccessKey"],
            config=Config(parameter_validation=validate, retries={"max_attempts": 1}, **config),
        )

    def get(self, path: str, params: dict) -> httpx.Response:
        """A SigV4-signed GET, as the CLI sends it."""
        url = str(httpx.URL(self.endpoint + path, params={k: v for k, v in params.items() if v is not None}))
        request = AWSRequest(method="GET", url=url)
        creds = Credentials(self.credentials["accessKeyId"], self.credentials["secretAccessKey"])
        SigV4Auth(creds, "ecs", "local").add_auth(request)
        return httpx.get(url, headers=dict(request.headers.items()), timeout=30)

    def events_page(self, after: str | None = None, limit: int = 1000) -> dict:
        resp = self.get("/v1/events", {"after": after, "limit": limit})
        assert resp.status_code == 200, resp.text
        return resp.json()

    def events(self, after: str | None = None) -> list[dict]:
        """The whole event log, oldest first."""
        found, cursor = [], after
        while True:
            page = self.events_page(cursor)
            if not page["events"]:
                return found
            found += page["events"]
            cursor = page["cursor"]


def database_url_for(backend: str) -> str | None:
    return fresh_postgres_database() if backend == "postgres" else None



def kill_workloads(root: Path) -> None:
    """Kill every shim, workload and MPS control daemon started under `root` (agents' data dirs):
    test cleanup, since they outlive their agents by design."""
    for pid_file in [*root.rglob("shim.pid"), *root.rglob("pid"), *root.rglob("nvidia-cuda-mps-control.pid")]:
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            continue
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def shoal_cli(server: ServerProcess, home: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess:
    """`shoal <args>` as a user runs it against `server` (endpoint and credentials in the
    environment, nothing else); asserts its exit code."""
    creds = server.credentials
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "HOME": str(home),
           "AWS_ACCESS_KEY_ID": creds["accessKeyId"], "AWS_SECRET_ACCESS_KEY": creds["secretAccessKey"],
           "AWS_DEFAULT_REGION": "local", "SHOAL_ENDPOINT": server.endpoint}
    proc = subprocess.run([sys.executable, "-m", "shoal", *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, f"shoal {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc
