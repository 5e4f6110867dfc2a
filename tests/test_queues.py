"""Queues exist once declared (issue 15, item 5): a worker or a registered handler creates and stamps
its queues, so no claim waits on a queue that never had a job, `queue pause` works before the first
job, an outbox submit to a new queue is no rebuild, and an unstamped queue never delays the others."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator

import asyncpg
import pytest

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import UnknownQueue
from fencepost.core.hot import StampArgs
from fencepost.core.queues import declare_queues, require_queue
from fencepost.core.registry import Registry
from fencepost.core.stores import Stores
from fencepost.reconciler.outbox import OutboxRelay
from fencepost.reconciler.rebuild import untrusted_queues
from fencepost.reconciler.service import Reconciler
from fencepost.worker import runtime
from fencepost.worker.runtime import Worker, WorkerOptions
from tests.apps import registry as apps

NINE = ["tq", "prio", "bulk", "mail", "reports", "exports", "hooks", "media", "search"]


@pytest.fixture
def claim_sleeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Every asyncio.sleep awaited directly by Worker._claim: the claim path must never wait."""
    seen: list[float] = []
    real = asyncio.sleep

    def sleep(delay: float, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if sys._getframe(1).f_code.co_name == "_claim":
            seen.append(delay)
        return real(delay, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    yield seen


async def _burst(settings: Settings, queues: list[str]) -> Worker:
    worker = Worker(apps, WorkerOptions(queues=queues, concurrency=10, processes=1, burst=True), settings=settings)
    await asyncio.wait_for(worker.run(), 60)
    return worker


async def test_a_worker_on_nine_fresh_queues_claims_without_waiting(settings: Settings, client: Client,
                                                                    stores: Stores, claim_sleeps: list[float]) -> None:
    """The issue's reproduction: nine --queue options on a fresh database, three no-op jobs."""
    ids = [await client.submit("t.noop") for _ in range(3)]
    worker = await _burst(settings, NINE)
    assert worker.claimed == 3
    assert claim_sleeps == [], "a claim waited on a queue that never had a job"
    for rid in ids:
        assert (await client.wait(rid, timeout=10)).status == "SUCCEEDED"
    assert await untrusted_queues(stores) == [], "every queue the worker serves is stamped"
    await client.pause_queue("prio", reason="before its first job")  # exists: no UnknownQueue
    assert (await require_queue(stores, "prio"))["paused"] is True
    assert await stores.redis.get(stores.keys("prio").paused) == b"1"


async def test_register_declares_the_handlers_queues(settings: Settings, stores: Stores) -> None:
    reg = Registry()

    @reg.job("r.report", queue="reports-nightly")
    async def report(ctx) -> None:
        return None

    async with Client(settings=settings) as c:
        with pytest.raises(UnknownQueue):
            await c.pause_queue("reports-nightly")
        await c.register(reg)
        await c.pause_queue("reports-nightly")
        await c.resume_queue("reports-nightly")
    assert "reports-nightly" not in await untrusted_queues(stores)
    assert await declare_queues(stores, ["reports-nightly"]) == [], "declaring again creates nothing"


async def test_an_unstamped_queue_never_delays_the_others(settings: Settings, client: Client, stores: Stores,
                                                          claim_sleeps: list[float]) -> None:
    """Redis forgot eight queues (their stamps are gone): the ninth still drains at once."""
    await declare_queues(stores, NINE)
    for q in NINE[1:]:
        await stores.redis.delete(stores.keys(q).epoch)
    assert sorted(await untrusted_queues(stores)) == sorted(NINE[1:])
    ids = [await client.submit("t.noop") for _ in range(3)]
    worker = await _burst(settings, NINE)
    assert worker.claimed == 3 and claim_sleeps == []
    for rid in ids:
        assert (await client.wait(rid, timeout=10)).status == "SUCCEEDED"


async def test_the_unstamped_warning_is_logged_once_per_state_change(settings: Settings, stores: Stores,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(runtime, "UNSTAMPED_RECHECK_S", 0.0)  # ask on every round, as a busy loop would
    await declare_queues(stores, ["lost"])
    epoch = (await require_queue(stores, "lost"))["epoch"]
    await stores.redis.delete(stores.keys("lost").epoch)
    worker = Worker(apps, WorkerOptions(queues=["lost"], processes=1), settings=settings)
    await worker.stores.connect()
    try:
        with caplog.at_level(logging.INFO, logger="fencepost.worker"):
            for _ in range(20):
                assert await worker._claim("lost", 10) == 0
            await stores.scripts.stamp_queue(stores.keys("lost"), StampArgs(epoch, force=1))
            for _ in range(5):
                assert await worker._claim("lost", 10) == 0
    finally:
        await worker.stores.close()
    events = [getattr(r, "event", None) for r in caplog.records if getattr(r, "queue", None) == "lost"]
    assert events == ["claim_unstamped", "claim_stamped"]


async def test_an_outbox_submit_to_a_new_queue_is_not_a_rebuild(settings: Settings, client: Client,
                                                                 stores: Stores) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        async with conn.transaction():
            rid = await client.submit("t.echo", "x", queue="outboxed", connection=conn)
    finally:
        await conn.close()
    assert "outboxed" not in await untrusted_queues(stores)
    rec = Reconciler(settings, tick_s=0.05)
    await rec.stores.connect()
    try:
        await rec.maintain_once()
        assert [q for _, q in rec.rebuilt] == [], "a new queue was taken for a forgotten one"
    finally:
        await rec.outbox.close()
        await rec.stores.close()
    relay = OutboxRelay(stores)
    assert await relay.relay() == 0, "the reconciler's pass already relayed it"
    assert await stores.redis.hget(stores.keys("outboxed").run(rid), "state") == b"PENDING"
