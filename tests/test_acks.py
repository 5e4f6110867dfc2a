"""The acknowledger isolates a bad item: a finish the script refuses is set aside alone, and every
outcome batched with it is acknowledged (it used to retry the whole batch forever, holding them all)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fencepost.client import Client
from fencepost.core import metrics
from fencepost.core.hot import ClaimArgs
from fencepost.core.stores import Stores
from fencepost.worker.acks import Acknowledger


async def test_one_refused_finish_does_not_hold_the_batch(client: Client, stores: Stores,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    ids = [await client.submit("t.fail") for _ in range(5)]
    keys = stores.keys("tq")
    jobs = await stores.scripts.claim_due(keys, ClaimArgs(5, "w", 30_000, 100))
    assert sorted(j.id for j in jobs) == sorted(ids)
    bad = jobs[2]
    await stores.redis.hset(stores.keys("tq").run(bad.id), "max_retries", "x")  # the script errors on it
    before = metrics.QUARANTINED.labels("acks", "finish")._value.get()
    acks = Acknowledger(stores)
    futs = [acks.add("tq", j.id, j.token, j.attempt, "error", "boom", "ValueError") for j in jobs]
    with caplog.at_level(logging.INFO, logger="fencepost.worker"):
        states = await asyncio.wait_for(asyncio.gather(*futs), timeout=20)
    by_id = {j.id: s for j, s in zip(jobs, states)}
    assert by_id.pop(bad.id) == "REJECTED"
    # the items a refused call had applied before the error are reported applied on the retry (issue 22
    # item 11: they came back STALE and were logged "late finish ... stale" although they had been applied)
    assert set(by_id.values()) == {"RETRY_WAIT"}
    assert "stale_finish" not in [getattr(r, "event", None) for r in caplog.records], caplog.text
    for rid in by_id:
        assert (await stores.redis.hget(keys.run(rid), "state")) == b"RETRY_WAIT"
    assert (await stores.redis.hget(keys.run(bad.id), "state")) == b"RUNNING", "left to its lease and the reaper"
    assert metrics.QUARANTINED.labels("acks", "finish")._value.get() == before + 1
