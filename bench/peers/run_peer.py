"""Benchmark one peer job queue (pgqueuer, SAQ or arq) the way bench/throughput.py benchmarks Fencepost.

Run with the peers' own venv (bench/peers/requirements.txt); prints one JSON line::

    .venv-bench/bin/python bench/peers/run_peer.py --peer pgqueuer --mode drain --jobs 20000 --workers 1

Modes:

- ``drain``: reset the peer's storage, bulk submit N jobs in calls of ``--call-size`` (submit/s),
  start W worker processes that wait on a "go" event (interpreter start-up not timed), settle,
  measure the shared processes' idle CPU for 1 s, set "go"; drain/s = N / (until the peer's own
  state holds no job). CPU-us per job per process over that window: the workers, the Redis server
  and the PostgreSQL backends of the bench database (less this harness's own connections), as in
  bench/measure.py. The handler's records (Redis DB 15) must show N jobs.
- ``single``: N submits, each awaited before the next.
- ``open``: start W workers, submit at ``--rate`` jobs/s in 10 ms ticks for ``--duration`` s;
  submit->start lag percentiles (from each job's intended submit time) and history lag (pgqueuer:
  its completion log row's time - the job's start).
- ``spike``: N jobs due at one instant T (pgqueuer ``execute_after``, SAQ ``scheduled``), W idle
  workers; start times after T.
- ``kill``: N jobs of 20 ms, SIGKILL one of W workers when half have run, start another at once;
  lost jobs, re-runs, seconds to drain after the restart.

Jobs (the same as bench/app.py): ``tiny`` = one async Redis round trip recording the job's id and
start time (``HSET bench:done <id> <time>``); ``slow`` = 20 ms sleep then ``HINCRBY bench:runs <id> 1``;
``noop``. Worker settings are the peers' defaults (pgqueuer ``batch_size=10``, SAQ
``concurrency=10``, arq ``max_jobs=10``) unless ``--batch``/``--concurrency`` is given;
``--old-defaults`` restores the README's settings (arq 200 + poll 0.05 s, SAQ 100, pgqueuer 100).
Every process runs on uvloop when it is installed (Fencepost's services do too).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from bench.measure import (
    CpuMeter,
    commandstats_delta,
    median,
    parent_pid,
    percentile,
    pg_aux_pids,
    pg_backend_pids,
    settle,
)

PEERS = ("arq", "saq", "pgqueuer")
POLL_S = 0.01
QUEUE = "bench"
DONE_KEY = "bench:done"
RUNS_KEY = "bench:runs"
TIMEOUT_S = 600.0
OLD_DEFAULTS = {"arq": 200, "saq": 100, "pgqueuer": 100}
ROLES = ("worker", "recorder", "redis", "pg", "pg_shared")


@dataclass(frozen=True)
class Cfg:
    peer: str
    mode: str
    job: str
    jobs: int
    workers: int
    knob: int | None  # pgqueuer batch_size / SAQ concurrency / arq max_jobs; None: the peer's default
    old_defaults: bool
    call_size: int
    rate: float
    duration: float
    redis_url: str
    done_url: str
    database_url: str
    window_s: float = 60.0
    long: int = 0  # mixed mode: long jobs running beside the tiny ones
    long_s: float = 60.0


def run_async(coro: Awaitable[Any]) -> Any:
    """Run ``coro`` on uvloop when available, else on the default asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


def loop_name() -> str:
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


# --------------------------------------------------------------------------- the jobs

_done: Any = None


def done_redis() -> Any:
    """The handler's Redis (one pool per worker process, made on first use)."""
    global _done
    if _done is None:
        from redis.asyncio import Redis

        _done = Redis.from_url(os.environ["BENCH_DONE_URL"])
    return _done


async def record_start(job_id: Any) -> None:
    await done_redis().hset(DONE_KEY, str(job_id), repr(time.time()))


LONG_KEY = "bench:long"


