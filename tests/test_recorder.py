"""The recorder isolates an entry PostgreSQL refuses instead of stalling behind it."""

from __future__ import annotations

import time

from fencepost.client import Client
from fencepost.core.stores import Stores
from tests.conftest import record_all


async def test_a_poison_entry_is_quarantined_and_the_rest_recorded(client: Client, stores: Stores) -> None:
    good = [await client.submit("t.echo", i) for i in range(3)]
    bad = await client.submit("t.echo", "bad")
    keys = stores.keys("tq")
    now = int(time.time() * 1000)

    def paused(rid: int) -> dict:
        return {"run": rid, "type": "paused", "from": "PENDING", "to": "PAUSED", "v": 1, "ts": now, "actor": "test"}

    for rid in good[:2]:
        await stores.redis.xadd(keys.events, paused(rid))
    # a state the runs table's CHECK refuses (a bug or corrupt data in the stream)
    await stores.redis.xadd(keys.events, {"run": bad, "type": "paused", "from": "PENDING", "to": "BOGUS",
                                          "v": 1, "ts": now})
    await stores.redis.xadd(keys.events, {"run": bad, "type": "claimed", "from": "PENDING", "to": "RUNNING",
                                          "v": 2, "ts": now, "attempt": 1, "token": 7, "worker": "w",
                                          "lease": "not-a-number"})  # malformed: fails before PostgreSQL
    await stores.redis.xadd(keys.events, paused(good[2]))
    await record_all(stores)

    statuses = {r["id"]: r["status"] for r in await stores.db.fetch("run_status", [*good, bad])}
    assert [statuses[g] for g in good] == ["PAUSED"] * 3, "entries around the poison one are recorded"
    assert statuses[bad] == "PENDING", "the refused transition changed nothing"
    poison = await stores.redis.xrange(f"{stores.settings.prefix}:recorder:poison")
    assert [int(f[b"run"]) for _, f in poison] == [bad, bad] and b"BOGUS" in poison[0][1][b"to"]
    assert await stores.redis.xlen(keys.events) == 0, "the stream moved on"
    n = await stores.db.pool.fetchval("SELECT count(*) FROM history WHERE run_id = ANY($1)", good)  # type: ignore[union-attr]
    assert n == 6, "each good run: submitted + paused, once"
