"""A burst of concurrent Redis commands from one process waits for a pooled connection instead of
failing: redis-py 8 caps a plain pool at 100 connections and raises MaxConnectionsError past it, so
a worker running 400 handlers that checkpoint at once saw 1,371 "Too many connections" retries
(and any lease renewal or claim caught in such a burst would have failed as if Redis were down)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import asyncpg

from fencepost.client import Client, Submit
from fencepost.core.config import Settings
from fencepost.core.redisconn import connect
from tests.conftest import spawn, stop, wait_until


async def test_a_burst_of_more_commands_than_the_pool_holds_waits_instead_of_failing(settings: Settings) -> None:
    redis = connect(settings.redis_url)
    key = f"{settings.prefix}:burst"
    try:
        # 400 blocking reads at once hold 400 connections for 0.2 s each: more than the pool's cap
        results = await asyncio.gather(*(redis.blpop([f"{key}:{i}"], timeout=0.2) for i in range(400)),
                                       return_exceptions=True)
    finally:
        await redis.aclose()
    failed = [r for r in results if isinstance(r, Exception)]
    assert not failed, f"{len(failed)} of 400 commands failed, first: {failed[0]!r}"


APP = textwrap.dedent('''
    import asyncio
    import time

    from fencepost import Registry

    registry = Registry()


    @registry.job("burst.checkpoint", queue="burstq", max_retries=0)
    async def checkpoint(ctx) -> int:
        # every handler checkpoints in the same instant: the next whole second
        await asyncio.sleep(1.0 - time.time() % 1.0)
        await ctx.checkpoint({"step": 1})
        return 1
''')


async def test_four_hundred_handlers_checkpointing_at_once_write_without_a_retry(
        settings: Settings, client: Client, tmp_path: Path) -> None:
    (tmp_path / "burstapp.py").write_text(APP)
    sys.path.insert(0, str(tmp_path))
    try:
        from burstapp import registry  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    await client.register(registry)
    ids = await client.submit_many([Submit(handler="burst.checkpoint")] * 400)
    log = tmp_path / "worker.log"
    worker = spawn(settings, "worker", "--app", "burstapp:registry", "--queue", "burstq", "--concurrency", "400",
                   log=log, PYTHONPATH=str(tmp_path))
    recorder = spawn(settings, "reconciler")
    conn = await asyncpg.connect(settings.database_url)
    try:
        async def finished() -> bool:
            done = await conn.fetchval("SELECT count(*) FROM runs WHERE id = ANY($1) AND status = 'SUCCEEDED'", ids)
            return bool(done == len(ids))
        await wait_until(finished, timeout=120, what="400 runs SUCCEEDED")
    finally:
        await conn.close()
        stop([worker, recorder])
    text = log.read_text()
    retries = text.count('"checkpoint_retry"')
    assert retries == 0, f"{retries} checkpoint retries, e.g. {next(ln for ln in text.splitlines() if 'checkpoint_retry' in ln)}"
