"""Wake on time, not on timeout (issue 18, item 3): an idle worker waits until the earliest delayed
or retry-wait run of its queues is due (or a wake push), so a run due at T starts at T, not when
the idle wait happens to end. The workers here idle for 30 s at a time: every wait below is bounded
well under that, so a run that waited for the idle timeout fails the test."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit
from fencepost.core.registry import Registry
from fencepost.worker.runtime import Worker, WorkerOptions

pytestmark = pytest.mark.asyncio

IDLE_S = 30.0
BOUND_S = 10.0  # far below IDLE_S: only a timed wake gets the runs done in time

registry = Registry()
failed_once: set[int] = set()


@registry.job("wake.stamp", queue="wq")
async def stamp(ctx) -> float:
    return time.time()


@registry.job("wake.flaky", queue="wq", max_retries=3)
async def flaky(ctx) -> float:
    if ctx.attempt == 1:
        raise ConnectionError("first attempt fails; the retry waits in RETRY_WAIT")
    return time.time()


@pytest_asyncio.fixture
async def wq(settings: Settings) -> AsyncIterator[Client]:
    c = await Client(settings=settings).connect()
    await c.register(registry)
    yield c
    await c.close()


@pytest_asyncio.fixture
async def idle_worker(settings: Settings, wq: Client) -> AsyncIterator[Worker]:
    """A worker (not burst) whose idle wait is 30 s, past its start-up: it has run one job and
    gone back to its idle wait before the test submits anything."""
    worker = Worker(registry, WorkerOptions(queues=["wq"], concurrency=50, idle_wait_s=IDLE_S), settings=settings)
    task = asyncio.ensure_future(worker.run())
    await _outcomes(wq, [await wq.submit("wake.stamp")])
    yield worker
    worker.request_stop()
    await asyncio.wait_for(task, BOUND_S)


async def _outcomes(client: Client, ids: list[int]) -> list[float]:
    deadline = time.monotonic() + BOUND_S
    outs = [await client.wait(i, timeout=max(deadline - time.monotonic(), 0.01)) for i in ids]
    assert {o.status for o in outs} == {"SUCCEEDED"}, outs
    return [float(o.result) for o in outs]


async def test_a_delayed_run_starts_when_due_not_when_the_idle_wait_ends(wq: Client, idle_worker: Worker) -> None:
    due = datetime.now(UTC) + timedelta(seconds=0.5)
    run_id = await wq.submit("wake.stamp", run_at=due)  # the submit's push wakes the worker: nothing due yet
    [started] = await _outcomes(wq, [run_id])  # before: the worker slept its 30 s idle wait first
    assert started >= due.timestamp(), "a delayed run must not start before its run_at"


async def test_a_spike_of_runs_due_at_one_instant_all_start(wq: Client, idle_worker: Worker) -> None:
    due = datetime.now(UTC) + timedelta(seconds=0.5)
    ids = await wq.submit_many([Submit(handler="wake.stamp", run_at=due)] * 200)
    starts = await _outcomes(wq, ids)
    assert min(starts) >= due.timestamp()


async def test_an_earlier_delayed_run_moves_the_wake_up_forward(wq: Client, idle_worker: Worker) -> None:
    late = await wq.submit("wake.stamp", run_at=datetime.now(UTC) + timedelta(hours=1))
    due = datetime.now(UTC) + timedelta(seconds=0.3)
    early = await wq.submit("wake.stamp", run_at=due)
    [started] = await _outcomes(wq, [early])
    assert started >= due.timestamp()
    assert (await wq.get(late))["status"] == "PENDING"


async def test_a_retry_starts_when_its_backoff_ends(wq: Client, idle_worker: Worker) -> None:
    """The retry lands in the delayed set while the worker idles (finish_runs pushes a wake when a
    retry becomes the earliest delayed run); before, it waited for the 30 s idle timeout."""
    run_id = await wq.submit("wake.flaky")
    out = await wq.wait(run_id, timeout=BOUND_S)
    assert out.status == "SUCCEEDED"
    hot = await wq.stores.redis.hget(wq.stores.keys("wq").run(run_id), "attempt")
    assert hot == b"2"


async def test_a_paused_queue_with_due_runs_does_not_spin_the_timer(wq: Client, idle_worker: Worker) -> None:
    """A delayed run that came due on a paused queue is offered to one claim, then left to the
    resume's push: the idle wait does not ring for it again and again."""
    keys = wq.stores.keys("wq")
    await wq.stores.redis.set(keys.paused, 1)
    run_id = await wq.submit("wake.stamp", run_at=datetime.now(UTC) + timedelta(seconds=0.2))
    claims = 0
    real = idle_worker.stores.scripts.claim_due

    async def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal claims
        claims += 1
        return await real(*args, **kwargs)

    idle_worker.stores.scripts.claim_due = counted  # type: ignore[method-assign]
    deadline = time.monotonic() + BOUND_S
    while idle_worker._due_seen.get("wq", 0) < int(time.time() * 1000) - 200 or claims == 0:
        assert time.monotonic() < deadline, "the worker never woke for the due run"
        await asyncio.sleep(0.02)
    settled = claims
    # another wake-up on the queue: the worker claims once more, and the paused run rings no timer
    await wq.submit("wake.stamp", run_at=datetime.now(UTC) + timedelta(hours=1))
    deadline = time.monotonic() + BOUND_S
    while claims == settled:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert claims - settled <= 2, f"{claims - settled} claims for one push: the timer keeps ringing"
    await wq.stores.redis.delete(keys.paused)
    await wq.stores.redis.rpush(keys.wake, 1)
    await _outcomes(wq, [run_id])
