"""The record store: the only module that runs SQL.

Every statement is a named query of sql/queries*.sql (`-- name: x`); callers pass the name
and parameters, never SQL. Connection loss becomes DatabaseUnavailable in one place
(`_unavailable`), for pool calls, sessions, transactions and COPY alike; `rows` / `row`
return each query's row Struct (`row_type`, made from its `-- returns:` header); a refusal by
PostgreSQL (constraint, bad data) passes through as asyncpg raised it (see REFUSED).
Migrations and their DDL are the one exception: they run here, from the numbered files.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import asyncpg
import msgspec

from fencepost.core.errors import DatabaseUnavailable, FencepostError
from fencepost.core.resources import resource_dir

if TYPE_CHECKING:
    from fencepost.core.models import JobSpec

__all__ = [
    "REFUSED",
    "Column",
    "Conn",
    "Database",
    "DriverConnection",
    "Listener",
    "MigrationError",
    "Prepared",
    "QuerySpec",
    "Session",
    "describe_queries",
    "migrations",
    "prepare_all",
    "psql_script",
    "pyformat",
    "query_names",
    "query_specs",
    "store_definitions",
    "upgrade",
]

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION_LOCK = 0x46454E43  # "FENC": one upgrade at a time across replicas


@cache
def _queries() -> dict[str, str]:
    """Named queries from sql/queries*.sql (one file per noun: runs, history, queues, schedules, tokens...)."""
    out: dict[str, str] = {}
    for path in sorted(resource_dir("sql").glob("queries*.sql")):
        parts = _NAME.split(path.read_text())
        for i in range(1, len(parts), 2):
            if parts[i] in out:
                raise RuntimeError(f"query {parts[i]!r} is defined twice (second in {path.name})")
            out[parts[i]] = parts[i + 1].strip()
    return out


def query(name: str) -> str:
    """The text of a named query (KeyError for an unknown name; a test checks every name used)."""
    return _queries()[name]


class Column(msgspec.Struct, frozen=True):
    """One parameter or result column of a named query: its name and PostgreSQL type (`int8[]`...)."""

    name: str
    type: str


class QuerySpec(msgspec.Struct, frozen=True):
    """A named query's declared calling convention, read from its header in sql/queries*.sql:

        -- name: run_events
        -- params: run_id int8
        -- returns: id int8, run_id int8, type text, ...

    `returns` is empty for a statement that returns no rows (`-- returns: nothing`); `checked` is
    False for a query PostgreSQL cannot prepare on its own (`-- unchecked: why`, e.g. a psql script
    or a statement on a session's temporary table). tests/test_sql_contracts.py prepares every
    checked query on a migrated database and compares what PostgreSQL reports with the header,
    so a layout lives in the SQL file and cannot drift from it."""

    name: str
    params: tuple[Column, ...]
    returns: tuple[Column, ...]
    checked: bool = True
    why: str = ""


_HEADER = re.compile(r"^-- (params|returns|unchecked):[ ]?(.*)$")


def _columns(text: str) -> tuple[Column, ...]:
    text = text.strip()
    if text in ("", "none", "nothing"):
        return ()
    out = []
    for part in filter(str.strip, text.split(",")):
        name, _, type_ = part.strip().partition(" ")
        out.append(Column(name=name, type=type_.strip()))
    return tuple(out)


@cache
def query_specs() -> dict[str, QuerySpec | None]:
    """Each named query's declared header (None for a query without one)."""
    out: dict[str, QuerySpec | None] = {}
    for name, text in _queries().items():
        fields: dict[str, list[str]] = {}
        for line in text.splitlines():
            m = _HEADER.match(line)
            if m is None:
                break  # the header is the lines right after `-- name:`; continuation lines repeat the key
            fields.setdefault(m.group(1), []).append(m.group(2))
        if "params" not in fields and "unchecked" not in fields:
            out[name] = None
            continue
        out[name] = QuerySpec(
            name=name, params=_columns(", ".join(p for p in fields.get("params", []) if p.strip())),
            returns=_columns(", ".join(r for r in fields.get("returns", []) if r.strip())),
            checked="unchecked" not in fields, why=" ".join(fields.get("unchecked", [])))
    return out


_PG_TYPES: dict[str, Any] = {
    "int8": int, "int4": int, "int2": int, "text": str, "bool": bool, "float8": float, "timestamptz": datetime,
    "jsonb": Any, "bytea": bytes, "uuid": uuid.UUID, "numeric": Decimal, "void": None,
}
"""Python types of the PostgreSQL types a `-- returns:` header names (another type reads as Any)."""


def _py_type(pg: str) -> Any:
    if pg.endswith("[]"):
        return list[_optional(_py_type(pg[:-2]))]  # type: ignore[misc]  # an array may hold NULLs
    return _PG_TYPES.get(pg, Any)


def _optional(t: Any) -> Any:
    return None if t is None else Any if t is Any else t | None


def _struct_name(name: str) -> str:
    return "".join(part.title() for part in name.split("_")) + "Row"


@cache
def row_type(name: str) -> type[msgspec.Struct]:
    """The row Struct of a named query, made once from its `-- returns:` header: frozen, kw_only,
    one field per column in header order, named as the column, every field `T | None` (a header
    does not say NOT NULL). array_like, so a Record decodes positionally (`msgspec.convert` of its
    values, no dict per row): tests/test_sql_contracts.py proves PostgreSQL returns the header's
    columns in the header's order. A row is for reading: map it to an API schema to send it.
    KeyError for a query without a header or without result columns, or whose column names are
    not Python identifiers (`?column?`)."""
    spec = query_specs().get(name)
    if spec is None or not spec.returns:
        raise KeyError(f"query {name!r} declares no result columns (-- returns:)")
    bad = [c.name for c in spec.returns if not c.name.isidentifier() or keyword.iskeyword(c.name)
           or c.name.startswith("_")]
    if bad:
        raise KeyError(f"query {name!r} returns columns that are not field names: {bad}")
    fields = [(c.name, _optional(_py_type(c.type))) for c in spec.returns]
    return msgspec.defstruct(_struct_name(name), fields, frozen=True, kw_only=True, array_like=True,
                             module=__name__)


def _typed(name: str, records: list[asyncpg.Record]) -> list[Any]:
    cls = row_type(name)
    return [msgspec.convert(tuple(r.values()), cls) for r in records]


def query_names() -> frozenset[str]:
    return frozenset(_queries())


def psql_script(name: str) -> str:
    """A named query run by psql rather than asyncpg: the embedded server's bootstrap creates
    the database before any pool can connect to it (psql variables, `\\gexec`)."""
    return query(name) + "\n"


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


class Prepared(msgspec.Struct, frozen=True):
    """What PostgreSQL reports for one query: parameter types and result columns, or why it could not."""

    name: str
    param_types: tuple[str, ...] = ()
    returns: tuple[Column, ...] = ()
    error: str = ""
    source: str = ""


def _type(t: asyncpg.types.Type) -> str:
    name = str(t.name)
    if t.kind == "array" and name.startswith("_"):
        return name[1:] + "[]"
    return name


SETUP = ("chaos_create_ledger",)
"""Queries run before the check: the tables they create (the soak's ledger) are read by others."""


async def prepare_all(conn: asyncpg.Connection, sources: dict[str, str]) -> dict[str, Prepared]:
    """Prepare each query (in a transaction rolled back after each, so nothing is left behind)."""
    for name in SETUP:
        await conn.execute(sources[name])
    out: dict[str, Prepared] = {}
    for name, sql in sources.items():
        tr = conn.transaction()
        await tr.start()
        try:
            stmt = await conn.prepare(sql)
            out[name] = Prepared(
                name=name, param_types=tuple(_type(p) for p in stmt.get_parameters()),
                returns=tuple(Column(name=a.name, type=_type(a.type)) for a in stmt.get_attributes()), source=sql)
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            out[name] = Prepared(name=name, error=f"{type(exc).__name__}: {exc}".splitlines()[0], source=sql)
        finally:
            await tr.rollback()
    return out


async def describe_queries(url: str) -> dict[str, Prepared]:
    """Every named query as PostgreSQL prepares it on the database at URL (migrated first): what the
    headers are checked against (tests/test_sql_contracts.py, `python -m fencepost.dev.sqlheaders`)."""
    conn = await asyncpg.connect(url)
    try:
        await upgrade(conn)
        return await prepare_all(conn, dict(_queries()))
    finally:
        await conn.close()


_UNAVAILABLE = (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
                asyncpg.exceptions.OperatorInterventionError, asyncpg.exceptions.InternalClientError)
"""Connection lost, server shutting down or restarting (pg_terminate_backend, failover); the
last one is asyncpg's protocol state left behind by a connection killed mid-statement."""

_MAPPED = (asyncpg.UndefinedTableError, *_UNAVAILABLE)
"""What `_unavailable` turns into DatabaseUnavailable; every other error passes through."""

REFUSED = (asyncpg.IntegrityConstraintViolationError, asyncpg.DataError)
"""PostgreSQL refused the data (a constraint, a value it cannot hold): retrying it as it is
will not help, unlike DatabaseUnavailable. Raised as asyncpg raised them."""


def _unavailable(exc: BaseException) -> DatabaseUnavailable:
    """The one error mapping: a missing schema or a lost connection, said in one line."""
    if isinstance(exc, asyncpg.UndefinedTableError):
        return DatabaseUnavailable(f"the Fencepost schema is missing ({exc}); run `fencepost db upgrade`")
    return DatabaseUnavailable(f"postgresql: {exc}")


class MigrationError(FencepostError):
    """The database's recorded migrations do not match the ones this version ships."""


class DriverConnection(Protocol):
    """A caller's connection of another driver (psycopg 3, or the one under a SQLAlchemy or Django
    session), adapted by fencepost.outbox so named queries run inside the caller's transaction:
    asyncpg's fetch/execute shape, receiving the query as this module loaded it (see `pyformat`)."""

    async def fetch(self, sql: str, *args: Any) -> list[Any]: ...

    async def execute(self, sql: str, *args: Any) -> str: ...


_PLACEHOLDER = re.compile(r"\$(\d+)")


def pyformat(sql: str, args: Sequence[Any]) -> tuple[str, dict[str, Any]]:
    """A named query's text and arguments for a DB-API driver's pyformat style (psycopg, Django's
    cursor): `$3` becomes `%(p3)s` and a literal `%` is doubled."""
    return (_PLACEHOLDER.sub(r"%(p\1)s", sql.replace("%", "%%")),
            {f"p{i}": value for i, value in enumerate(args, start=1)})


_Target: TypeAlias = "asyncpg.Pool | asyncpg.Connection | DriverConnection"


async def _fetch(target: _Target, name: str, args: tuple[Any, ...]) -> list[asyncpg.Record]:
    try:
        rows: list[asyncpg.Record] = await target.fetch(query(name), *args)
    except _MAPPED as exc:
        raise _unavailable(exc) from exc
    return rows


async def _execute(target: _Target, name: str, args: tuple[Any, ...]) -> str:
    try:
        status: str = await target.execute(query(name), *args)
    except _MAPPED as exc:
        raise _unavailable(exc) from exc
    return status


class Session:
    """One connection: named queries on it, its transactions, COPY. Held from the pool by
    `Database.session()` / `Database.transaction()`, or adopted from a caller (`Session.of`: a
    producer's own transaction, an operator tool's connection). Session-level state (advisory
    locks, a transaction) lives on the connection, which is why some callers need one."""

    __slots__ = ("conn",)

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    @classmethod
    def of(cls, conn: Conn) -> Session:
        return conn if isinstance(conn, Session) else cls(conn)

    async def fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        return await _fetch(self.conn, name, args)

    async def fetchrow(self, name: str, *args: Any) -> asyncpg.Record | None:
        rows = await _fetch(self.conn, name, args)
        return rows[0] if rows else None

    async def rows(self, name: str, *args: Any) -> list[Any]:
        """The query's rows as its row Struct (`row_type(name)`), read by attribute."""
        return _typed(name, await _fetch(self.conn, name, args))

    async def row(self, name: str, *args: Any) -> Any:
        """The first row as the query's row Struct, or None when there is no row."""
        rows = await _fetch(self.conn, name, args)
        return _typed(name, rows[:1])[0] if rows else None

    async def fetchval(self, name: str, *args: Any) -> Any:
        """First column of the first row (None when no row)."""
        rows = await _fetch(self.conn, name, args)
        return rows[0][0] if rows else None

    async def execute(self, name: str, *args: Any) -> str:
        """Returns PostgreSQL's status line (`INSERT 0 5`)."""
        return await _execute(self.conn, name, args)

    async def copy_out(self, table: str, output: Callable[[bytes], Awaitable[None]], **options: Any) -> int:
        """COPY a table to `output` (chunks of bytes; options as asyncpg's copy_from_table:
        format, header...). Returns the rows copied."""
        try:
            status = await self.conn.copy_from_table(table, output=output, **options)
        except _MAPPED as exc:
            raise _unavailable(exc) from exc
        return int(status.rsplit(" ", 1)[-1])  # COPY <n>

    async def copy_query(self, name: str, *args: Any, output: Callable[[bytes], Awaitable[None]],
                         **options: Any) -> int:
        """COPY the rows of a named query to `output` (chunks of bytes, text format unless options say):
        a bulk read without a row object per row. Returns the rows copied."""
        try:
            status = await self.conn.copy_from_query(query(name).strip().rstrip(";"), *args, output=output, **options)
        except _MAPPED as exc:
            raise _unavailable(exc) from exc
        return int(status.rsplit(" ", 1)[-1])

    async def copy_in(self, table: str, records: Sequence[Sequence[Any]], columns: Sequence[str]) -> int:
        """COPY rows into a table (binary, one round trip); returns the rows written."""
        try:
            status = await self.conn.copy_records_to_table(table, records=records, columns=list(columns))
        except _MAPPED as exc:
            raise _unavailable(exc) from exc
        return int(status.rsplit(" ", 1)[-1])

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Session]:
        """Commit when the block ends, roll back when it raises (a savepoint when nested).
        An error of the block itself passes through unchanged, whatever its type."""
        tx = self.conn.transaction()
        try:
            await tx.start()
        except _MAPPED as exc:
            raise _unavailable(exc) from exc
        try:
            yield self
        except BaseException:
            try:
                await tx.rollback()
            except _MAPPED:
                pass  # the connection is gone and PostgreSQL rolled back; the block's error says why
            raise
        try:
            await tx.commit()
        except _MAPPED as exc:
            raise _unavailable(exc) from exc


