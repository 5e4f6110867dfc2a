"""A refusal of one item is told from the store being away (DESIGN 8 without quarantining good work).

A bad item: the acknowledger sets a finish the script refuses aside alone, and every outcome batched
with it is acknowledged (it used to retry the whole batch forever, holding them all).

A store-wide refusal: a replica after a failover (READONLY), Redis at maxmemory under noeviction
(OOM), a long script (BUSY), a failed snapshot (MISCONF). The gateway types them RedisUnavailable, on
Redis 7 and on 6.2 (the embedded default, which wraps an error raised inside a script as
`...: -READONLY ...`), as redis-py parses each reply. The acknowledger then waits for the store with
the whole batch instead of halving it down to single items and setting every outcome aside as
REJECTED."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from redis._parsers.base import BaseParser

from fencepost.client import Client
from fencepost.core import metrics
from fencepost.core.errors import FencepostError, IllegalTransition, RedisUnavailable
from fencepost.core.hot import ClaimArgs, _script_error
from fencepost.core.models import Claimed
from fencepost.core.stores import Stores
from fencepost.worker.acks import Acknowledger

SCRIPT = "f_0bb86cbd1a37c22fb6375f28b68eb4061c1215dc"
AWAY = [
    "READONLY You can't write against a read only replica.",  # a plain command (ReadOnlyError)
    "ERR READONLY You can't write against a read only replica. script: 0bb8, on @user_script:7.",  # 7, guarded
    f"ERR Error running script (call to {SCRIPT}): @user_script:7: @user_script: 2: "
    "-READONLY You can't write against a read only replica.",  # 6.2
    "OOM command not allowed when used memory > 'maxmemory'.",  # OutOfMemoryError
    "ERR OOM command not allowed when used memory > 'maxmemory'. script: 0bb8, on @user_script:7.",
    f"ERR Error running script (call to {SCRIPT}): @user_script:7: @user_script: 2: "
    "-OOM command not allowed when used memory > 'maxmemory'.",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
    "NOPERM this user has no permissions to access one of the keys used as arguments",  # NoPermissionError
    f"ERR Error running script (call to {SCRIPT}): @user_script:7: @user_script: 2: "
    "-NOPERM this user has no permissions to access one of the keys used as arguments",
]


async def _claimed_failures(client: Client, stores: Stores, n: int) -> list[Claimed]:
    """N runs of t.fail claimed by worker "w", ready for the acknowledger."""
    ids = [await client.submit("t.fail") for _ in range(n)]
    jobs = await stores.scripts.claim_due(stores.keys("tq"), ClaimArgs(n, "w", 30_000, 100))
    assert sorted(j.id for j in jobs) == sorted(ids)
    return jobs


async def test_one_refused_finish_does_not_hold_the_batch(client: Client, stores: Stores,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    jobs = await _claimed_failures(client, stores, 5)
    keys = stores.keys("tq")
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


@pytest.mark.parametrize("reply", AWAY)
def test_a_store_wide_refusal_is_the_store_being_away(reply: str) -> None:
    assert isinstance(_script_error(BaseParser.parse_error(reply), ["fp:{q}:x"]), RedisUnavailable), reply


@pytest.mark.parametrize(("reply", "kind"), [
    ("ERR STATE 5 RUNNING pause", IllegalTransition),
    (f"ERR Error running script (call to {SCRIPT}): @user_script:40: attempt to compare number with nil",
     FencepostError),
    ("ERR BUSYKEY-ish OOMPH not a store refusal", FencepostError),
])
def test_a_script_error_stays_a_script_error(reply: str, kind: type[Exception]) -> None:
    err = _script_error(BaseParser.parse_error(reply), ["fp:{q}:x"])
    assert type(err) is kind and not isinstance(err, RedisUnavailable), (reply, err)


async def test_a_read_only_store_holds_the_batch_instead_of_rejecting_it(client: Client, stores: Stores,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = await _claimed_failures(client, stores, 4)
    real = stores.scripts._scripts["finish_runs"]
    refusals = {"left": 6}

    async def failing_over(**kw: Any) -> Any:  # the first calls land on a demoted primary
        if refusals["left"]:
            refusals["left"] -= 1
            raise BaseParser.parse_error(f"ERR Error running script (call to {SCRIPT}): @user_script:7: "
                                         "@user_script: 2: -READONLY You can't write against a read only replica.")
        return await real(**kw)

    monkeypatch.setitem(stores.scripts._scripts, "finish_runs", failing_over)
    acks = Acknowledger(stores)
    futs = [acks.add("tq", j.id, j.token, j.attempt, "error", "boom", "ValueError") for j in jobs]
    states = await asyncio.wait_for(asyncio.gather(*futs), timeout=30)
    assert states == ["RETRY_WAIT"] * 4, states
    assert refusals["left"] == 0
