"""The gateway's lane (issue 23 item 3, "submits at pgqueuer's cost"): a lone named query runs on one
connection kept out of the pool while idle, instead of asyncpg's acquire and release around each
statement (~60 us of client CPU, as much as a small statement's own round trip). What must hold with it:
no acquire per lone statement; concurrent statements still all run; a statement's own error keeps the
lane; a lane PostgreSQL dropped, or a statement cancelled mid-flight, is replaced and never reused in an
unknown state; close() returns every connection.

Measured (quiet machine, one connection, 1,500 statements): a lone submit's insert through the pool
176 us of client CPU, on a held connection 109 us; SELECT 1 through the pool 81 us, held 29 us."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from fencepost.core.config import Settings
from fencepost.core.errors import DatabaseUnavailable
from fencepost.core.record import Database


@pytest.fixture
async def db(settings: Settings) -> Any:
    d = await Database(settings.database_url, max_size=4).connect()
    yield d
    await d.close()


def _count_acquires(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counted = [0]
    real = asyncpg.pool.Pool.acquire

    def acquire(self: asyncpg.Pool, *a: Any, **k: Any) -> Any:
        if self is db.pool:
            counted[0] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(asyncpg.pool.Pool, "acquire", acquire)
    return counted


async def test_lone_statements_take_no_pooled_connection_each(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    acquires = _count_acquires(db, monkeypatch)
    for _ in range(50):
        assert await db.fetchval("db_now") is not None
    assert acquires[0] <= 1, f"{acquires[0]} acquires for 50 lone statements"


async def test_concurrent_statements_all_run_beside_the_lane(db: Database) -> None:
    got = await asyncio.gather(*(db.fetchval("db_now") for _ in range(40)))
    assert all(v is not None for v in got)


async def test_a_statements_own_error_keeps_the_lane(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    await db.fetchval("db_now")
    acquires = _count_acquires(db, monkeypatch)
    with pytest.raises(asyncpg.PostgresError):
        await db.fetch("set_queue_max_running", "no-such-queue", 2**40)  # out of int4's range: PostgreSQL refuses it
    assert await db.fetchval("db_now") is not None
    assert acquires[0] == 0


async def test_a_lane_postgresql_dropped_is_replaced(db: Database, settings: Settings) -> None:
    await db.fetchval("db_now")
    admin = await asyncpg.connect(settings.database_url)
    try:
        mine = [r["pid"] for r in await admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
        for pid in mine:  # every connection of the gateway's pool, the lane among them
            await admin.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()
    for _ in range(3):  # the dead lane fails its next statement at most (as a dead pooled connection would)
        try:
            assert await db.fetchval("db_now") is not None
            break
        except DatabaseUnavailable:
            continue
    else:
        raise AssertionError("the gateway never replaced its dropped connection")
    assert await db.fetchval("db_now") is not None


async def test_a_cancelled_lone_statement_is_not_reused_and_close_returns_everything(
        db: Database, settings: Settings) -> None:
    await db.execute("declare_queues", ["lane-q"])
    blocker = await asyncpg.connect(settings.database_url)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM queues WHERE name = 'lane-q' FOR UPDATE")
        with pytest.raises(TimeoutError):  # the update waits on the row lock, then is cancelled
            await asyncio.wait_for(db.fetch("set_queue_max_running", "lane-q", 3), 0.3)
        await tx.rollback()
    finally:
        await blocker.close()
    assert await db.fetch("set_queue_max_running", "lane-q", 4)
    await asyncio.wait_for(db.close(), 10)  # no connection left checked out