Conn: TypeAlias = "Session | asyncpg.Connection | DriverConnection"
"""Where a statement may run besides the pool: a gateway session, or a caller's own connection."""


class Listener:
    """A connection of its own (not from the pool) LISTENing on one channel: PostgreSQL
    NOTIFYs on commit, and a pooled connection would drop the subscription on release."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    def alive(self) -> bool:
        return not self._conn.is_closed()

    def terminate(self) -> None:
        self._conn.terminate()

    async def close(self) -> None:
        await self._conn.close()


class Database:
    """The gateway: an asyncpg pool, named queries, sessions and transactions. Connection
    errors become DatabaseUnavailable."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.url = url
        self._min, self._max = min_size, max_size
        self.pool: asyncpg.Pool | None = None
        self._lane: asyncpg.Connection | None = None
        """A connection of its own beside the pool for lone named queries (`_one`)."""
        self._lane_busy = False
        self._closing = False
        self._lane_loggers: list[Callable[[Any], None]] = []

    @staticmethod
    async def _no_reset(conn: asyncpg.Connection) -> None:
        """A connection returning to the pool from a pooled named query (`fetch`, `execute`...) ran
        one autocommit statement, which leaves no session state (asyncpg has already rolled back any
        open transaction), so asyncpg's default reset query (UNLISTEN, RESET ALL, advisory unlocks)
        would only add a second round trip to each of them: a submit would cost two. Connections
        lent by `session()` may hold session state: it resets them itself before giving them back."""

    async def connect(self) -> Database:
        self._closing = False
        if self.pool is None:
            try:
                self.pool = await asyncpg.create_pool(self.url, min_size=self._min, max_size=self._max,
                                                      reset=self._no_reset)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                raise DatabaseUnavailable(f"postgresql unreachable at {_redact(self.url)}: {exc}") from exc
        return self

    async def close(self) -> None:
        if self.pool is not None:
            self._closing = True  # a lane statement in flight closes its connection when it ends
            lane, self._lane = self._lane, None
            if lane is not None and not self._lane_busy:
                lane.terminate()
            await self.pool.close()
            self.pool = None

    @property
    def connected(self) -> bool:
        return self.pool is not None

    def _p(self) -> asyncpg.Pool:
        if self.pool is None:
            raise DatabaseUnavailable("database not connected")
        return self.pool

    async def _fetch(self, conn: Conn | None, name: str, args: tuple[Any, ...]) -> list[asyncpg.Record]:
        if conn is not None:
            return await _fetch(conn.conn if isinstance(conn, Session) else conn, name, args)
        return await self._one(_fetch, name, args)  # type: ignore[no-any-return]

    async def _one(self, op: Callable[[_Target, str, tuple[Any, ...]], Awaitable[Any]], name: str,
                   args: tuple[Any, ...]) -> Any:
        """A lone named query (one autocommit statement) on the lane: a connection of this gateway's own
        beside the pool. asyncpg's acquire and release around each pooled statement cost ~60 us of client
        CPU, as much as a small statement's own round trip (a lone submit's insert: 176 against 109 us,
        tests/test_db_lane.py's docstring), and pgqueuer pays neither. While the lane is busy (concurrent
        callers) a statement takes a pooled connection as before. A lane PostgreSQL closed (a restart, an
        idle timeout) is opened again before use; one whose statement did not end cleanly (a connection
        lost mid-statement, a cancellation) is terminated, never reused in an unknown state."""
        pool = self._p()
        if self._lane_busy or self._closing or pool.is_closing():
            return await op(pool, name, args)
        self._lane_busy = True
        lane: asyncpg.Connection | None = None
        keep = False
        try:
            lane = self._lane
            if lane is None or lane.is_closed():
                self._lane = lane = None
                try:
                    lane = await asyncpg.connect(self.url)
                except (*_MAPPED, asyncpg.PostgresError, TimeoutError):
                    return await op(pool, name, args)  # no lane now (down, too many connections): the pool decides
                for logger in self._lane_loggers:
                    lane.add_query_logger(logger)
            result = await op(lane, name, args)
            keep = True
            return result
        except asyncpg.PostgresError:  # the statement's own error (a connection's is DatabaseUnavailable)
            keep = True
            raise
        finally:
            self._lane_busy = False
            if lane is not None:
                if keep and not self._closing:
                    self._lane = lane
                else:
                    self._lane = None
                    lane.terminate()  # its state is unknown (or the gateway is closing): never reuse it

    def log_lane(self, logger: Callable[[Any], None]) -> None:
        """asyncpg's query logger on the lane, now and on every lane opened later (tests that count the
        statements a client sends; the pool's connections take `add_query_logger` themselves)."""
        self._lane_loggers.append(logger)
        if self._lane is not None:
            self._lane.add_query_logger(logger)

    async def fetch(self, name: str, *args: Any, conn: Conn | None = None) -> list[asyncpg.Record]:
        return await self._fetch(conn, name, args)

    async def fetchrow(self, name: str, *args: Any, conn: Conn | None = None) -> asyncpg.Record | None:
        rows = await self._fetch(conn, name, args)
        return rows[0] if rows else None

    async def rows(self, name: str, *args: Any, conn: Conn | None = None) -> list[Any]:
        """The query's rows as its row Struct (`row_type(name)`: fields the `-- returns:` columns),
        read by attribute (`row.status`), never by string key. Typed Any statically: the Struct is
        made at run time from the header, and a test holds its fields to the header."""
        return _typed(name, await self._fetch(conn, name, args))

    async def row(self, name: str, *args: Any, conn: Conn | None = None) -> Any:
        """The first row as the query's row Struct, or None when there is no row."""
        rows = await self._fetch(conn, name, args)
        return _typed(name, rows[:1])[0] if rows else None

    async def fetchval(self, name: str, *args: Any, conn: Conn | None = None) -> Any:
        """First column of the first row (None when no row)."""
        rows = await self._fetch(conn, name, args)
        return rows[0][0] if rows else None

    async def execute(self, name: str, *args: Any, conn: Conn | None = None) -> str:
        if conn is not None:
            return await _execute(conn.conn if isinstance(conn, Session) else conn, name, args)
        return await self._one(_execute, name, args)  # type: ignore[no-any-return]

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """One pooled connection for the block (session advisory locks, several statements)."""
        pool = self._p()
        try:
            conn = await pool.acquire()
        except _MAPPED as exc:
            raise _unavailable(exc) from exc
        try:
            yield Session(conn)
        finally:
            try:
                await conn.reset()  # advisory locks, SET, LISTEN: nothing a session did outlives it
            except BaseException as exc:
                try:
                    conn.terminate()  # a lost or interrupted reset: its state is unknown, never reuse it
                except asyncpg.InterfaceError:
                    pass  # lost mid-session: the pool has taken the dead connection back already
                if not isinstance(exc, Exception):
                    raise
            finally:
                await pool.release(conn)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Session]:
        """`async with db.transaction() as tx:` one pooled connection in one transaction;
        `tx` takes query names like the Database does."""
        async with self.session() as s, s.transaction():
            yield s

    async def listen(self, channel: str, wake: Callable[[], None], *, timeout: float = 5.0) -> Listener:
        """Call `wake()` on every NOTIFY on `channel` (the payload is not needed: wake-ups only)."""
        try:
            conn = await asyncpg.connect(self.url, timeout=timeout)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            raise DatabaseUnavailable(f"postgresql unreachable at {_redact(self.url)}: {exc}") from exc
        try:
            await conn.add_listener(channel, lambda *_: wake())
        except BaseException as exc:
            conn.terminate()
            if isinstance(exc, _MAPPED):
                raise _unavailable(exc) from exc
            raise
        return Listener(conn)

    async def upgrade(self) -> list[str]:
        async with self.session() as s:
            return await upgrade(s.conn)


def _redact(url: str) -> str:
    return re.sub(r"://([^:@/]+):[^@/]*@", r"://\1:***@", url)


async def store_definitions(db: Database, specs: list[JobSpec]) -> None:
    """Upsert handler declarations (workers do it at start, so producers can validate)."""
    cols = [[getattr(s, f) for s in specs] for f in
            ("name", "model", "queue", "priority", "timeout_s", "max_retries", "version", "resumable", "owner")]
    await db.execute("upsert_definitions", *cols, [json.dumps(s.options()) for s in specs])
