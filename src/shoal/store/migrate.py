"""Run the Alembic migrations shipped inside the package."""

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

_MIGRATIONS = Path(__file__).parent / "migrations"
_PG_LOCK = 0x5A0A1  # advisory lock id: replicas starting together migrate one at a time


def upgrade(engine: Engine) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK})
        try:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
        except Exception:
            conn.rollback()  # so that the unlock below can run and the real error surfaces
            raise
        finally:
            if engine.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK})
                conn.commit()
