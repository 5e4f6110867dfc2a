"""`Client.enqueue_behind` (issue 23 item 3): a submit returns once PostgreSQL committed its run, its
Redis enqueue goes out behind it (coalesced with the other submits' enqueues), close() waits for them,
and a producer that dies in between leaves a committed run that drift repair enqueues."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from fencepost.reconciler.drift import DriftRepair
from tests.conftest import ROOT, wait_until, worker_env

# A producer with enqueue_behind whose Redis enqueue never goes out: it prints the ids its calls returned
# (committed), then waits inside the window until it is killed.
_PRODUCER = """
import asyncio, sys
from fencepost.client import Client
from fencepost.core.models import Submit

async def main():
    client = await Client().connect()
    client.enqueue_behind = True
    async def stuck(*args, **kwargs):
        await asyncio.Event().wait()
    client._enqueue = stuck
    ids = await client.submit_many([Submit(handler="t.noop")] * 4) + [await client.submit("t.noop")]
    print(" ".join(map(str, ids)), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_submit_returns_after_its_commit_and_reaches_redis_behind_it(client: Client, stores: Stores) -> None:
    client.enqueue_behind = True
    due = stores.keys("tq").due
    calls = 0
    enqueue = client._enqueue

    async def counted(*args: object, **kwargs: object) -> None:
        nonlocal calls
        calls += 1
        await enqueue(*args, **kwargs)  # type: ignore[arg-type]

    client._enqueue = counted  # type: ignore[method-assign]
    ids = await asyncio.gather(*(client.submit("t.noop") for _ in range(100)))
    pool = stores.db.pool
    assert pool is not None
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE id = ANY($1) AND status = 'PENDING'", ids) == 100, \
        "every submit returned after PostgreSQL committed its run"

    async def all_due() -> bool:
        pipe = stores.redis.pipeline(transaction=False)
        for i in ids:
            pipe.zscore(due, str(i))
        return all(s is not None for s in await pipe.execute())

    await wait_until(all_due, timeout=10, what="the enqueues behind the submits")
    assert calls < 100, f"the enqueues of concurrent submits are coalesced ({calls} calls for 100 runs)"


async def test_close_waits_for_the_enqueues_behind(settings, client_registry) -> None:  # type: ignore[no-untyped-def]
    c = await Client(settings=settings).connect()
    await c.register(client_registry)
    c.enqueue_behind = True
    ids = [await c.submit("t.noop") for _ in range(20)]
    await c.close()
    check = await Client(settings=settings).connect()
    try:
        due = check.stores.keys("tq").due
        assert all([await check.stores.redis.zscore(due, str(i)) is not None for i in ids])
    finally:
        await check.close()


async def test_a_bulk_submit_returns_after_its_commit_and_the_next_waits_for_its_enqueue(
        client: Client, stores: Stores) -> None:
    """submit_many with enqueue_behind: the call returns with its runs committed and not yet in Redis (the
    enqueue is held here), and the producer's next call commits but does not return while the previous
    call's enqueue is still in flight (at most one call's runs on their way)."""
    from fencepost.core.models import Submit

    client.enqueue_behind = True
    due = stores.keys("tq").due
    gate = asyncio.Event()
    enqueue = client._enqueue

    async def held(*args: object, **kwargs: object) -> None:
        await gate.wait()
        await enqueue(*args, **kwargs)  # type: ignore[arg-type]

    client._enqueue = held  # type: ignore[method-assign]
    pool = stores.db.pool
    assert pool is not None
    first = await asyncio.wait_for(client.submit_many([Submit(handler="t.noop")] * 10), 10)
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE id = ANY($1) AND status = 'PENDING'", first) == 10
    assert await stores.redis.zcard(due) == 0, "the call returned before its runs reached Redis"
    second = asyncio.ensure_future(client.submit_many([Submit(handler="t.noop")] * 10))

    async def committed() -> bool:
        return await pool.fetchval("SELECT count(*) FROM runs") == 20  # type: ignore[no-any-return]

    await wait_until(committed, timeout=10, what="the second call's commit")
    assert not second.done(), "the second call waits while the first call's enqueue is in flight"
    gate.set()
    ids = first + await asyncio.wait_for(second, 10)

    async def all_due() -> bool:
        return await stores.redis.zcard(due) == 20  # type: ignore[no-any-return]

    await wait_until(all_due, timeout=10, what="both calls' runs in Redis")
    assert sorted(int(m) for m in await stores.redis.zrange(due, 0, -1)) == sorted(ids)


async def test_a_producer_killed_inside_the_window_leaves_runs_that_drift_repair_enqueues_after_its_grace(
        client: Client, stores: Stores, settings: Settings) -> None:
    """The net under enqueue_behind: a producer SIGKILLed after its submits returned (committed) and before
    their enqueue reached Redis leaves PENDING runs Redis lacks; drift repair leaves them alone within its
    grace (5 s: a submit may still be on its way) and enqueues them after it."""
    proc = subprocess.Popen([sys.executable, "-c", _PRODUCER], cwd=ROOT, env=worker_env(settings),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        ids = [int(x) for x in line.split()]
        assert len(ids) == 5, (line, proc.poll() is not None and proc.stderr and proc.stderr.read())
        os.kill(proc.pid, signal.SIGKILL)
        assert await asyncio.to_thread(proc.wait, 10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    pool = stores.db.pool
    assert pool is not None
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE id = ANY($1) AND status = 'PENDING'", ids) == 5
    due = stores.keys("tq").due

    async def in_redis() -> int:
        pipe = stores.redis.pipeline(transaction=False)
        for i in ids:
            pipe.zscore(due, str(i))
        return sum(s is not None for s in await pipe.execute())

    assert await in_redis() == 0, "the killed producer's enqueues never reached Redis"
    drift = DriftRepair(stores)  # the reconciler's defaults: 5 s grace
    await drift.tick("tq")
    assert await in_redis() == 0, "within its grace drift repair leaves a just-committed run alone"

    async def repaired() -> bool:
        await drift.tick("tq")
        return await in_redis() == 5

    await wait_until(repaired, timeout=30, what="drift repair enqueueing the killed producer's runs", interval=0.5)