async def record_long(job_id: Any, seconds: float) -> None:
    """A long job (the mixed workload): record its start, then hold its slot for `seconds`."""
    await done_redis().hset(LONG_KEY, str(job_id), repr(time.time()))
    await asyncio.sleep(seconds)


async def record_run(job_id: Any) -> None:
    await asyncio.sleep(0.02)
    await done_redis().hincrby(RUNS_KEY, str(job_id), 1)


# --------------------------------------------------------------------------- Redis peers

async def flush_redis(cfg: Cfg) -> None:
    from redis.asyncio import Redis

    for url in (cfg.redis_url, cfg.done_url):
        r = Redis.from_url(url)
        if url == cfg.done_url:
            await r.delete(DONE_KEY, RUNS_KEY, LONG_KEY)
        else:
            await r.flushdb()
        await r.aclose()


# saq ------------------------------------------------------------------------------------

def saq_queue(cfg: Cfg) -> Any:
    from saq.queue.redis import RedisQueue

    return RedisQueue.from_url(cfg.redis_url, name=QUEUE)


async def saq_tiny(ctx: dict, **_: Any) -> None:
    await record_start(ctx["job"].key)


async def saq_slow(ctx: dict, **_: Any) -> None:
    await record_run(ctx["job"].key)


async def saq_noop(ctx: dict, **_: Any) -> None:
    return None


async def saq_worker(cfg: Cfg) -> None:
    from saq import Worker

    q = saq_queue(cfg)
    await q.connect()
    fns = [("tiny", saq_tiny), ("slow", saq_slow), ("noop", saq_noop)]
    kw = {"concurrency": cfg.knob} if cfg.knob else {}
    await Worker(q, functions=fns, **kw).start()


class SaqClient:
    """SAQ has no bulk enqueue: a call of K jobs is K concurrent ``Queue.enqueue`` (one Lua call each)."""

    async def __aenter__(self) -> Self:
        self.q = saq_queue(CFG)
        await self.q.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.q.disconnect()

    async def submit(self, n: int, job: str, at: float | None = None) -> list[str]:
        kw = {"scheduled": int(at)} if at else {}
        jobs = await asyncio.gather(*(self.q.enqueue(job, **kw) for _ in range(n)))
        return [j.key for j in jobs]

    async def remaining(self) -> int:
        """SAQ's ``incomplete`` zset holds queued + active jobs (what ``Queue.count('incomplete')`` reads)."""
        return int(await self.q.redis.zcard(f"saq:{QUEUE}:incomplete"))


# arq ------------------------------------------------------------------------------------

async def arq_tiny(ctx: dict, *_: Any) -> None:
    await record_start(ctx["job_id"])


async def arq_slow(ctx: dict, *_: Any) -> None:
    await record_run(ctx["job_id"])


async def arq_noop(ctx: dict, *_: Any) -> None:
    return None


async def arq_worker(cfg: Cfg) -> None:
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    kw: dict[str, Any] = {"max_jobs": cfg.knob} if cfg.knob else {}
    if cfg.old_defaults:
        kw["poll_delay"] = 0.05
    w = Worker(functions=[func(arq_tiny, name="tiny"), func(arq_slow, name="slow"), func(arq_noop, name="noop")],
               redis_settings=RedisSettings.from_dsn(cfg.redis_url), queue_name=QUEUE, handle_signals=False, **kw)
    await w.main()


class ArqClient:
    """``ArqRedis.enqueue_job`` is per job (WATCH/MULTI); a call of K jobs is K concurrent enqueues."""

    async def __aenter__(self) -> Self:
        from arq import create_pool
        from arq.connections import RedisSettings

        self.pool = await create_pool(RedisSettings.from_dsn(CFG.redis_url), default_queue_name=QUEUE)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.aclose()

    async def submit(self, n: int, job: str, at: float | None = None) -> list[str]:
        kw = {"_defer_by": max(0.0, at - time.time())} if at else {}
        jobs = await asyncio.gather(*(self.pool.enqueue_job(job, **kw) for _ in range(n)))
        return [j.job_id for j in jobs]

    async def remaining(self) -> int:
        """arq removes a job from its queue zset only once it has finished."""
        return int(await self.pool.zcard(QUEUE))


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


