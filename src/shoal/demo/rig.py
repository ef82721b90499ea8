"""A local rig for the demo and the recovery benchmarks (benchmarks/repair.py, mps_recovery.py):
a real `shoal server` (SQLite, local provisioner) in a data dir of its own, the operator's
self-managed host (a `shoal agent --simulate` launched the same way the provisioner launches
managed ones), and the clients a user would hold: boto3 for the ECS API, signed REST calls for
events, the action log and chaos orders.

Every process it starts is ended by `stop()`: the server, each host's agent, its workloads and
its MPS daemons (the local provisioner's terminate: the machine vanishes).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from shoal.providers.base import LaunchRequest
from shoal.providers.local import LocalProvisioner

REGION = "local"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class Rig:
    def __init__(self, data_dir: Path, probe_interval: float | None = None):
        self.data_dir = Path(data_dir).resolve()
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server_dir = server_dir = self.data_dir / "server"  # its hosts: server_dir / "hosts" / <id>
        # Every agent (the provisioner's and the operator's) inherits the probe interval.
        env = dict(os.environ)
        if probe_interval is not None:
            env["SHOAL_MPS_PROBE_INTERVAL"] = f"{probe_interval:g}"
        self.server = subprocess.Popen(
            [sys.executable, "-m", "shoal", "server", "--port", str(self.port), "--data-dir", str(server_dir),
             "--service-healthy-after", "1", "--scale-in-after", "3600"],
            env=env, stdin=subprocess.DEVNULL, stdout=open(self.data_dir / "server.log", "ab"),
            stderr=subprocess.STDOUT, start_new_session=True)
        self._env = env
        self.provisioners = [LocalProvisioner(server_dir / "hosts")]
        wait_for(self._ready, 60, "the server to answer")
        creds = json.loads((server_dir / "credentials.json").read_text())
        self.key_id, self.secret = creds["accessKeyId"], creds["secretAccessKey"]
        self.join_token = (server_dir / "join-token").read_text().strip()
        import boto3
        from botocore.config import Config

        self.ecs = boto3.client("ecs", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=self.key_id,
                                aws_secret_access_key=self.secret, config=Config(retries={"max_attempts": 1}))
        self._cursor: str | None = None

    def _ready(self) -> bool:
        if self.server.poll() is not None:
            raise RuntimeError(f"the server exited: {(self.data_dir / 'server.log').read_text()[-2000:]}")
        try:
            return httpx.get(self.endpoint + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    # -- signed REST calls, as the CLI makes them --------------------------------------------------
    def call(self, method: str, path: str, params: dict | None = None, body: dict | None = None) -> dict:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        url = str(httpx.URL(self.endpoint + path, params=params or {}))
        data = json.dumps(body).encode() if body is not None else b""
        request = AWSRequest(method=method, url=url, data=data,
                             headers={"Content-Type": "application/json"} if body is not None else {})
        SigV4Auth(Credentials(self.key_id, self.secret), "ecs", REGION).add_auth(request)
        resp = httpx.request(method, url, content=data, headers=dict(request.headers.items()), timeout=30)
        if resp.status_code != 200:
            raise RuntimeError(f"{method} {path}: {resp.status_code} {resp.text[:500]}")
        return resp.json()

    def events(self) -> list[dict]:
        """The events committed since the last call (the whole log on the first)."""
        found = []
        while True:
            page = self.call("GET", "/v1/events", {"limit": 1000, **({"after": self._cursor} if self._cursor else {})})
            if not page["events"]:
                return found
            found += page["events"]
            self._cursor = page["cursor"]

    def actions(self, cluster: str) -> list[dict]:
        found, after = [], None
        while True:
            page = self.call("GET", "/v1/action-logs", {"cluster": cluster, "limit": 1000,
                                                        **({"after": after} if after else {})})
            found += page["entries"]
            if not page.get("next"):
                return found
            after = page["next"]

    def chaos(self, **order) -> dict:
        """A chaos order, waited for until the host's agent has carried it out."""
        placed = self.call("POST", "/v1/chaos", body=order)["order"]
        done = wait_for(lambda: (lambda o: o if o["status"] != "PENDING" else None)(
            self.call("GET", f"/v1/chaos/{placed['orderId']}")["order"]), 30, "the agent to apply the fault", 0.1)
        if done["status"] != "DONE":
            raise RuntimeError(f"chaos order failed: {done['result']}")
        return done

    # -- hosts -------------------------------------------------------------------------------------
    def operator_host(self, instance_type: str, cluster: str, provider: str) -> str:
        """A self-managed host: the operator starts its agent; shoal never launches or replaces it."""
        provisioner = LocalProvisioner(self.data_dir / "operator", env=self._env)
        self.provisioners.append(provisioner)
        [host] = provisioner.launch(LaunchRequest(instance_type, 1, cluster, provider, self.endpoint, self.join_token))
        return host.host_id

    def stop(self) -> None:
        self.server.terminate()
        try:
            self.server.wait(20)
        except subprocess.TimeoutExpired:
            self.server.kill()
        for provisioner in self.provisioners:
            for host in provisioner.list():
                provisioner.terminate(host.host_id)
