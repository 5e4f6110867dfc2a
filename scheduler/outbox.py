"""Transactional outboxes for the common stacks: submit runs inside the application's own transaction,
so they exist if and only if it commits (the reconciler's relay moves them to Redis on commit).

    await outbox.submit(client, tx, send.request("a@example.com", "welcome"))     # async stacks
    outbox.submit_sync(sync_client, tx, send.request("a@example.com", "welcome"))  # sync stacks

`tx` is what the application already holds:
- async: an asyncpg connection, a psycopg 3 AsyncConnection, a SQLAlchemy AsyncSession or AsyncConnection
  (asyncpg or psycopg driver);
- sync: a psycopg 3 Connection, a SQLAlchemy Session or Connection (psycopg driver), Django's
  `django.db.connection` (or None for it) inside `transaction.atomic()`.

The statements are the record store's named queries, run on the caller's connection (fencepost.core.record
adapts them to the driver's placeholder style); validation happens before anything is written. A sync
driver's connection is only ever used on the caller's thread: the client's coroutine on its own loop hands
each statement back to that thread (Django refuses a connection shared across threads)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import queue
from collections.abc import Callable, Sequence
from typing import Any

from fencepost.client import Client, SyncClient
from fencepost.core.errors import InvalidInput
from fencepost.core.models import Submit
from fencepost.core.record import Conn, pyformat

__all__ = ["submit", "submit_sync"]


def _requests(requests: Submit | Sequence[Submit]) -> list[Submit]:
    reqs = [requests] if isinstance(requests, Submit) else list(requests)
    for r in reqs:
        if not isinstance(r, Submit):
            raise InvalidInput(f"outbox submits take Submit requests (handle.request(...)), not {type(r).__name__}",
                               field="requests")
    return reqs


def _rows(description: Any, rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    names = [d[0] for d in description]
    return [dict(zip(names, r)) for r in rows]


def _status(cursor: Any) -> str:
    return str(getattr(cursor, "statusmessage", "") or f"OK {cursor.rowcount}")


class _AsyncPsycopg:
    """Named queries on a psycopg 3 AsyncConnection, in whatever transaction it has open."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        text, params = pyformat(sql, args)
        async with self.conn.cursor() as cur:
            await cur.execute(text, params)
            return _rows(cur.description, await cur.fetchall()) if cur.description else []

    async def execute(self, sql: str, *args: Any) -> str:
        text, params = pyformat(sql, args)
        async with self.conn.cursor() as cur:
            await cur.execute(text, params)
            return _status(cur)


class _AsyncSQLAlchemy:
    """Named queries through a SQLAlchemy AsyncConnection (exec_driver_sql: its transaction begins as
    SQLAlchemy's own statements would begin it), in the driver's placeholder style."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        result = await self.conn.exec_driver_sql(*_driver_sql(self.conn.dialect, sql, args))
        return [dict(r) for r in result.mappings().all()] if result.returns_rows else []

    async def execute(self, sql: str, *args: Any) -> str:
        result = await self.conn.exec_driver_sql(*_driver_sql(self.conn.dialect, sql, args))
        return f"OK {result.rowcount}"


def _driver_sql(dialect: Any, sql: str, args: tuple[Any, ...]) -> tuple[str, Any]:
    if dialect.paramstyle == "numeric_dollar":  # asyncpg: the query as written
        return sql, tuple(args)
    if dialect.paramstyle == "pyformat":  # psycopg
        return pyformat(sql, args)
    raise InvalidInput(f"no outbox for SQLAlchemy's {dialect.name}+{dialect.driver} driver: use asyncpg or psycopg",
                       field="connection")


async def _async_connection(tx: Any) -> Conn:
    """The driver connection under what an async application holds."""
    module = type(tx).__module__
    if module.startswith("asyncpg"):
        conn: Conn = tx
        return conn
    if module.startswith("psycopg"):
        return _AsyncPsycopg(tx)
    if module.startswith("sqlalchemy"):
        return _AsyncSQLAlchemy(await tx.connection() if hasattr(tx, "sync_session") else tx)  # AsyncSession: its connection
    raise InvalidInput(f"no outbox for a {module}.{type(tx).__name__}: give an asyncpg or psycopg 3 connection, "
                       "or a SQLAlchemy AsyncSession / AsyncConnection", field="connection")


async def submit(client: Client, tx: Any, requests: Submit | Sequence[Submit]) -> list[int]:
    """Submit inside the caller's open transaction (async stacks); run ids in request order."""
    return await client.submit_many(_requests(requests), connection=await _async_connection(tx))


