"""Submits: one PostgreSQL round trip and one Redis call each, and concurrent submits of one client
process coalesced into one statement and one Lua call (group commit), each caller still answered
only after PostgreSQL committed its run (issue 18, item 4)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
import pytest

from fencepost.client import Client
from fencepost.core.errors import InvalidInput
from fencepost.core.models import Submit

pytestmark = pytest.mark.asyncio


class Traffic:
    """What the client sends: statements on every pooled PostgreSQL connection and on the gateway's
    lane (asyncpg's query logger: a pool's reset query is logged too) and Redis commands by name."""

    def __init__(self) -> None:
        self.sql: list[str] = []
        self.redis: Counter[str] = Counter()

    async def watch(self, client: Client, monkeypatch: pytest.MonkeyPatch) -> Traffic:
        pool = client.stores.db.pool
        assert pool is not None
        held = [await pool.acquire() for _ in range(pool.get_size())]  # every connection the pool has
        for conn in held:
            conn.add_query_logger(lambda q: self.sql.append(q.query))
        for conn in held:
            await pool.release(conn)
        client.stores.db.log_lane(lambda q: self.sql.append(q.query))  # lone statements go there
        self.sql.clear()
        redis = client.stores.redis
        real = redis.execute_command

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.redis[str(args[0]).upper()] += 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(redis, "execute_command", counted)
        return self

    def inserts(self) -> int:
        return sum(1 for q in self.sql if "INSERT INTO runs" in q)


async def _runs(client: Client) -> int:
    return await client.stores.db.pool.fetchval("SELECT count(*) FROM runs")  # type: ignore[union-attr]


async def test_a_single_submit_is_one_statement_and_one_redis_call(client: Client, monkeypatch) -> None:
    await client.submit("t.echo", 0)  # warm: definitions cached, statement prepared
    traffic = await Traffic().watch(client, monkeypatch)
    for i in range(5):
        await client.submit("t.echo", i)
    # before: every pooled statement was followed by asyncpg's reset query (a second round trip)
    assert len(traffic.sql) == 5, traffic.sql
    assert traffic.inserts() == 5
    assert dict(traffic.redis) == {"EVALSHA": 5}


async def test_a_lone_submit_goes_straight_out(client: Client, monkeypatch) -> None:
    """Nothing in flight: the submit is sent from its caller's task, with no flush scheduled (no
    timer, no extra event-loop turn, no task of its own)."""
    await client.submit("t.echo", 0)

    def scheduled() -> None:
        raise AssertionError("a lone submit scheduled a flush")

    monkeypatch.setattr(client._coalescer, "_schedule", scheduled)
    for i in range(3):
        assert await client.submit("t.echo", i) > 0
    assert not client._coalescer.inflight and not client._coalescer.pending


async def test_concurrent_submits_are_one_statement_and_one_lua_call(client: Client, monkeypatch) -> None:
    await asyncio.gather(*(client.submit("t.echo", 0) for _ in range(3)))  # warm two connections: lone + batch
    traffic = await Traffic().watch(client, monkeypatch)
    ids = await asyncio.gather(*(client.submit("t.echo", f"v{i}:") for i in range(200)))
    assert len(set(ids)) == 200
    # before: 200 statements (and 200 resets) and 200 Lua calls. The first submit finds nothing in
    # flight and goes straight out alone; the other 199 accumulate behind it and go as one batch.
    assert traffic.inserts() == 2 and len(traffic.sql) == 2, traffic.sql
    assert dict(traffic.redis) == {"EVALSHA": 2}
    assert await _runs(client) == 203
    keys = client.stores.keys("tq")
    assert await client.stores.redis.zcard(keys.due) == 203
    # each caller got its own run: its arguments went with the id returned to it
    rows = await client.stores.db.pool.fetch(  # type: ignore[union-attr]
        "SELECT id, payload FROM runs WHERE id = ANY($1::bigint[])", list(ids))
    by_id = {r["id"]: r["payload"] for r in rows}
    for i, run_id in enumerate(ids):
        assert f"v{i}:".encode() in by_id[run_id]


async def test_a_bad_submit_fails_alone_and_writes_nothing(client: Client) -> None:
    await client.submit("t.echo", 0)
    results = await asyncio.gather(
        *(client.submit("t.echo", i, priority=999 if i == 3 else None) for i in range(10)),
        return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], InvalidInput) and errors[0].field == "priority"
    assert isinstance(results[3], InvalidInput)
    assert await _runs(client) == 10  # the warm-up and the nine good ones


async def test_same_request_with_one_key_concurrently_is_one_run(client: Client) -> None:
    ids = await asyncio.gather(*(client.submit("t.echo", "same", idempotency_key="once") for _ in range(20)))
    assert len(set(ids)) == 1
    assert await _runs(client) == 1


async def test_bulk_submit_stays_one_statement_per_chunk(client: Client, monkeypatch) -> None:
    await client.submit("t.echo", 0)
    traffic = await Traffic().watch(client, monkeypatch)
    ids = await client.submit_many([Submit(handler="t.echo", args=(i,)) for i in range(1000)])
    assert len(set(ids)) == 1000
    assert traffic.inserts() == len(traffic.sql) == -(-1000 // client.chunk)
    assert dict(traffic.redis) == {"EVALSHA": -(-1000 // client.chunk)}


async def test_close_commits_what_is_pending(settings) -> None:
    from tests.apps import registry

    c = await Client(settings=settings).connect()
    await c.register(registry)
    tasks = [asyncio.ensure_future(c.submit("t.echo", i)) for i in range(50)]
    await asyncio.sleep(0)  # the submitters have queued their runs; no flush has finished
    await c.close()
    ids = await asyncio.gather(*tasks)
    conn = await asyncpg.connect(settings.database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM runs WHERE id = ANY($1::bigint[])", ids) == 50
    finally:
        await conn.close()


async def test_a_session_leaves_no_state_on_the_pooled_connection(client: Client, settings) -> None:
    """Pooled single statements skip asyncpg's reset query; sessions still reset their connection."""
    db = client.stores.db
    async with db.session() as s:
        assert await s.conn.fetchval("SELECT pg_try_advisory_lock(424242)")
    other = await asyncpg.connect(settings.database_url)
    try:
        assert await other.fetchval("SELECT pg_try_advisory_lock(424242)"), "the session's lock outlived it"
    finally:
        await other.close()
