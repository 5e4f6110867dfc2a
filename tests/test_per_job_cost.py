"""The per-job cuts of issue 18 keep every guarantee: event rows written by COPY are never doubled
(a batch already recorded falls back to the ON CONFLICT insert), and trimming the recorded part of a
stream never drops an entry another recorder still holds unrecorded; a finished execution is freed by
reference counting, not left to the cycle collector (issue 23)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core import tracing
from fencepost.core.config import Settings
from fencepost.core.hot import ClaimArgs, Finish, FinishArgs
from fencepost.core.models import Submit
from fencepost.core.stores import Stores
from fencepost.reconciler.recorder import GROUP, Recorder
from fencepost.worker.context import Context
from fencepost.worker.runtime import Worker, WorkerOptions
from tests.apps import registry


async def _run_three(client: Client, stores: Stores) -> list[int]:
    """Three runs claimed and finished: six transitions in the queue's stream."""
    ids = [await client.submit("t.noop") for _ in range(3)]
    keys = stores.keys("tq")
    jobs = await stores.scripts.claim_due(keys, ClaimArgs(3, "w", 30_000, 100))
    assert sorted(j.id for j in jobs) == sorted(ids)
    done = await stores.scripts.finish_runs(keys, FinishArgs(3),
                                            [Finish(j.id, j.token, "ok", b"\xc0", "", 0) for j in jobs])
    assert {d.state for d in done} == {"SUCCEEDED"}
    return ids


async def _stream_events(stores: Stores) -> list[tuple[int, str, int]]:
    rows = await stores.db.pool.fetch(  # type: ignore[union-attr]
        "SELECT run_id, type, version FROM history WHERE stream_id IS NOT NULL ORDER BY run_id, version")
    return [(r["run_id"], r["type"], r["version"]) for r in rows]


async def test_a_fresh_batch_already_recorded_is_not_recorded_twice(client: Client, stores: Stores) -> None:
    ids = await _run_three(client, stores)
    stream = stores.keys("tq").events
    entries = [(stream, eid, f) for eid, f in await stores.redis.xrange(stream)]
    assert len(entries) == 6
    rec = Recorder(stores, consumer="a")
    await rec._ensure_groups(["tq"])
    await rec.record(entries, fresh=True)  # by COPY
    first = await _stream_events(stores)
    assert first == sorted((rid, t, v) for rid in ids for t, v in (("claimed", 1), ("succeeded", 2)))
    await rec.record(entries, fresh=True)  # as if read fresh again: the COPY is refused, ON CONFLICT skips
    assert await _stream_events(stores) == first
    assert rec.recorded == 6
    statuses = {r["id"]: (r["status"], r["attempt"]) for r in await stores.db.pool.fetch(  # type: ignore[union-attr]
        "SELECT id, status, attempt FROM runs WHERE id = ANY($1::bigint[])", ids)}
    assert statuses == dict.fromkeys(ids, ("SUCCEEDED", 1))
    att = await stores.db.pool.fetch("SELECT run_id, outcome FROM attempts")  # type: ignore[union-attr]
    assert sorted((r["run_id"], r["outcome"]) for r in att) == [(rid, "succeeded") for rid in sorted(ids)]


async def test_trimming_keeps_what_another_recorder_has_not_recorded(client: Client, stores: Stores) -> None:
    await _run_three(client, stores)
    stream = stores.keys("tq").events
    a, b = Recorder(stores, consumer="a"), Recorder(stores, consumer="b")
    await a._ensure_groups(["tq"])
    held = await stores.redis.xreadgroup(GROUP, "a", {stream: ">"}, count=2)  # a reads two, then stalls
    assert len(held[0][1]) == 2
    assert await b.run_once(block_ms=10) == 4
    left = {eid for eid, _ in await stores.redis.xrange(stream)}
    assert {eid for eid, _ in held[0][1]} <= left, "the entries a holds unrecorded must stay in the stream"
    assert len(await _stream_events(stores)) == 4
    assert await a.run_once(pending=True) == 2  # a comes back and records what it held
    assert await stores.redis.xlen(stream) == 0, "once nothing is pending, everything delivered is trimmed"
    assert len(await _stream_events(stores)) == 6
    assert (await stores.redis.xpending(stream, GROUP))["pending"] == 0


async def test_a_finished_execution_is_freed_without_the_cycle_collector(client: Client, settings: Settings) -> None:
    """Issue 23: an execution's context reached its entry through the fence test (ctx._fence_due and
    ctx._fence_at were partials over the entry, which holds the context), so every job's entry,
    context, claim and task were a reference cycle that only the cycle collector freed. With 100
    running, the survivors were promoted to the older generations and full collections ran far more
    often: gc_collect_main rose from 6.5 to 14.5 % of a draining worker's samples (py-spy --native).
    A finished execution now drops those references, so reference counting frees it at once."""
    ids = await client.submit_many([Submit(handler="t.noop")] * 20)
    w = Worker(registry, WorkerOptions(queues=["tq"], concurrency=10, processes=1, burst=True), settings=settings)
    gc.collect()
    gc.disable()
    try:
        await asyncio.wait_for(w.run(), 30)
        assert w.claimed == 20
        # what is still tracked (garbage included: nothing collects it while gc is off)
        left = sum(1 for o in gc.get_objects() if isinstance(o, Context) and o.run_id in ids)
    finally:
        gc.enable()
    assert left == 0, f"{left} of 20 finished executions were still alive without the cycle collector"


async def test_the_tracer_is_looked_up_once_per_claimed_batch(client: Client, settings: Settings,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23: each execution asked OpenTelemetry for the tracer provider (os.environ lookups, 3.5 % of
    a draining worker's samples); a claimed batch now asks once and its executions share the answer."""
    await client.submit_many([Submit(handler="t.noop")] * 20)
    lookups = 0
    real = tracing._tracer

    def counted() -> Any:
        nonlocal lookups
        lookups += 1
        return real()

    monkeypatch.setattr(tracing, "_tracer", counted)
    w = Worker(registry, WorkerOptions(queues=["tq"], concurrency=20, processes=1, burst=True), settings=settings)
    claims = 0
    claim_due = w.stores.scripts.claim_due

    async def counted_claim(keys: Any, args: Any) -> Any:
        nonlocal claims
        jobs = await claim_due(keys, args)
        claims += bool(jobs)
        return jobs

    w.stores.scripts.claim_due = counted_claim  # type: ignore[method-assign]
    await asyncio.wait_for(w.run(), 30)
    assert w.claimed == 20
    assert lookups <= claims < 20, f"{lookups} tracer lookups for 20 executions in {claims} claimed batches"