Runner = Callable[[str, str, tuple[Any, ...]], Any]
"""(kind: fetch | execute, sql as the record store loaded it, arguments) -> rows or status, on the caller's thread."""


class _OnCallerThread:
    """A DriverConnection for a sync application's connection: each statement the client's coroutine runs
    is handed to the caller's thread (blocked in `serve`), run there, and its answer handed back."""

    def __init__(self, run: Runner, loop: asyncio.AbstractEventLoop) -> None:
        self.run, self.loop = run, loop
        self.jobs: queue.SimpleQueue[tuple[str, str, tuple[Any, ...], asyncio.Future[Any]] | None] = queue.SimpleQueue()

    async def _hand_over(self, kind: str, sql: str, args: tuple[Any, ...]) -> Any:
        fut: asyncio.Future[Any] = self.loop.create_future()
        self.jobs.put((kind, sql, args, fut))
        return await fut

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        rows: list[Any] = await self._hand_over("fetch", sql, args)
        return rows

    async def execute(self, sql: str, *args: Any) -> str:
        status: str = await self._hand_over("execute", sql, args)
        return status

    def serve(self, done: concurrent.futures.Future[list[int]]) -> list[int]:
        done.add_done_callback(lambda _: self.jobs.put(None))
        while (job := self.jobs.get()) is not None:
            kind, sql, args, fut = job
            try:
                out = self.run(kind, sql, args)
            except BaseException as exc:  # handed back: the client's coroutine raises it, and so does serve
                self.loop.call_soon_threadsafe(_fail, fut, exc)
            else:
                self.loop.call_soon_threadsafe(_succeed, fut, out)
        return done.result()


def _succeed(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _dbapi(cursor: Callable[[], Any]) -> Runner:
    """A runner on a DB-API connection's cursors (psycopg 3, Django's wrapper): pyformat placeholders."""
    def run(kind: str, sql: str, args: tuple[Any, ...]) -> Any:
        text, params = pyformat(sql, args)
        cur = cursor()
        try:
            cur.execute(text, params)
            if kind == "fetch":
                return _rows(cur.description, cur.fetchall()) if cur.description else []
            return _status(cur)
        finally:
            cur.close()
    return run


def _sqlalchemy(conn: Any) -> Runner:
    """A runner on a SQLAlchemy Connection (exec_driver_sql, in its transaction)."""
    def run(kind: str, sql: str, args: tuple[Any, ...]) -> Any:
        result = conn.exec_driver_sql(*_driver_sql(conn.dialect, sql, args))
        if kind == "fetch":
            return [dict(r) for r in result.mappings().all()] if result.returns_rows else []
        return f"OK {result.rowcount}"
    return run


def _runner(tx: Any) -> Runner:
    """How to run statements on the connection (and transaction) a sync application holds."""
    module = type(tx).__module__ if tx is not None else "django"
    if module.startswith("django"):
        if tx is None:  # Django's default connection (an optional dependency, imported only when used)
            tx = importlib.import_module("django.db").connection
        return _dbapi(tx.cursor)
    if module.startswith("sqlalchemy"):
        return _sqlalchemy(tx.connection() if hasattr(tx, "get_bind") else tx)  # Session: its Connection
    if module.startswith("psycopg"):
        return _dbapi(tx.cursor)
    raise InvalidInput(f"no outbox for a {module}.{type(tx).__name__}: give a psycopg 3 connection, a SQLAlchemy "
                       "Session / Connection, or Django's connection", field="connection")


def submit_sync(client: SyncClient, tx: Any, requests: Submit | Sequence[Submit]) -> list[int]:
    """Submit inside the caller's open transaction (sync stacks: psycopg 3, SQLAlchemy, Django with tx=None
    or django.db.connection inside transaction.atomic()); run ids in request order."""
    reqs = _requests(requests)
    bridge = _OnCallerThread(_runner(tx), client._loop)
    done = asyncio.run_coroutine_threadsafe(client._client.submit_many(reqs, connection=bridge), client._loop)
    return bridge.serve(done)
