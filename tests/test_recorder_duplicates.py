"""The recorder records a transition once per (run, type, version), whatever the stream delivers.

The 10-minute chaos soak found `lease_expired` recorded twice, both rows from the stream: a lagging
replica was promoted without the reaper's write, so the run was RUNNING again at the old version,
was reaped again, and the stream carried a second entry for the same (run, version). Stream ids
differ, so the (stream, stream_id, at) key did not catch it. Real Redis and PostgreSQL.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.hot import ClaimArgs, ReapArgs
from fencepost.core.stores import Stores
from tests.conftest import record_all

Q = "tq"


async def _rows(settings: Settings, rid: int) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
    """The run's lease_expired event rows and its attempt rows."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        events = await conn.fetch("SELECT version, stream_id FROM events WHERE run_id = $1 "
                                  "AND type = 'lease_expired' ORDER BY id", rid)
        attempts = await conn.fetch("SELECT attempt, token, started_at, finished_at, outcome, recorded_at "
                                    "FROM attempts WHERE run_id = $1 ORDER BY attempt", rid)
        return events, attempts
    finally:
        await conn.close()


async def _leased(client: Client, stores: Stores) -> int:
    rid = await client.submit("t.noop", queue=Q)
    jobs = await stores.scripts.claim_due(stores.keys(Q), ClaimArgs(1, "w-old", 200, 10))
    assert [j.id for j in jobs] == [rid]
    await record_all(stores)
    return rid


async def _reap(stores: Stores) -> None:
    for _ in range(100):  # the 200 ms lease passes on the Redis clock (bounded wait)
        if await stores.scripts.reap_expired(stores.keys(Q), ReapArgs(100)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the lease was not reaped")


async def _expiry_entry(stores: Stores, rid: int) -> dict[bytes, bytes]:
    entries = await stores.redis.xrange(stores.keys(Q).events)
    found = [f for _, f in entries if f[b"type"] == b"lease_expired" and int(f[b"run"]) == rid]
    assert len(found) == 1, entries
    return found[0]


async def test_a_transition_the_stream_delivers_twice_is_recorded_once(
        client: Client, stores: Stores, settings: Settings) -> None:
    """The same entry's fields under two more stream ids: one in the batch of the first, one after it
    was recorded (the duplicate's batch comes later)."""
    rid = await _leased(client, stores)
    await _reap(stores)
    fields: dict[Any, Any] = await _expiry_entry(stores, rid)
    await stores.redis.xadd(stores.keys(Q).events, fields)
    await record_all(stores)
    events, attempts = await _rows(settings, rid)
    assert len(events) == 1, [dict(r) for r in events]
    assert [a["outcome"] for a in attempts] == ["interrupted"]
    await stores.redis.xadd(stores.keys(Q).events, fields)
    await record_all(stores)
    again, attempts_again = await _rows(settings, rid)
    assert [dict(r) for r in again] == [dict(r) for r in events], "no second row from a later batch"
    assert [dict(r) for r in attempts_again] == [dict(r) for r in attempts], "the attempt row is not rewritten"
    assert (await client.get(rid))["status"] == "PENDING"


async def test_a_reap_repeated_after_a_lost_write_is_recorded_once(
        client: Client, stores: Stores, settings: Settings) -> None:
    """The reap is recorded, then its write is lost (the run's hash and its active member put back as a
    lagging replica had them) and the run is reaped again at the same version."""
    rid = await _leased(client, stores)
    keys = stores.keys(Q)
    before = await stores.redis.hgetall(keys.run(rid))
    score = await stores.redis.zscore(keys.active, rid)
    assert score is not None and before[b"state"] == b"RUNNING"
    await _reap(stores)
    first = await _expiry_entry(stores, rid)
    await record_all(stores)
    events, attempts = await _rows(settings, rid)
    assert len(events) == 1 and [a["outcome"] for a in attempts] == ["interrupted"]
    version = (await client.get(rid))["version"]

    pipe = stores.redis.pipeline(transaction=True)  # the promoted replica never saw the reap
    pipe.delete(keys.run(rid))
    pipe.hset(keys.run(rid), mapping=before)
    pipe.zadd(keys.active, {rid: score})
    await pipe.execute()
    await _reap(stores)
    second = await _expiry_entry(stores, rid)
    assert second[b"v"] == first[b"v"], "the same transition at the same version"
    await record_all(stores)

    again, attempts_again = await _rows(settings, rid)
    assert len(again) == 1, [dict(r) for r in again]
    assert [dict(r) for r in attempts_again] == [dict(r) for r in attempts], "the attempt row is not rewritten"
    run = await client.get(rid)
    assert run["status"] == "PENDING" and run["version"] == version


async def test_a_queue_missing_from_redis_set_of_queues_is_still_recorded(
        client: Client, stores: Stores, settings: Settings) -> None:
    """The cluster soak's untraced execution: a queue created while the node holding the set of
    queues failed over ran its runs on a healthy shard, but its SADD failed, so the recorder (which
    read the queue list from that set only) never read its stream: an execution without an attempt
    row. PostgreSQL's queue list is read too."""
    rid = await client.submit("t.noop", queue=Q)
    await stores.redis.srem(stores.queues_key, Q)
    jobs = await stores.scripts.claim_due(stores.keys(Q), ClaimArgs(1, "w-new", 60_000, 10))
    assert [j.id for j in jobs] == [rid]
    await record_all(stores)
    _, attempts = await _rows(settings, rid)
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, None)], "the claim is recorded"
    assert (await client.get(rid))["status"] == "RUNNING"


async def test_two_recorder_replicas_each_handed_one_copy_record_it_once(
        client: Client, stores: Stores, settings: Settings) -> None:
    """Two replicas of the recorder, each handed one of two copies of the same transition, check and
    write in concurrent transactions: the run's advisory lock (lock_transitions) makes the second
    see the first's row. The lock is held from outside until both batches wait on it (pg_locks), so
    without it both would have written before it is let go."""
    from fencepost.reconciler.recorder import Recorder

    rid = await _leased(client, stores)
    await _reap(stores)
    fields: dict[Any, Any] = await _expiry_entry(stores, rid)
    stream = stores.keys(Q).events
    await stores.redis.xadd(stream, fields)
    copies = [(stream, eid, f) for eid, f in await stores.redis.xrange(stream)
              if f[b"type"] == b"lease_expired"]
    assert len(copies) == 2
    holder = await asyncpg.connect(settings.database_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT pg_advisory_xact_lock(1179796292, ($1::bigint & 2147483647)::integer)", rid)
        a, b = Recorder(stores, consumer="replica-a"), Recorder(stores, consumer="replica-b")
        tasks = [asyncio.ensure_future(a._record([copies[0]])), asyncio.ensure_future(b._record([copies[1]]))]

        async def both_wait() -> bool:
            done = [t for t in tasks if t.done()]
            for t in done:
                t.result()  # a replica that wrote without waiting: the race is open
            if done:
                raise AssertionError(f"{len(done)} replica(s) recorded without waiting for the run's lock")
            n = await holder.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                                      "AND classid = 1179796292")
            return n == 2

        from tests.conftest import wait_until
        await wait_until(both_wait, timeout=30, what="both replicas waiting on the run's lock")
        await tx.commit()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    finally:
        await holder.close()
    events, attempts = await _rows(settings, rid)
    assert len(events) == 1, [dict(r) for r in events]
    assert [a["outcome"] for a in attempts] == ["interrupted"]