async def pgq_worker(cfg: Cfg) -> None:
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(cfg.database_url)
    qm = QueueManager(Queries.from_asyncpg_connection(conn))

    @qm.entrypoint("tiny")
    async def tiny(job: Any) -> None:
        await record_start(job.id)

    @qm.entrypoint("slow")
    async def slow(job: Any) -> None:
        await record_run(job.id)

    @qm.entrypoint("noop")
    async def noop(job: Any) -> None:
        return None

    @qm.entrypoint("long")
    async def long(job: Any) -> None:
        await record_long(job.id, float(job.payload or b"60"))

    await qm.run(**({"batch_size": cfg.knob} if cfg.knob else {}))


class PgqClient:
    """``Queries.enqueue`` with list arguments: one UNNEST insert per call."""

    async def __aenter__(self) -> Self:
        import asyncpg
        from pgqueuer.queries import Queries

        self.conn = await asyncpg.connect(CFG.database_url)
        self.queries = Queries.from_asyncpg_connection(self.conn)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def submit(self, n: int, job: str, at: float | None = None) -> list[int]:
        after = [timedelta(seconds=max(0.0, at - time.time()))] * n if at else None
        ids = await self.queries.enqueue([job] * n, [None] * n, [0] * n, after)
        return [int(i) for i in ids]

    async def submit_one(self, job: str) -> None:
        await self.queries.enqueue(job, None)

    async def submit_long(self, n: int, seconds: float) -> None:
        await self.queries.enqueue(["long"] * n, [repr(seconds).encode()] * n, [0] * n)

    async def remaining(self) -> int:
        """pgqueuer deletes a job row from its queue table once its completion is logged."""
        return int(await self.conn.fetchval("SELECT count(*) FROM pgqueuer"))


CLIENTS = {"arq": ArqClient, "saq": SaqClient, "pgqueuer": PgqClient}
WORKERS: dict[str, Callable[[Cfg], Awaitable[None]]] = {"arq": arq_worker, "saq": saq_worker, "pgqueuer": pgq_worker}
CFG: Cfg  # set by main(); the clients read it


# --------------------------------------------------------------------------- harness

def worker_main(cfg: Cfg, ready: Any, go: Any) -> None:
    """Child process: pre-import the peer, report ready, block until "go", then work forever."""
    import logging

    logging.disable(logging.CRITICAL)  # per-job INFO logs would dominate a tiny-job benchmark
    os.environ["BENCH_DONE_URL"] = cfg.done_url
    {"arq": lambda: __import__("arq.worker"), "saq": lambda: __import__("saq.worker"),
     "pgqueuer": lambda: __import__("pgqueuer.qm")}[cfg.peer]()
    __import__("redis.asyncio")
    ready.release()
    go.wait()
    run_async(WORKERS[cfg.peer](cfg))


