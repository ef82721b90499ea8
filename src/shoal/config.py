"""Server settings. The CLI fills them from flags, then the environment (`SHOAL_*`), then
defaults; a config file comes when there is something that needs one."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Settings:
    data_dir: Path = Path(".shoal")
    db_url: str | None = None
    region: str = "local"
    account: str = "000000000000"
    auth: bool = True
    credentials: dict[str, str] = field(default_factory=dict)  # access key id -> secret
    join_token: str = ""  # what an agent shows to register its host (then it gets its own credential)
    webhook_secret: str = ""  # signs webhook deliveries (X-Shoal-Signature); <data-dir>/webhook-secret
    agent_timeout: float = 30.0  # seconds without a poll before a host's agent counts as disconnected
    service_healthy_after: float = 40.0  # seconds a service task without health checks runs before it is healthy
    action_log_file: Path | None = None  # also append each committed action-log entry here (JSONL)
    daemon_start_timeout: float = 300.0  # how long a critical daemon may take to start on a new host
    mps_max_clients: int = 48  # MPS clients (containers) per GPU, as the MPS server allows by default

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{(self.data_dir / 'shoal.db').resolve()}"



def load_credentials(data_dir: Path) -> tuple[str, str] | None:
    path = data_dir / "credentials.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return data["accessKeyId"], data["secretAccessKey"]


def load_or_create_credentials(data_dir: Path) -> tuple[str, str]:
    """The local access key pair, kept in the data dir so that restarts keep it."""
    found = load_credentials(data_dir)
    if found:
        return found
    data_dir.mkdir(parents=True, exist_ok=True)
    key_id = "SHOAL" + secrets.token_hex(8).upper()
    secret = secrets.token_urlsafe(30)
    tmp = data_dir / f"credentials.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"accessKeyId": key_id, "secretAccessKey": secret}))
    try:
        os.link(tmp, data_dir / "credentials.json")  # first writer wins if two start at once
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return load_credentials(data_dir)


def load_or_create_secret(data_dir: Path, name: str) -> str:
    """A secret kept in `<data-dir>/<name>` (mode 0600) across restarts: the join token agents
    register with, the key that signs webhook deliveries."""
    path = data_dir / name
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = data_dir / f"{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24))
        try:
            os.link(tmp, path)  # first writer wins if two start at once
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


def load_or_create_join_token(data_dir: Path) -> str:
    return load_or_create_secret(data_dir, "join-token")
