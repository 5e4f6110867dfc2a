"""Benchmark one peer job queue (arq, saq or pgqueuer) the way Fencepost is benchmarked.

Usage (with the separate peers venv)::

    .venv-bench/bin/python bench/peers/run_peer.py --peer arq --jobs 20000 --workers 1

Phases:

1. Reset the peer's storage (Redis ``FLUSHDB`` on a dedicated DB; for pgqueuer a
   freshly created database with the peer's schema installed).
2. Submit N no-op jobs with the peer's bulk API; ``submit_per_s`` = N / wall time
   of the enqueue calls (client connect/close excluded).
3. Start W worker OS processes (``spawn``). Each imports the peer, then waits on a
   shared "go" event, so interpreter start-up is not timed. The clock starts when
   "go" is set and stops when the peer's *own* state says no job is left
   (polled every ``POLL_S``); ``drain_per_s`` = N / that time.
   Afterwards the peer's own records must show N successful jobs (arq result keys,
   SAQ job status, pgqueuer_log rows), else the case reports an error.
4. Print exactly one JSON line on stdout. A missing peer prints ``{"peer", "error"}``
   and exits 0, so a caller can skip it.

Worker concurrency (defaults, override with ``--concurrency``/``--batch``):

* arq: ``max_jobs=200``, ``poll_delay=0.05`` s (default 0.5 s idles a worker between
  reads once its ``max_jobs`` slots are full), ``queue_read_limit`` default
  (5 x max_jobs), results kept (default ``keep_result``).
* saq: ``concurrency=100`` (one blocking ``BLMOVE`` connection per slot), default
  job ttl (result kept 600 s).
* pgqueuer: ``batch_size=100`` jobs per dequeue query (also the size at which
  completion logs are flushed), ``max_concurrent_tasks`` unlimited, default logged
  (durable) tables. Drain rate depends strongly on this knob (the library default
  of 10 drains at roughly a third of the rate of 100 here).

Every process runs on uvloop when it is installed (Fencepost's venv has it too).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

PEERS = ("arq", "saq", "pgqueuer")
POLL_S = 0.01
SUBMIT_INFLIGHT = 200  # concurrent enqueue calls for the per-job (Redis) APIs
DEFAULT_CONCURRENCY = {"arq": 200, "saq": 100, "pgqueuer": 100}
QUEUE = "bench"
TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Cfg:
    peer: str
    jobs: int
    workers: int
    concurrency: int
    redis_url: str
    database_url: str
    repeats: int = 1


def run_async(coro: Awaitable[Any]) -> Any:
    """Run ``coro`` on uvloop when available, else on the default asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


def loop_name() -> str:
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


async def bounded_gather(calls: Iterable[Callable[[], Awaitable[Any]]], limit: int) -> None:
    """Await ``calls`` with at most ``limit`` in flight (one Redis connection each)."""
    it = iter(calls)

    async def lane() -> None:
        for call in it:
            await call()

    await asyncio.gather(*(lane() for _ in range(limit)))


async def noop(*_: Any, **__: Any) -> None:
    """The benchmarked job: does nothing."""


# --------------------------------------------------------------------------- Redis peers


async def flush_redis(url: str) -> None:
    from redis.asyncio import Redis

    r = Redis.from_url(url)
    await r.flushdb()
    await r.aclose()


async def wait_redis(url: str, remaining: Callable[[Any], Awaitable[int]], t0: float) -> float:
    """Poll until ``remaining(redis) == 0``; return the completion time."""
    from redis.asyncio import Redis

    r = Redis.from_url(url)
    try:
        while await remaining(r):
            if time.perf_counter() - t0 > TIMEOUT_S:
                raise TimeoutError("drain did not finish")
            await asyncio.sleep(POLL_S)
        return time.perf_counter()
    finally:
        await r.aclose()


# arq ------------------------------------------------------------------------------------


async def arq_submit(cfg: Cfg) -> float:
    """``ArqRedis.enqueue_job`` is per job (WATCH/MULTI); run SUBMIT_INFLIGHT at once."""
    from arq import create_pool
    from arq.connections import RedisSettings

    pool = await create_pool(RedisSettings.from_dsn(cfg.redis_url), default_queue_name=QUEUE)
    t = time.perf_counter()
    await bounded_gather(((lambda: pool.enqueue_job("noop")) for _ in range(cfg.jobs)), SUBMIT_INFLIGHT)
    t = time.perf_counter() - t
    await pool.aclose()
    return t