class Case:
    """Worker processes, a go event, and a CPU meter over them, Redis and the bench database's backends."""

    def __init__(self, cfg: Cfg) -> None:
        self.cfg = cfg
        self.ctx = mp.get_context("spawn")
        self.ready, self.go = self.ctx.Semaphore(0), self.ctx.Event()
        self.procs: list[Any] = []

    def spawn(self) -> Any:
        p = self.ctx.Process(target=worker_main, args=(self.cfg, self.ready, self.go), daemon=True)
        p.start()
        self.procs.append(p)
        return p

    async def start(self, client: Any) -> None:
        """Spawn the workers (they wait for go), wait until they are idle, measure the idle baseline."""
        from redis.asyncio import Redis

        r = Redis.from_url(self.cfg.redis_url)
        self.redis, self.redis_pid = r, int((await r.info("server"))["process_id"])
        self.postmaster, exclude = 0, []
        self.dbname = urlsplit(self.cfg.database_url).path.lstrip("/")
        import asyncpg

        self.poll = await asyncpg.connect(self.cfg.database_url) if self.cfg.peer == "pgqueuer" else None
        probe = await asyncpg.connect(self.cfg.database_url)
        self.postmaster = parent_pid(await probe.fetchval("SELECT pg_backend_pid()")) or 0
        exclude = pg_backend_pids(self.postmaster, self.dbname)()  # this harness's connections
        await probe.close()
        for _ in range(self.cfg.workers):
            self.spawn()
        for _ in range(self.cfg.workers):
            if not await asyncio.to_thread(self.ready.acquire, True, 60):
                raise RuntimeError("worker did not start")
        await asyncio.to_thread(settle, lambda: [p.pid for p in self.procs])
        procs = self.procs
        self.meter = CpuMeter({
            "worker": lambda: [p.pid for p in procs if p.pid],
            "recorder": list,
            "redis": lambda: [self.redis_pid],
            "pg": pg_backend_pids(self.postmaster, self.dbname, exclude=exclude),
            "pg_shared": pg_aux_pids(self.postmaster),
        }, shared=("redis", "pg_shared"))
        await asyncio.to_thread(self.meter.baseline, 1.0)

    async def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        await self.redis.aclose()
        if self.poll is not None:
            await self.poll.close()


async def wait_remaining(client: Any, t0: float, timeout: float = TIMEOUT_S, recorded: int = 0) -> float:
    """Poll the peer's own state until no job is left. With `recorded`, first wait (cheaply, in Redis)
    until the handlers recorded that many jobs: a pgqueuer poll counts a table full of dead rows
    (autovacuum is off here), which would tax the very cores the peer runs on."""
    if recorded:
        while await done_count(CFG) < recorded and time.perf_counter() - t0 < timeout:
            await asyncio.sleep(POLL_S)
    while await client.remaining():
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError("drain did not finish")
        await asyncio.sleep(POLL_S)
    return time.perf_counter()


async def reset(cfg: Cfg) -> None:
    await flush_redis(cfg)
    if cfg.peer == "pgqueuer":
        await pgq_reset(cfg)


def per_job_cpu(cpu: dict[str, float], jobs: int) -> dict[str, float]:
    out = {r: round(cpu.get(r, 0.0) / jobs * 1e6, 1) for r in ROLES}
    out["total"] = round(sum(out[r] for r in ROLES), 1)
    out["machine"] = round(cpu.get("machine", 0.0) / jobs * 1e6, 1)
    return out


_poll: Any = None


async def done_count(cfg: Cfg, key: str = DONE_KEY) -> int:
    """How many jobs the handlers recorded (one persistent harness connection: polls are every 10 ms)."""
    global _poll
    if _poll is None:
        from redis.asyncio import Redis

        _poll = Redis.from_url(cfg.done_url)
    return int(await _poll.hlen(key))


async def done_map(cfg: Cfg, key: str = DONE_KEY) -> dict[str, float]:
    from redis.asyncio import Redis

    r = Redis.from_url(cfg.done_url)
    raw = {k: v async for k, v in r.hscan_iter(key, count=20_000)}  # in slices, as bench/throughput.starts
    await r.aclose()
    return {k.decode(): float(v) for k, v in raw.items()}


async def wait_done(cfg: Cfg, n: int, key: str = DONE_KEY, timeout: float = 120.0) -> int:
    t0 = time.perf_counter()
    while (got := await done_count(cfg, key)) < n and time.perf_counter() - t0 < timeout:
        await asyncio.sleep(POLL_S)
    return got


