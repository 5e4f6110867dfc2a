"""One queue's stream whose group cannot be made (its Redis Cluster shard down) leaves that queue out of
the recorder's batch, not the batch: the other queues' history is recorded. CI failed on it with redis-py 8
(tests/test_cluster.py::test_a_dead_cluster_shard_delays_only_its_own_queues_history): the dead shard's
XGROUP CREATE failed every batch, so no queue was recorded until the failover. Here the shard's death is
a create_group that raises the connection error redis-py raises for it, on a real Redis and PostgreSQL."""

from __future__ import annotations

import asyncpg
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.hot import ClaimArgs
from fencepost.core.stores import Stores
from fencepost.reconciler.recorder import Recorder


async def test_a_stream_whose_group_cannot_be_made_holds_back_only_its_own_queue(
        client: Client, stores: Stores, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    healthy = await client.submit("t.noop", queue="healthy")
    await client.submit("t.noop", queue="deadshard")
    jobs = await stores.scripts.claim_due(stores.keys("healthy"), ClaimArgs(10, "w", 60_000, 10))
    assert healthy in [j.id for j in jobs]
    rec = Recorder(stores, consumer="one")
    dead_stream = stores.keys("deadshard").events
    create = rec.streams.create_group

    async def create_or_refuse(stream: str) -> None:
        if stream == dead_stream:
            raise RedisConnectionError("Error 111 connecting to 127.0.0.1:1. Connect call failed")
        await create(stream)

    monkeypatch.setattr(rec.streams, "create_group", create_or_refuse)
    assert await rec.run_once(block_ms=10) > 0  # before: the refused XGROUP CREATE raised out of the batch
    conn = await asyncpg.connect(settings.database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM attempts WHERE run_id = $1", healthy) == 1
    finally:
        await conn.close()
    monkeypatch.setattr(rec.streams, "create_group", lambda stream: create_or_refuse(dead_stream))
    with pytest.raises(RedisConnectionError):  # every stream failing is Redis away: the caller backs off
        await rec._ensure_groups(["deadshard"])