async def arq_remaining(r: Any) -> int:
    """arq removes a job from its queue zset only once it has finished."""
    return int(await r.zcard(QUEUE))


async def arq_worker(cfg: Cfg) -> None:
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    w = Worker(
        functions=[func(noop, name="noop")],
        redis_settings=RedisSettings.from_dsn(cfg.redis_url),
        queue_name=QUEUE,
        max_jobs=cfg.concurrency,
        poll_delay=0.05,
        handle_signals=False,
    )
    await w.main()


# saq ------------------------------------------------------------------------------------


async def saq_submit(cfg: Cfg) -> float:
    """SAQ has no bulk enqueue; ``Queue.enqueue`` (one Lua call) with SUBMIT_INFLIGHT at once."""
    from saq.queue.redis import RedisQueue

    q = RedisQueue.from_url(cfg.redis_url, name=QUEUE, max_concurrent_ops=SUBMIT_INFLIGHT)
    await q.connect()
    t = time.perf_counter()
    await bounded_gather(((lambda: q.enqueue("noop")) for _ in range(cfg.jobs)), SUBMIT_INFLIGHT)
    t = time.perf_counter() - t
    await q.disconnect()
    return t


async def saq_remaining(r: Any) -> int:
    """SAQ's ``incomplete`` zset holds queued + active jobs (what ``Queue.count('incomplete')`` reads)."""
    return int(await r.zcard(f"saq:{QUEUE}:incomplete"))


async def saq_worker(cfg: Cfg) -> None:
    from saq import Worker
    from saq.queue.redis import RedisQueue

    q = RedisQueue.from_url(cfg.redis_url, name=QUEUE)
    await q.connect()
    await Worker(q, functions=[("noop", noop)], concurrency=cfg.concurrency).start()


async def count_redis(url: str, pattern: str, needle: bytes | None = None) -> int:
    """Count keys matching ``pattern`` (whose value contains ``needle``, if given)."""
    from redis.asyncio import Redis

    r = Redis.from_url(url)
    keys = [k async for k in r.scan_iter(match=pattern, count=5000)]
    if needle is not None:
        vals = [v for i in range(0, len(keys), 5000) for v in await r.mget(keys[i : i + 5000])]
        keys = [k for k, v in zip(keys, vals) if v and needle in v]
    await r.aclose()
    return len(keys)


# --------------------------------------------------------------------------- pgqueuer


def db_admin_url(url: str) -> tuple[str, str]:
    """Return (URL of the ``postgres`` maintenance DB, name of the bench DB)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/postgres")), parts.path.lstrip("/")


async def pgq_reset(cfg: Cfg) -> None:
    """Drop/recreate the bench database and install pgqueuer's schema in it."""
    import asyncpg
    from pgqueuer.queries import Queries

    admin_url, name = db_admin_url(cfg.database_url)
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    conn = await asyncpg.connect(cfg.database_url)
    await Queries.from_asyncpg_connection(conn).install()
    await conn.close()


async def pgq_submit(cfg: Cfg) -> float:
    """One ``Queries.enqueue`` call with list arguments (a single UNNEST insert)."""
    import asyncpg
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(cfg.database_url)
    queries, n = Queries.from_asyncpg_connection(conn), cfg.jobs
    t = time.perf_counter()
    await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    t = time.perf_counter() - t
    await conn.close()
    return t


async def pgq_wait(cfg: Cfg, t0: float) -> float:
    """pgqueuer deletes a job row from its queue table once its completion is logged."""
    import asyncpg

    conn = await asyncpg.connect(cfg.database_url)
    try:
        while await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pgqueuer)"):
            if time.perf_counter() - t0 > TIMEOUT_S:
                raise TimeoutError("drain did not finish")
            await asyncio.sleep(POLL_S)
        return time.perf_counter()
    finally:
        await conn.close()


