"""Recorders as replicas do not fight (issue 23 item 5): two recorders on one stream, one holding the
claims of a few hundred runs and the other their finishes in the opposite order, record at the same time
without a deadlock, and the history is complete whichever commits first."""

from __future__ import annotations

import asyncio

from fencepost.client import Client
from fencepost.core.hot import ClaimArgs, Finish, FinishArgs
from fencepost.core.models import Submit
from fencepost.core.stores import Stores
from fencepost.reconciler.recorder import GROUP, Recorder


async def test_two_recorders_on_one_stream_record_crossing_batches_without_deadlock(
        client: Client, stores: Stores) -> None:
    keys = stores.keys("tq")
    stream = keys.events
    a, b = Recorder(stores, consumer="a"), Recorder(stores, consumer="b")
    await a._ensure_groups(["tq"])
    everyone: list[int] = []
    for _ in range(4):
        ids = await client.submit_many([Submit(handler="t.noop") for _ in range(300)])
        everyone += ids
        jobs = await stores.scripts.claim_due(keys, ClaimArgs(300, "w", 30_000, 100))
        assert len(jobs) == 300
        claims = await stores.redis.xreadgroup(GROUP, "a", {stream: ">"})  # a holds the claims
        await stores.scripts.finish_runs(keys, FinishArgs(3), [Finish(j.id, j.token, "ok", b"\xc0", "", 0)
                                                               for j in reversed(jobs)])  # finished in reverse
        finishes = await stores.redis.xreadgroup(GROUP, "b", {stream: ">"})  # b holds the finishes
        held_a = [(stream, eid, f) for eid, f in claims[0][1]]
        held_b = [(stream, eid, f) for eid, f in finishes[0][1]]
        assert len(held_a) == len(held_b) == 300
        await asyncio.gather(a.record(held_a, fresh=True), b.record(held_b, fresh=True))  # no DeadlockDetected
    pool = stores.db.pool
    assert pool is not None
    statuses = {r["status"] for r in await stores.db.fetch("run_status", everyone)}
    assert statuses == {"SUCCEEDED"}, "the projection took the finish, whichever batch committed first"
    att = await pool.fetch("SELECT run_id, count(*) AS n, bool_and(claim_version = 1 AND finish_version = 2 "
                           "AND outcome = 'succeeded') AS whole FROM attempts GROUP BY run_id")
    assert len(att) == len(everyone) and all(r["n"] == 1 and r["whole"] for r in att), \
        "one attempt row per run holding its claim and its finish"
    assert a.recorded + b.recorded == 2 * len(everyone)