async def mode_drain(cfg: Cfg) -> dict[str, Any]:
    await reset(cfg)
    case = Case(cfg)
    async with CLIENTS[cfg.peer]() as client:
        t = time.perf_counter()
        for i in range(0, cfg.jobs, cfg.call_size):
            await client.submit(min(cfg.call_size, cfg.jobs - i), cfg.job)
        submit_s = time.perf_counter() - t
        try:
            await case.start(client)
            stats0 = await case.redis.info("commandstats")
            case.meter.start()
            t0 = time.perf_counter()
            case.go.set()
            t1 = await wait_remaining(client, t0, recorded=0 if cfg.job == "noop" else cfg.jobs)
            stats = commandstats_delta(stats0, await case.redis.info("commandstats"))
            cpu = case.meter.stop()
        finally:
            await case.stop()
    recorded = cfg.jobs if cfg.job == "noop" else await done_count(cfg)
    out = {"jobs": cfg.jobs, "workers": cfg.workers, "submit_per_s": cfg.jobs / submit_s,
           "drain_per_s": cfg.jobs / (t1 - t0),
           "durable_per_s": cfg.jobs / (t1 - t0) if cfg.peer == "pgqueuer" else None,
           "cpu_us": per_job_cpu(cpu, cfg.jobs), "cpu_raw": cpu, "busy_cores": cpu["machine"] / cpu["wall"],
           "commandstats": stats, "notes": notes(cfg)}
    if recorded != cfg.jobs:
        out["error"] = f"handler recorded {recorded} of {cfg.jobs} jobs"
    return out


async def mode_single(cfg: Cfg) -> dict[str, Any]:
    await reset(cfg)
    async with CLIENTS[cfg.peer]() as client:
        one = getattr(client, "submit_one", None) or (lambda job: client.submit(1, job))
        await one("tiny")
        t = time.perf_counter()
        for _ in range(cfg.jobs):
            await one("tiny")
        s = time.perf_counter() - t
    return {"single_per_s": cfg.jobs / s, "notes": notes(cfg)}


