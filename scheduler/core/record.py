"""The only module that runs SQL: migrations and the named queries of sql/queries.sql."""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from typing import TYPE_CHECKING, Any

import asyncpg

from fencepost.core.errors import DatabaseUnavailable, FencepostError
from fencepost.core.resources import resource_dir

if TYPE_CHECKING:
    from fencepost.core.models import JobSpec

__all__ = ["Database", "query", "migrations", "upgrade", "store_definitions"]

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.M)
_MIGRATION_LOCK = 0x46454E43  # "FENC": one upgrade at a time across replicas


@cache
def _queries() -> dict[str, str]:
    """Named queries from sql/queries*.sql (one file per area: core, control, reconciler...)."""
    out: dict[str, str] = {}
    for path in sorted(resource_dir("sql").glob("queries*.sql")):
        parts = _NAME.split(path.read_text())
        for i in range(1, len(parts), 2):
            if parts[i] in out:
                raise RuntimeError(f"query {parts[i]!r} is defined twice (second in {path.name})")
            out[parts[i]] = parts[i + 1].strip()
    return out


def query(name: str) -> str:
    return _queries()[name]


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every numbered file in sql/, in order."""
    out = []
    for path in sorted(resource_dir("sql").glob("[0-9][0-9][0-9]_*.sql")):
        out.append((int(path.name[:3]), path.stem, path.read_text()))
    return out


async def upgrade(conn: asyncpg.Connection) -> list[str]:
    """Apply pending migrations; safe when replicas run it at once (advisory lock)."""
    applied: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS fencepost_migrations (version integer PRIMARY KEY, "
            "name text NOT NULL, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"]: r["checksum"] for r in await conn.fetch("SELECT version, checksum FROM fencepost_migrations")}
        for version, name, sql in migrations():
            checksum = hashlib.sha256(sql.encode()).hexdigest()
            if version in done:
                if done[version] != checksum:
                    raise MigrationError(f"migration {name} changed after it was applied (checksum differs); "
                                         "this database was made by another version of Fencepost")
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO fencepost_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    version, name, checksum,
                )
            applied.append(name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
    return applied


_UNAVAILABLE = (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
                asyncpg.exceptions.OperatorInterventionError, asyncpg.exceptions.InternalClientError)
"""Connection lost, server shutting down or restarting (pg_terminate_backend, failover); the
last one is asyncpg's protocol state left behind by a connection killed mid-statement."""


class MigrationError(FencepostError):
    """The database's recorded migrations do not match the ones this version ships."""


class Database:
    """A small asyncpg pool wrapper; connection errors become DatabaseUnavailable."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.url = url
        self._min, self._max = min_size, max_size
        self.pool: asyncpg.Pool | None = None

    async def connect(self) -> "Database":
        if self.pool is None:
            try:
                self.pool = await asyncpg.create_pool(self.url, min_size=self._min, max_size=self._max)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                raise DatabaseUnavailable(f"postgresql unreachable at {_redact(self.url)}: {exc}") from exc
        return self

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    def _p(self) -> asyncpg.Pool:
        if self.pool is None:
            raise DatabaseUnavailable("database not connected")
        return self.pool

    async def fetch(self, name: str, *args: Any, conn: asyncpg.Connection | None = None) -> list[asyncpg.Record]:
        try:
            return await (conn or self._p()).fetch(query(name), *args)
        except asyncpg.UndefinedTableError as exc:
            raise DatabaseUnavailable(f"the Fencepost schema is missing ({exc}); run `fencepost db upgrade`") from exc
        except _UNAVAILABLE as exc:
            raise DatabaseUnavailable(f"postgresql: {exc}") from exc

    async def fetchrow(self, name: str, *args: Any, conn: asyncpg.Connection | None = None) -> asyncpg.Record | None:
        rows = await self.fetch(name, *args, conn=conn)
        return rows[0] if rows else None

    async def execute(self, name: str, *args: Any, conn: asyncpg.Connection | None = None) -> str:
        try:
            return await (conn or self._p()).execute(query(name), *args)
        except asyncpg.UndefinedTableError as exc:
            raise DatabaseUnavailable(f"the Fencepost schema is missing ({exc}); run `fencepost db upgrade`") from exc
        except _UNAVAILABLE as exc:
            raise DatabaseUnavailable(f"postgresql: {exc}") from exc

    async def upgrade(self) -> list[str]:
        async with self._p().acquire() as conn:
            return await upgrade(conn)


def _redact(url: str) -> str:
    return re.sub(r"://([^:@/]+):[^@/]*@", r"://\1:***@", url)


async def store_definitions(db: Database, specs: list[JobSpec]) -> None:
    """Upsert handler declarations (workers do it at start, so producers can validate)."""
    cols = [[getattr(s, f) for s in specs] for f in
            ("name", "model", "queue", "priority", "timeout_s", "max_retries", "version", "resumable", "owner")]
    await db.execute("upsert_definitions", *cols, [json.dumps(s.options()) for s in specs])