async def pgq_completed(cfg: Cfg) -> int:
    import asyncpg

    conn = await asyncpg.connect(cfg.database_url)
    n = await conn.fetchval("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
    await conn.close()
    return int(n)


async def pgq_worker(cfg: Cfg) -> None:
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(cfg.database_url)
    qm = QueueManager(Queries.from_asyncpg_connection(conn))
    qm.entrypoint("noop")(noop)
    await qm.run(batch_size=cfg.concurrency)


# --------------------------------------------------------------------------- harness

WORKERS: dict[str, Callable[[Cfg], Awaitable[None]]] = {
    "arq": arq_worker,
    "saq": saq_worker,
    "pgqueuer": pgq_worker,
}


def worker_main(cfg: Cfg, ready: Any, go: Any) -> None:
    """Child process: pre-import the peer, report ready, block until "go", then work forever."""
    import logging

    logging.disable(logging.CRITICAL)  # per-job INFO logs would dominate a no-op benchmark
    {"arq": lambda: __import__("arq.worker"), "saq": lambda: __import__("saq.worker"),
     "pgqueuer": lambda: __import__("pgqueuer.qm")}[cfg.peer]()
    ready.release()
    go.wait()
    run_async(WORKERS[cfg.peer](cfg))


async def submit(cfg: Cfg) -> float:
    """Reset storage, submit, and return the submit wall time in seconds.

    The clock covers the enqueue calls only (client connect/close is excluded).
    """
    if cfg.peer == "pgqueuer":
        await pgq_reset(cfg)
    else:
        await flush_redis(cfg.redis_url)
    return await {"arq": arq_submit, "saq": saq_submit, "pgqueuer": pgq_submit}[cfg.peer](cfg)


async def wait_done(cfg: Cfg, t0: float) -> float:
    if cfg.peer == "pgqueuer":
        return await pgq_wait(cfg, t0)
    remaining = arq_remaining if cfg.peer == "arq" else saq_remaining
    return await wait_redis(cfg.redis_url, remaining, t0)


async def completed(cfg: Cfg) -> int:
    """After the drain: how many jobs the peer itself records as successfully completed."""
    if cfg.peer == "pgqueuer":
        return await pgq_completed(cfg)
    if cfg.peer == "arq":
        return await count_redis(cfg.redis_url, "arq:result:*")
    return await count_redis(cfg.redis_url, f"saq:job:{QUEUE}:*", b'"status": "complete"')


def run_once(cfg: Cfg) -> tuple[float, float, int]:
    """One reset/submit/drain cycle: (submit seconds, drain seconds, jobs completed)."""
    submit_s = run_async(submit(cfg))
    ctx = mp.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    procs = [ctx.Process(target=worker_main, args=(cfg, ready, go), daemon=True) for _ in range(cfg.workers)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            if not ready.acquire(timeout=60):
                raise RuntimeError("worker did not start")
        t0 = time.perf_counter()
        go.set()
        t1 = run_async(wait_done(cfg, t0))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return submit_s, t1 - t0, run_async(completed(cfg))


def bench(cfg: Cfg) -> dict[str, Any]:
    """Run ``cfg.repeats`` cycles and report the median rates."""
    runs = [run_once(cfg) for _ in range(cfg.repeats)]
    bad = [c for _, _, c in runs if c != cfg.jobs]
    if bad:
        raise RuntimeError(f"peer recorded {bad[0]} of {cfg.jobs} jobs as completed")
    submit_s = statistics.median(s for s, _, _ in runs)
    drain_s = statistics.median(d for _, d, _ in runs)
    knob = {"arq": "max_jobs", "saq": "concurrency", "pgqueuer": "batch_size"}[cfg.peer]
    return {
        "peer": cfg.peer,
        "jobs": cfg.jobs,
        "workers": cfg.workers,
        "submit_per_s": round(cfg.jobs / submit_s, 1),
        "drain_per_s": round(cfg.jobs / drain_s, 1),
        "notes": f"{knob}={cfg.concurrency}/worker; loop={loop_name()}; median of {cfg.repeats}; "
        f"completion=peer state polled every {POLL_S * 1000:.0f} ms; "
        f"version={peer_version(cfg.peer)}",
    }


def peer_version(peer: str) -> str:
    from importlib.metadata import version

    return version(peer)


def parse_args(argv: list[str] | None = None) -> Cfg:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", required=True, choices=PEERS)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--concurrency", "--batch", type=int, default=None,
                    help="arq max_jobs / saq concurrency / pgqueuer batch_size per worker")
    ap.add_argument("--repeats", type=int, default=1, help="cycles per case; the median is reported")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/bench_peers")
    a = ap.parse_args(argv)
    return Cfg(a.peer, a.jobs, a.workers, a.concurrency or DEFAULT_CONCURRENCY[a.peer],
               a.redis_url, a.database_url, a.repeats)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    if importlib.util.find_spec(cfg.peer) is None:
        print(json.dumps({"peer": cfg.peer, "error": f"{cfg.peer} is not installed"}), flush=True)
        return 0
    try:
        out = bench(cfg)
    except Exception as e:  # report, don't crash the caller's table
        out = {"peer": cfg.peer, "jobs": cfg.jobs, "workers": cfg.workers,
               "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
