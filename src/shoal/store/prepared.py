"""Prepared statements for the hot paths: compiled once per dialect, run on the DBAPI cursor.

On these machines SQLAlchemy's `Connection.execute` costs about 100 µs per statement on top of
the database's own work (parameter processing, result metadata, events), and RunTask runs six
such statements. A `Prepared` statement is still written with SQLAlchemy Core, so it is the
same SQL on SQLite and PostgreSQL; it is compiled once per dialect and executed directly on the
connection's DBAPI cursor, inside the transaction that the SQLAlchemy connection has begun.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.sql import Executable


class Prepared:
    def __init__(self, statement: Executable):
        self.statement = statement
        self._compiled: dict[tuple, tuple[str, tuple[str, ...] | None, dict]] = {}
        self._row_type: Any = None

    def _compile(self, conn: Connection, keys: tuple[str, ...]):
        cache_key = (conn.dialect.name, keys)
        found = self._compiled.get(cache_key)
        if found is None:
            compiled = self.statement.compile(dialect=conn.dialect, column_keys=list(keys))
            positions = tuple(compiled.positiontup) if compiled.positiontup else None
            # Values written into the statement itself ("ACTIVE", LIMIT 1) are bind parameters too.
            given = dict.fromkeys(keys)
            literals = {k: v for k, v in compiled.construct_params(given).items() if k not in given}
            found = self._compiled[cache_key] = (compiled.string, positions, literals)
        return found

    def _cursor(self, conn: Connection, params: dict):
        sql, positions, literals = self._compile(conn, tuple(sorted(params)))
        if literals:
            params = {**literals, **params}
        args = tuple(params[name] for name in positions) if positions else params
        cursor = conn.connection.dbapi_connection.cursor()
        cursor.execute(sql, args)
        return cursor

    def run(self, conn: Connection, params: dict) -> int:
        """Execute; return the number of rows affected."""
        cursor = self._cursor(conn, params)
        try:
            return cursor.rowcount
        finally:
            cursor.close()

    def run_many(self, conn: Connection, rows: list[dict]) -> int:
        """Execute once per parameter set (the DBAPI's executemany); every set has the same keys.
        Return the number of rows affected, all sets together."""
        if not rows:
            return 0
        sql, positions, literals = self._compile(conn, tuple(sorted(rows[0])))
        args = [tuple({**literals, **row}[name] for name in positions) if positions else {**literals, **row}
                for row in rows]
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            cursor.executemany(sql, args)
            return cursor.rowcount
        finally:
            cursor.close()

    def tuples(self, conn: Connection, params: dict) -> list[tuple]:
        """The rows as the driver returns them (for many rows of few columns)."""
        cursor = self._cursor(conn, params)
        try:
            return cursor.fetchall()
        finally:
            cursor.close()

    def all(self, conn: Connection, params: dict) -> list:
        cursor = self._cursor(conn, params)
        try:
            rows = cursor.fetchall()
            if rows and self._row_type is None:
                self._row_type = namedtuple("Row", [d[0] for d in cursor.description])
        finally:
            cursor.close()
        return [self._row_type(*row) for row in rows]

    def first(self, conn: Connection, params: dict):
        rows = self.all(conn, params)
        return rows[0] if rows else None
