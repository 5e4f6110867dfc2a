"""Benchmark handlers. The peers' harness (bench/peers/run_peer.py) defines the same jobs.

- `bench.tiny` (the default): a realistic tiny job, one async Redis round trip that records
  its run id and start time (`HSET bench:done <id> <time>` on the bench's results DB).
- `bench.slow`: 20 ms of work, then `HINCRBY bench:runs <id> 1` (kill -9 mode counts re-runs).
- `bench.noop`: does nothing (the old figures, `--noop`).
- `bench.long`: records its start in `bench:long`, then holds its slot for `seconds` (bench/mixed.py).

Handlers use the job declaration's defaults (retries, timeout) except the queue.
"""

from __future__ import annotations

import asyncio
import os
import time

from redis.asyncio import Redis

from fencepost.core.registry import Registry

DONE_URL = os.environ.get("BENCH_DONE_URL", "redis://127.0.0.1:6379/15")
DONE_KEY = "bench:done"
RUNS_KEY = "bench:runs"
LONG_KEY = "bench:long"

registry = Registry()
_done: Redis | None = None


def done() -> Redis:
    """One connection pool per process, made on first use (after the worker's event loop started)."""
    global _done
    if _done is None:
        # redis-py 8 caps a pool at 100 connections and raises MaxConnectionsError past it: a worker
        # running a thousand long jobs that record their start at once would fail them (the peers'
        # venv has redis-py 5, whose pool has no cap). No cap here either, so every system pays the same.
        _done = Redis.from_url(DONE_URL, max_connections=2**31)
    return _done


@registry.job("bench.tiny", queue="bench")
async def tiny(ctx) -> None:
    await done().hset(DONE_KEY, str(ctx.run_id), repr(time.time()))


@registry.job("bench.slow", queue="bench")
async def slow(ctx) -> None:
    await asyncio.sleep(0.02)
    await done().hincrby(RUNS_KEY, str(ctx.run_id), 1)


@registry.job("bench.noop", queue="bench", max_retries=0)
async def noop(ctx) -> None:
    return None


@registry.job("bench.long", queue="bench", timeout=3600)
async def long(ctx, seconds: float) -> None:
    await done().hset(LONG_KEY, str(ctx.run_id), repr(time.time()))
    await asyncio.sleep(seconds)
