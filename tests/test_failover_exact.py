"""Failover-exact executions (issue 13, item 4): after Redis loses writes, an attempt number
is never reused, and a run the lost dataset may have run gets an attempt row that says so
(outcome `unknown`, error_class RedisLost) before it is claimed again. Private redis-server
processes (FLUSHALL, a replica promoted after missing a claim, a durable claim a replica
acknowledged); claims are made through the gateway in this process, so the lost claim is
exactly the one the test made.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio

from fencepost.client import Client
from fencepost.core import metrics
from fencepost.core.config import Settings
from fencepost.core.hot import ClaimArgs, Finish, FinishArgs
from fencepost.core.models import Claimed
from fencepost.core.stores import Stores
from fencepost.dev.faults import TcpProxy
from fencepost.reconciler.rebuild import rebuild_queue
from fencepost.worker.runtime import Worker, WorkerOptions
from tests.apps import registry
from tests.conftest import record_all
from tests.servers import RedisServer

Q = "tq"


async def _connect(settings: Settings, url: str) -> tuple[Client, Stores, Settings]:
    s = Settings(redis_url=url, database_url=settings.database_url, prefix=settings.prefix)
    client = await Client(settings=s).connect()
    await client.register(registry)
    return client, await Stores(s).connect(), s


async def _claim(stores: Stores, worker: str = "w1") -> Claimed:
    jobs = await stores.scripts.claim_due(stores.keys(Q), ClaimArgs(1, worker, 60_000, 10))
    assert len(jobs) == 1, jobs
    return jobs[0]


async def _attempts(db_url: str, run_id: int) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetch("SELECT attempt, token, outcome, error_class FROM attempts WHERE run_id = $1 "
                                "ORDER BY attempt", run_id)
    finally:
        await conn.close()


async def _run_row(db_url: str, run_id: int) -> asyncpg.Record:
    conn = await asyncpg.connect(db_url)
    try:
        row = await conn.fetchrow("SELECT status, attempt, version FROM runs WHERE id = $1", run_id)
        assert row is not None
        return row
    finally:
        await conn.close()


@pytest_asyncio.fixture
async def server() -> AsyncIterator[RedisServer]:
    s = await RedisServer().start()
    yield s
    s.cleanup()


async def test_flushall_gives_the_lost_execution_an_unknown_attempt_and_a_new_number(
        settings: Settings, server: RedisServer) -> None:
    """The issue's reproduction: a claim whose `claimed` event is lost with the dataset; the run
    is rebuilt from PostgreSQL (PENDING, attempt 0). Before the fix the next claim reused
    attempt 1 and the attempts table showed one execution for two."""
    client, stores, s = await _connect(settings, server.url)
    try:
        rid = await client.submit("t.noop")
        first = await _claim(stores)
        assert (first.id, first.attempt) == (rid, 1)
        await stores.redis.flushall()  # the claimed event never reached PostgreSQL
        stats = await rebuild_queue(stores, Q)
        assert stats["unknown"] == 1, stats
        second = await _claim(stores, "w2")
        assert second.id == rid
        assert second.attempt == 2, "an attempt number was reused after the Redis loss"
        assert second.token > first.token
        # The old holder cannot finish; the new one can.
        keys = stores.keys(Q)
        assert [r.state for r in await stores.scripts.finish_runs(
            keys, FinishArgs(3), [Finish(rid, first.token, "ok", b"\x90", "", 0)])] == ["STALE"]
        assert [r.state for r in await stores.scripts.finish_runs(
            keys, FinishArgs(3), [Finish(rid, second.token, "ok", b"\x90", "", 0)])] == ["SUCCEEDED"]
        await record_all(stores)
        rows = await _attempts(s.database_url, rid)
        assert [(r["attempt"], r["outcome"]) for r in rows] == [(1, "unknown"), (2, "succeeded")]
        assert rows[0]["error_class"] == "RedisLost" and rows[1]["token"] == second.token
        assert first.token < rows[0]["token"] < second.token, "the unknown row carries the new epoch's floor"
        conn = await asyncpg.connect(s.database_url)
        try:
            ev = await conn.fetchrow("SELECT attempt, reason, actor FROM events WHERE run_id = $1 "
                                     "AND type = 'attempt_unknown'", rid)
        finally:
            await conn.close()
        assert ev is not None and (ev["attempt"], ev["reason"], ev["actor"]) == (1, "redis_lost", "reconciler")
        # A second loss after the run finished changes nothing: terminal runs are not marked.
        await stores.redis.flushall()
        assert (await rebuild_queue(stores, Q))["unknown"] == 0
    finally:
        await client.close()
        await stores.close()


async def test_runs_never_claimed_are_marked_only_once_per_loss(settings: Settings, server: RedisServer) -> None:
    """Every waiting run is one the lost dataset may have claimed: one unknown attempt per
    loss, numbers climbing; a run submitted after the rebuild is not marked."""
    client, stores, s = await _connect(settings, server.url)
    try:
        ids = [await client.submit("t.noop") for _ in range(3)]
        await stores.redis.flushall()
        assert (await rebuild_queue(stores, Q))["unknown"] == 3
        late = await client.submit("t.noop")
        await stores.redis.flushall()
        assert (await rebuild_queue(stores, Q))["unknown"] == 4
        claimed = {}
        for _ in range(4):
            c = await _claim(stores)
            claimed[c.id] = c.attempt
        assert claimed == {**dict.fromkeys(ids, 3), late: 2}
        for rid in ids:
            assert [r["outcome"] for r in await _attempts(s.database_url, rid)] == ["unknown", "unknown"]
    finally:
        await client.close()
        await stores.close()


async def test_promoted_replica_that_missed_the_claim(settings: Settings) -> None:
    """The replica has the run PENDING at attempt 0 (it never saw the claim): the rebuild keeps
    no attempt number of that dataset; the next claim is attempt 2."""
    primary = await RedisServer().start()
    replica = await RedisServer(replicaof=primary).start()
    proxy = await TcpProxy("127.0.0.1", primary.port).start()
    client, stores, s = await _connect(settings, proxy.url(primary.url))
    try:
        rid = await client.submit("t.noop")
        p, r = primary.client(), replica.client()
        assert await p.execute_command("WAIT", 1, 2000) == 1  # the replica has the submit
        await r.execute_command("REPLICAOF", "NO", "ONE")  # cut off: it will never see the claim
        first = await _claim(stores)
        primary.kill()
        proxy.switch("127.0.0.1", replica.port)
        assert await r.hget(stores.keys(Q).run(rid), "state") == b"PENDING"
        stats = await rebuild_queue(stores, Q)
        assert stats["unknown"] == 1, stats
        second = await _claim(stores, "w2")
        assert (second.id, second.attempt) == (rid, 2) and second.token > first.token
        await record_all(stores)
        assert [(a["attempt"], a["outcome"]) for a in await _attempts(s.database_url, rid)] == [(1, "unknown"), (2, None)]
        await p.aclose()
        await r.aclose()
    finally:
        await client.close()
        await stores.close()
        await proxy.close()
        primary.cleanup()
        replica.cleanup()


async def test_durable_claim_survives_promotion_with_its_token(settings: Settings) -> None:
    """Durable-claim mode: the claim batch returns only with the replica's acknowledgement, so
    the promoted replica holds the lease. The rebuild interrupts that exact attempt (its real
    token in the attempts table), marks the next number unknown (the old primary may have gone
    on), and the recorder replaying the replica's stream never moves the run back."""
    primary = await RedisServer().start()
    replica = await RedisServer(replicaof=primary).start()
    proxy = await TcpProxy("127.0.0.1", primary.port).start()
    client, stores, s = await _connect(settings, proxy.url(primary.url))
    try:
        rid = await client.submit("t.noop")
        batch = await stores.scripts.claim_due_replicated(
            stores.keys(Q), ClaimArgs(1, "w1", 60_000, 10), 1, 2000)
        assert batch.replicas == 1 and [c.id for c in batch.claimed] == [rid]
        first = batch.claimed[0]
        r = replica.client()
        assert await r.hget(stores.keys(Q).run(rid), "token") == str(first.token).encode()
        primary.kill()
        await r.execute_command("REPLICAOF", "NO", "ONE")
        proxy.switch("127.0.0.1", replica.port)
        stats = await rebuild_queue(stores, Q)
        assert stats["interrupted"] == 1 and stats["unknown"] == 1, stats
        await record_all(stores)  # the replica's stream: claimed and interrupted events of attempt 1
        row = await _run_row(s.database_url, rid)
        assert (row["status"], row["attempt"]) == ("PENDING", 2), dict(row)
        second = await _claim(stores, "w2")
        assert (second.id, second.attempt) == (rid, 3) and second.token > first.token
        await record_all(stores)
        rows = await _attempts(s.database_url, rid)
        assert [(a["attempt"], a["outcome"]) for a in rows] == [(1, "interrupted"), (2, "unknown"), (3, None)]
        assert rows[0]["token"] == first.token
        await r.aclose()
    finally:
        await client.close()
        await stores.close()
        await proxy.close()
        primary.cleanup()
        replica.cleanup()


