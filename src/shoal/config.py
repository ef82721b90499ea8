"""Server settings: flags > environment (`SHOAL_*`) > defaults."""

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

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{(self.data_dir / 'shoal.db').resolve()}"

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        env = os.environ
        s = cls(
            data_dir=Path(env.get("SHOAL_DATA_DIR", ".shoal")),
            db_url=env.get("SHOAL_DB") or None,
            region=env.get("SHOAL_REGION", "local"),
            account=env.get("SHOAL_ACCOUNT", "000000000000"),
        )
        for key, value in overrides.items():
            if value is not None:
                setattr(s, key, value)
        return s


def load_or_create_credentials(data_dir: Path) -> tuple[str, str]:
    """The local access key pair, kept in the data dir so that restarts keep it."""
    path = data_dir / "credentials.json"
    if path.exists():
        data = json.loads(path.read_text())
        return data["accessKeyId"], data["secretAccessKey"]
    data_dir.mkdir(parents=True, exist_ok=True)
    key_id = "SHOAL" + secrets.token_hex(8).upper()
    secret = secrets.token_urlsafe(30)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"accessKeyId": key_id, "secretAccessKey": secret}))
    tmp.chmod(0o600)
    tmp.replace(path)
    return key_id, secret