async def mode_open(cfg: Cfg) -> dict[str, Any]:
    await reset(cfg)
    case = Case(cfg)
    async with CLIENTS[cfg.peer]() as client:
        try:
            await case.start(client)
            case.go.set()
            await asyncio.sleep(0.5)  # the workers connect (not measured)
            case.meter.start()
            intended, took = await produce(cfg.rate, cfg.duration, lambda n: client.submit(n, "tiny"))
            got = await wait_done(cfg, len(intended), timeout=60)
            await wait_remaining(client, time.perf_counter(), timeout=60)
            cpu = case.meter.stop()
            hist_rows = []
            if case.poll is not None:
                hist_rows = await case.poll.fetch("SELECT job_id, extract(epoch FROM created)::float8 AS t "
                                                  "FROM pgqueuer_log WHERE status = 'successful'")
        finally:
            await case.stop()
    starts = await done_map(cfg)
    lags = [(starts[str(i)] - t) * 1000 for i, t in intended.items() if str(i) in starts]
    hist = [r["t"] - starts[str(r["job_id"])] for r in hist_rows if str(r["job_id"]) in starts]
    t0 = min(intended.values(), default=0.0)
    by: dict[int, list[float]] = {}
    for i, t in intended.items():
        if str(i) in starts:
            by.setdefault(int((t - t0) // cfg.window_s), []).append((starts[str(i)] - t) * 1000)
    windows = [{"from_s": w * cfg.window_s, "n": len(v), "p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99)}
               for w, v in sorted(by.items())]
    return {"rate": cfg.rate, "achieved": len(intended) / took, "done": got, "p50_ms": percentile(lags, 50),
            "windows": windows,
            "p99_ms": percentile(lags, 99), "p999_ms": percentile(lags, 99.9), "max_ms": max(lags, default=None),
            "started": len(lags), "missing": len(intended) - len(lags),
            "history_p50_s": percentile(hist, 50) if hist else None,
            "history_p99_s": percentile(hist, 99) if hist else None, "history_max_s": max(hist, default=None),
            "cpu_us": per_job_cpu(cpu, max(1, len(intended))), "busy_cores": cpu["machine"] / cpu["wall"],
            "notes": notes(cfg)}


async def produce(rate: float, duration: float, submit: Callable[[int], Awaitable[list[Any]]]
                  ) -> tuple[dict[Any, float], float]:
    """The same producer as bench/throughput.py: 10 ms ticks, each submits every job due by now;
    returns job id -> intended submit time (epoch s) and the producer's seconds."""
    intended: dict[Any, float] = {}
    t0, w0 = time.perf_counter(), time.time()
    sent, tick, total = 0, 0, int(rate * duration)
    while sent < total:
        due = min(total, int(rate * (time.perf_counter() - t0)))
        if due > sent:
            ids = await submit(due - sent)
            for j, job_id in enumerate(ids):
                intended[job_id] = w0 + (sent + j) / rate
            sent = due
        tick += 1
        delay = t0 + tick * 0.01 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            tick = int((time.perf_counter() - t0) / 0.01)
    return intended, time.perf_counter() - t0


async def mode_spike(cfg: Cfg) -> dict[str, Any]:
    await reset(cfg)
    case = Case(cfg)
    async with CLIENTS[cfg.peer]() as client:
        try:
            await case.start(client)
            case.go.set()
            await asyncio.sleep(0.5)
            lead = 3.0 + cfg.jobs / 5000
            at = float(math.ceil(time.time() + lead))  # a whole second: SAQ schedules in seconds
            for i in range(0, cfg.jobs, 1000):
                await client.submit(min(1000, cfg.jobs - i), "tiny", at=at)
            margin = at - time.time()
            got = await wait_done(cfg, cfg.jobs, timeout=lead + 120)
        finally:
            await case.stop()
    starts = sorted(v - at for v in (await done_map(cfg)).values())
    return {"jobs": cfg.jobs, "started": got, "submitted_s_before_T": margin,
            "first_s": starts[0] if starts else None, "median_s": median(starts),
            "p99_s": percentile(starts, 99), "last_s": starts[-1] if starts else None, "notes": notes(cfg)}


async def mode_kill(cfg: Cfg) -> dict[str, Any]:
    await reset(cfg)
    case = Case(cfg)
    async with CLIENTS[cfg.peer]() as client:
        ids: list[Any] = []
        for i in range(0, cfg.jobs, 1000):
            ids += await client.submit(min(1000, cfg.jobs - i), "slow")
        try:
            await case.start(client)
            case.go.set()
            await wait_done(cfg, cfg.jobs // 2, key=RUNS_KEY)
            victim = case.procs[0]
            os.kill(victim.pid, signal.SIGKILL)
            t_kill = time.perf_counter()
            case.spawn()
            victim.join(5)
            timeout = 120.0
            while time.perf_counter() - t_kill < timeout:
                if not await client.remaining():
                    break
                await asyncio.sleep(0.05)
            drained = time.perf_counter() - t_kill
        finally:
            await case.stop()
    from redis.asyncio import Redis

    r = Redis.from_url(cfg.done_url)
    counts = {k.decode(): int(v) for k, v in (await r.hgetall(RUNS_KEY)).items()}
    await r.aclose()
    return {"jobs": cfg.jobs, "lost": sum(1 for i in ids if str(i) not in counts),
            "reruns": sum(c - 1 for c in counts.values() if c > 1), "drain_after_restart_s": drained,
            "timed_out": drained >= timeout, "notes": notes(cfg)}


async def mode_mixed(cfg: Cfg) -> dict[str, Any]:
    """Workload (d) of issue 23: `long` jobs of `long_s` seconds running while tiny jobs arrive at
    `rate` per second for `duration` s. Tiny-job lag percentiles, and the WAL PostgreSQL wrote per
    second over the open loop (pgqueuer only; the long jobs' heartbeats are row updates)."""
    await reset(cfg)
    case = Case(cfg)
    async with CLIENTS[cfg.peer]() as client:
        try:
            await case.start(client)
            case.go.set()
            await asyncio.sleep(0.5)
            for i in range(0, cfg.long, 1000):
                await client.submit_long(min(1000, cfg.long - i), cfg.long_s)
            long_started = await wait_done(cfg, cfg.long, key=LONG_KEY, timeout=120)
            lsn0 = await case.poll.fetchval("SELECT pg_current_wal_lsn()")
            t0 = time.perf_counter()
            case.meter.start()
            intended, took = await produce(cfg.rate, cfg.duration, lambda n: client.submit(n, "tiny"))
            got = await wait_done(cfg, len(intended), timeout=60)
            cpu = case.meter.stop()
            wal = await case.poll.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)", lsn0)
            wall = time.perf_counter() - t0
        finally:
            await case.stop()
    starts = await done_map(cfg)
    lags = [(starts[str(i)] - t) * 1000 for i, t in intended.items() if str(i) in starts]
    return {"rate": cfg.rate, "achieved": len(intended) / took, "done": got, "long": cfg.long,
            "long_started": long_started, "long_s": cfg.long_s,
            "p50_ms": percentile(lags, 50), "p99_ms": percentile(lags, 99), "max_ms": max(lags, default=None),
            "missing": len(intended) - len(lags), "wal_bytes_per_s": float(wal) / wall,
            "cpu_us": per_job_cpu(cpu, max(1, len(intended))), "busy_cores": cpu["machine"] / cpu["wall"],
            "notes": notes(cfg)}


def notes(cfg: Cfg) -> str:
    knob = {"arq": "max_jobs", "saq": "concurrency", "pgqueuer": "batch_size"}[cfg.peer]
    return (f"{knob}={cfg.knob or 'default'}; loop={loop_name()}; version={peer_version(cfg.peer)}; "
            f"completion=peer state polled every {POLL_S * 1000:.0f} ms")


def peer_version(peer: str) -> str:
    from importlib.metadata import version

    return version(peer)


MODES = {"drain": mode_drain, "single": mode_single, "open": mode_open, "spike": mode_spike, "kill": mode_kill,
         "mixed": mode_mixed}


def parse_args(argv: list[str] | None = None) -> Cfg:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", required=True, choices=PEERS)
    ap.add_argument("--mode", default="drain", choices=MODES)
    ap.add_argument("--job", default="tiny", choices=("tiny", "noop", "slow"))
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--concurrency", "--batch", type=int, default=None,
                    help="arq max_jobs / saq concurrency / pgqueuer batch_size per worker (default: the peer's)")
    ap.add_argument("--old-defaults", action="store_true", help="the README's settings: arq 200, saq 100, pgqueuer 100")
    ap.add_argument("--call-size", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    ap.add_argument("--done-url", default="redis://127.0.0.1:6379/15")
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/bench_peers")
    ap.add_argument("--window-s", type=float, default=60.0, help="open loop: lag percentiles per window")
    ap.add_argument("--long", type=int, default=0, help="mixed: long jobs running beside the tiny ones")
    ap.add_argument("--long-s", type=float, default=60.0, help="mixed: seconds each long job runs")
    a = ap.parse_args(argv)
    knob = a.concurrency or (OLD_DEFAULTS[a.peer] if a.old_defaults else None)
    return Cfg(a.peer, a.mode, a.job, a.jobs, a.workers, knob, a.old_defaults, a.call_size, a.rate, a.duration,
               a.redis_url, a.done_url, a.database_url, a.window_s, a.long, a.long_s)


def main(argv: list[str] | None = None) -> int:
    global CFG
    cfg = CFG = parse_args(argv)
    os.environ["BENCH_DONE_URL"] = cfg.done_url
    if importlib.util.find_spec(cfg.peer) is None:
        print(json.dumps({"peer": cfg.peer, "error": f"{cfg.peer} is not installed"}), flush=True)
        return 0
    try:
        out = run_async(MODES[cfg.mode](cfg))
    except Exception as e:
        out = {"error": f"{type(e).__name__}: {e}"}
    out = {"peer": cfg.peer, "mode": cfg.mode, **out}
    print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