async def test_durable_claim_without_replica_runs_degraded_and_counted(settings: Settings, server: RedisServer) -> None:
    """A worker in durable mode with no replica to acknowledge keeps working, degraded and loudly
    (docs/worker.md, "Durable claims"; issue 22 item 5): the run starts under attempt 1 instead of
    being released unrun (which bumped attempt numbers with zero throughput), and it is counted."""
    client, stores, s = await _connect(settings, server.url)
    try:
        rid = await client.submit("t.noop")
        durable = Settings(redis_url=s.redis_url, database_url=s.database_url, prefix=s.prefix,
                           claim_replicas=1, claim_wait_ms=50)
        w = Worker(registry, WorkerOptions(queues=[Q], concurrency=2, processes=1), settings=durable)
        await w.stores.connect(database=False)
        before = metrics.CLAIMS_UNREPLICATED.labels(Q)._value.get()
        try:
            assert await w._claim(Q, 2) == 1
            for e in list(w.running.values()):
                if e.task is not None:
                    e.task.cancel()
        finally:
            await w.stores.close()
            await w.executors.close()
        assert metrics.CLAIMS_UNREPLICATED.labels(Q)._value.get() == before + 1
        assert metrics.DURABLE_DEGRADED.labels(Q)._value.get() == 1
        h = await stores.redis.hmget(stores.keys(Q).run(rid), "state", "attempt")
        assert h == [b"RUNNING", b"1"]
    finally:
        await client.close()
        await stores.close()


async def test_rebuild_records_the_event_of_a_finish_only_the_dataset_saw(settings: Settings,
                                                                          server: RedisServer) -> None:
    """Found by the chaos soak: a promoted replica holds a run SUCCEEDED whose stream entry is
    gone; the rebuild writes the outcome to PostgreSQL and, now, its event (history complete)."""
    client, stores, s = await _connect(settings, server.url)
    try:
        rid = await client.submit("t.noop")
        await record_all(stores)
        job = await _claim(stores)
        keys = stores.keys(Q)
        await stores.scripts.finish_runs(keys, FinishArgs(3),
                                         [Finish(rid, job.token, "ok", b"\x90", "", 0)])
        await stores.redis.delete(keys.events, keys.epoch)  # the entries are gone; the dataset is untrusted
        await rebuild_queue(stores, Q)
        row = await _run_row(s.database_url, rid)
        assert row["status"] == "SUCCEEDED"
        conn = await asyncpg.connect(s.database_url)
        try:
            n = await conn.fetchval("SELECT count(*) FROM history WHERE run_id = $1 AND to_status = 'SUCCEEDED'", rid)
        finally:
            await conn.close()
        assert n == 1, "the terminal transition has no event"
    finally:
        await client.close()
        await stores.close()
