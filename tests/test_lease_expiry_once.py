"""A lease expiry is in the history once (the chaos soak's "lease_expired of run N was recorded
twice, once from the stream and once written directly"). The reaper (reap_expired.lua) or a
rebuild's repair_interrupt.lua ends the lease in Redis and appends `lease_expired` to the queue's
stream; a rebuild that then finds PostgreSQL still holding the lease closed it there with
drift_interrupt_lost, which wrote a `lease_expired` event of its own before the recorder read the
stream entry. Real Redis and PostgreSQL; the recorder is run only after the rebuild, the
interleaving the soak hit.
"""

from __future__ import annotations

import asyncio

import asyncpg

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.hot import ClaimArgs, ReapArgs
from fencepost.core.stores import Stores
from fencepost.reconciler.drift import DriftRepair
from fencepost.reconciler.rebuild import rebuild_queue
from tests.conftest import record_all

Q = "tq"


async def _expiries(settings: Settings, rid: int) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(settings.database_url)
    try:
        return await conn.fetch("SELECT version, stream_id, actor FROM events WHERE run_id = $1 "
                                "AND type = 'lease_expired' ORDER BY id", rid)
    finally:
        await conn.close()


async def _leased(client: Client, stores: Stores, lease_ms: int) -> int:
    rid = await client.submit("t.noop", queue=Q)
    jobs = await stores.scripts.claim_due(stores.keys(Q), ClaimArgs(1, "w-old", lease_ms, 10))
    assert [j.id for j in jobs] == [rid]
    await record_all(stores)
    assert (await client.get(rid))["status"] == "RUNNING"
    return rid


async def test_a_reaped_lease_is_recorded_once_when_drift_finds_its_hash_gone_before_the_recorder(
        client: Client, stores: Stores, settings: Settings) -> None:
    """The reaper's lease_expired is in the stream; the run's hash is then gone (evicted, a shard
    that lost the key) while PostgreSQL still has it RUNNING: drift's lost_lease repair closed it
    with its own lease_expired event, and the recorder wrote the stream's one as well."""
    rid = await _leased(client, stores, 300)
    keys = stores.keys(Q)
    reaped = 0
    for _ in range(100):  # the lease passes on the Redis clock (bounded wait)
        reaped = await stores.scripts.reap_expired(keys, ReapArgs(100))
        if reaped:
            break
        await asyncio.sleep(0.05)
    assert reaped == 1
    assert (await client.get(rid))["status"] == "RUNNING", "the recorder has not read the reap yet"
    await stores.redis.delete(keys.run(rid))
    found = await DriftRepair(stores, grace_s=0.0).full_pass(Q, repair=True, grace_s=0.0)
    assert [d.kind for d in found if d.run_id == rid] == ["lost_lease"], found
    await record_all(stores)
    rows = await _expiries(settings, rid)
    assert len(rows) == 1, [dict(r) for r in rows]
    assert rows[0]["stream_id"] is not None, "the stream's entry is the one kept"
    assert (await client.get(rid))["status"] == "PENDING"


async def test_a_lease_a_rebuild_interrupts_is_recorded_once(
        client: Client, stores: Stores, settings: Settings) -> None:
    rid = await _leased(client, stores, 60_000)
    keys = stores.keys(Q)
    await stores.redis.delete(keys.epoch)
    stats = await rebuild_queue(stores, Q)
    assert stats["interrupted"] == 1, stats
    await record_all(stores)
    rows = await _expiries(settings, rid)
    assert len(rows) == 1, [dict(r) for r in rows]
    assert (await client.get(rid))["status"] == "PENDING"
    conn = await asyncpg.connect(settings.database_url)
    try:
        outcomes = [r["outcome"] for r in await conn.fetch(
            "SELECT outcome FROM attempts WHERE run_id = $1 ORDER BY attempt", rid)]
    finally:
        await conn.close()
    assert outcomes[0] == "interrupted", outcomes
