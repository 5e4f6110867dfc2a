"""Outboxes for the common stacks (issue 16): submits inside the application's own transaction from
psycopg 3 (async and sync), SQLAlchemy (async sessions on asyncpg and psycopg, sync sessions) and Django
(`transaction.atomic`), each against real PostgreSQL: committed with the application's own row, the runs
exist and run; rolled back, neither exists. Before this, only an asyncpg connection was accepted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import psycopg
import pytest
import pytest_asyncio
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from fencepost import outbox
from fencepost.client import Client, SyncClient
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput, UnknownRun
from fencepost.core.registry import Registry
from fencepost.testing import Harness
from fencepost.worker.context import Context

registry = Registry()


@registry.job("orders.confirm", queue="oq")
async def confirm(ctx: Context, order: str, amount: int) -> str:
    return f"{order}:{amount}"


class Rollback(Exception):
    """Raised inside the application's transaction to roll it back."""


@pytest_asyncio.fixture
async def fp(settings: Settings, database_url: str) -> AsyncIterator[Harness]:
    conn = await asyncpg.connect(database_url)
    await conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")  # the application's own table
    await conn.close()
    client = await Client(settings=settings).connect()
    await client.register(registry)
    yield Harness(settings, registry, client)
    await client.close()


async def _orders(database_url: str) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        return [r["id"] for r in await conn.fetch("SELECT id FROM orders ORDER BY id")]
    finally:
        await conn.close()


async def _exists(client: Client, run_id: int) -> bool:
    try:
        await client.get(run_id)
    except UnknownRun:
        return False
    return True


async def _committed_runs_run(fp: Harness, ids: list[int], orders: list[str]) -> None:
    await fp.drain()
    results = [(await fp.client.wait(i, timeout=10)).result for i in ids]
    assert results == [f"{o}:{n}" for o, n in orders_amounts(orders)]


def orders_amounts(orders: list[str]) -> list[tuple[str, int]]:
    return [(o, len(o)) for o in orders]


def _sqlalchemy_url(database_url: str, driver: str) -> str:
    return database_url.replace("postgresql://", f"postgresql+{driver}://", 1)


async def test_asyncpg_psycopg_and_sqlalchemy_async(fp: Harness, database_url: str) -> None:
    ids: list[int] = []
    # psycopg 3 AsyncConnection: commit
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.transaction():
            await conn.execute("INSERT INTO orders (id) VALUES ('pa')")
            ids += await outbox.submit(fp.client, conn, confirm.request("pa", 2))
        # rollback: neither the order nor the run
        with pytest.raises(Rollback):
            async with conn.transaction():
                await conn.execute("INSERT INTO orders (id) VALUES ('pb')")
                lost = await outbox.submit(fp.client, conn, [confirm.request("pb", 2)])
                raise Rollback
    for driver, name in (("asyncpg", "sa"), ("psycopg", "sp")):
        engine = create_async_engine(_sqlalchemy_url(database_url, driver))
        try:
            async with AsyncSession(engine) as session:
                async with session.begin():
                    await session.execute(text(f"INSERT INTO orders (id) VALUES ('{name}')"))
                    ids += await outbox.submit(fp.client, session, confirm.request(name, 2))
                with pytest.raises(Rollback):
                    async with session.begin():
                        # the outbox is the first statement of this transaction: it must open it, not autocommit
                        lost += await outbox.submit(fp.client, session, confirm.request(name + "x", 3))
                        await session.execute(text(f"INSERT INTO orders (id) VALUES ('{name}x')"))
                        raise Rollback
        finally:
            await engine.dispose()
    # a plain asyncpg connection, as before
    conn2 = await asyncpg.connect(database_url)
    async with conn2.transaction():
        await conn2.execute("INSERT INTO orders (id) VALUES ('ap')")
        ids += await outbox.submit(fp.client, conn2, confirm.request("ap", 2))
    await conn2.close()
    assert await _orders(database_url) == ["ap", "pa", "sa", "sp"]
    assert [await _exists(fp.client, i) for i in lost] == [False] * 3
    await _committed_runs_run(fp, ids, ["pa", "sa", "sp", "ap"])


async def test_psycopg_and_sqlalchemy_sync(fp: Harness, settings: Settings, database_url: str) -> None:
    def produce() -> tuple[list[int], list[int]]:
        ids: list[int] = []
        lost: list[int] = []
        with SyncClient(settings=settings) as sync:
            with psycopg.connect(database_url) as conn:
                with conn.transaction():
                    conn.execute("INSERT INTO orders (id) VALUES ('qa')")
                    ids += outbox.submit_sync(sync, conn, confirm.request("qa", 2))
                with pytest.raises(Rollback), conn.transaction():
                    lost += outbox.submit_sync(sync, conn, confirm.request("qb", 2))
                    conn.execute("INSERT INTO orders (id) VALUES ('qb')")
                    raise Rollback
                with pytest.raises(InvalidInput), conn.transaction():  # bad input: nothing written
                    outbox.submit_sync(sync, conn, [confirm.request("qc", 2), "orders.confirm"])  # type: ignore[list-item]
            engine = create_engine(_sqlalchemy_url(database_url, "psycopg"))
            try:
                with Session(engine) as session:
                    with session.begin():
                        session.execute(text("INSERT INTO orders (id) VALUES ('ss')"))
                        ids += outbox.submit_sync(sync, session, confirm.request("ss", 2))
                    with pytest.raises(Rollback), session.begin():
                        lost += outbox.submit_sync(sync, session, confirm.request("st", 2))
                        raise Rollback
            finally:
                engine.dispose()
        return ids, lost

    ids, lost = await asyncio.to_thread(produce)
    assert await _orders(database_url) == ["qa", "ss"]
    assert [await _exists(fp.client, i) for i in lost] == [False, False]
    await _committed_runs_run(fp, ids, ["qa", "ss"])


async def test_django_transaction_atomic(fp: Harness, settings: Settings, database_url: str) -> None:
    django = pytest.importorskip("django")
    from django.conf import settings as django_settings
    from django.db import connection, transaction

    url = urlsplit(database_url)
    db: dict[str, Any] = {"ENGINE": "django.db.backends.postgresql", "NAME": url.path.lstrip("/"),
                          "USER": url.username or "postgres", "PASSWORD": url.password or "",
                          "HOST": url.hostname or "127.0.0.1", "PORT": str(url.port or 5432)}
    if not django_settings.configured:
        django_settings.configure(DATABASES={"default": db}, USE_TZ=True)
        django.setup()
    else:
        django_settings.DATABASES["default"].update(db)

    def produce() -> tuple[list[int], list[int]]:
        try:
            with SyncClient(settings=settings) as sync:
                with transaction.atomic():
                    with connection.cursor() as cur:
                        cur.execute("INSERT INTO orders (id) VALUES ('dj')")
                    ids = outbox.submit_sync(sync, None, confirm.request("dj", 2))
                lost: list[int] = []
                with pytest.raises(Rollback), transaction.atomic():
                    lost += outbox.submit_sync(sync, connection, confirm.request("dk", 2))
                    raise Rollback
                return ids, lost
        finally:
            connection.close()

    ids, lost = await asyncio.to_thread(produce)
    assert await _orders(database_url) == ["dj"]
    assert not await _exists(fp.client, lost[0])
    await _committed_runs_run(fp, ids, ["dj"])
