"""`Client.enqueue_behind` (issue 23 item 3): a submit returns once PostgreSQL committed its run, its
Redis enqueue goes out behind it (coalesced with the other submits' enqueues), close() waits for them,
and a producer that dies in between leaves a committed run that drift repair enqueues."""

from __future__ import annotations

import asyncio

from fencepost.client import Client
from fencepost.core.stores import Stores
from tests.conftest import wait_until


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
