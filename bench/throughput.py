"""Throughput, CPU per job, latency and recovery: Fencepost beside pgqueuer and SAQ, run the same way.

    python bench/throughput.py --repeats 2             # the default table (realistic tiny job)
    python bench/throughput.py --noop                  # the old no-op / high-concurrency table
    python bench/throughput.py --open-loop 4000        # fixed-rate producer, submit->start lag
    python bench/throughput.py --find-max --duration 15
    python bench/throughput.py --spike 5000            # N runs due at one instant T
    python bench/throughput.py --kill                  # SIGKILL a worker mid-drain
    python bench/throughput.py --systems fencepost     # any mode, fewer systems

Method, the same for every system (peers run in .venv-bench through bench/peers/run_peer.py):

- The job is a realistic tiny one: the handler makes one async Redis round trip recording its id
  and start time (`HSET bench:done <id> <time>` on Redis DB 15), so every system pays the same
  handler cost and completions are counted outside each system's own bookkeeping.
- Default worker settings: Fencepost `worker` without --concurrency (100), plus one reconciler
  (it persists every transition to PostgreSQL); pgqueuer `QueueManager.run()` defaults (batch 10)
  and a second row at batch 100 (what the README used); SAQ `Worker` defaults (concurrency 10).
- Bulk submit: N jobs in calls of 1,000 (pgqueuer: list enqueue; SAQ has no bulk call, so 1,000
  concurrent `enqueue`s per call). Single submit: 2,000 submits awaited one at a time.
- Drain: workers are started and idle first (Fencepost on a paused queue, peers behind a go
  event), then the clock starts; drain/s = N / (until the system's own state holds no job).
- CPU-us per job per process, from the kernel (/proc/<pid>/stat utime+stime), from the start
  signal until PostgreSQL holds every outcome: worker processes (with their children), the
  recorder (Fencepost's reconciler), the Redis server, the PostgreSQL backends connected to the
  bench database (the harness's own connections excluded), and PostgreSQL's shared helpers
  (postmaster, WAL writer, checkpointer...). Redis and the helpers serve other people too, so
  their idle rate, measured for 1 s just before the start signal, is subtracted.
- Systems are interleaved (fencepost, pgqueuer, pgqueuer b100, saq, fencepost, ...) and medians
  of --repeats are printed, with ratios fencepost / peer (for CPU, lower is better).

`BENCH_NICE=N` starts Fencepost's reconciler at that niceness (an experiment: with every process in
one cgroup, a recorder's batch is a CPU burst that delays dispatch; docs/performance.md has the figures).

Redis DB 14 holds the queues, DB 15 the handler's records; PostgreSQL databases bench_fencepost
and bench_peers are dropped and recreated for every case.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import asyncpg
from redis.asyncio import Redis

try:
    import uvloop
except ImportError:  # the default loop
    uvloop = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.app import DONE_KEY, RUNS_KEY, registry
from bench.measure import (
    CpuMeter,
    commandstats_delta,
    median,
    one_bench_at_a_time,
    parent_pid,
    percentile,
    pg_aux_pids,
    pg_backend_pids,
    settle,
    tree,
)
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit
from fencepost.core.record import upgrade

QUEUE = "bench"
FP_DB = "bench_fencepost"
PEER_DB = "bench_peers"
PEER_PY = ROOT / ".venv-bench" / "bin" / "python"
POLL_S = 0.01
ROLES = ("worker", "recorder", "redis", "pg", "pg_shared")
SYSTEMS = ("fencepost", "pgqueuer", "pgqueuer-b100", "saq")
REF = "fencepost-ref"
"""Another Fencepost build (`--ref-python`), run interleaved with this one: before/after a change."""


# --------------------------------------------------------------------------- shared helpers

async def fresh_database(admin_url: str, name: str) -> str:
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = admin_url.rsplit("/", 1)[0] + "/" + name
    conn = await asyncpg.connect(url)
    await upgrade(conn)
    await conn.close()
    return url


def spawn(settings: Settings, *args: str, **extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, FENCEPOST_REDIS_URL=settings.redis_url, FENCEPOST_DATABASE_URL=settings.database_url,
               FENCEPOST_PREFIX=settings.prefix, FENCEPOST_LOG_FORMAT="json",
               PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p), **extra)
    nice = int(os.environ.get("BENCH_NICE", "0")) if args[:1] == ("reconciler",) else 0
    return subprocess.Popen([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=(lambda: os.nice(nice)) if nice else None)


async def drain_and_record(client: Client, queue_keys: list, workers: int) -> tuple[float, float]:
    """(Used by bench/scale.py.) Unpause the queues the already started workers wait on; return
    (seconds until Redis holds no due, delayed or active run, then seconds until PostgreSQL has
    every run SUCCEEDED)."""
    redis = client.stores.redis
    await asyncio.sleep(3)  # let the processes import and connect (not timed)
    t1 = time.perf_counter()
    for k in queue_keys:
        await redis.delete(k.paused)
        await redis.rpush(k.wake, *([1] * workers))
    await wait_queues_empty(redis, queue_keys)
    drain_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    pool = client.stores.db.pool
    assert pool is not None
    while await pool.fetchval("SELECT count(*) FROM runs WHERE status <> 'SUCCEEDED'") > 0:
        await asyncio.sleep(0.02)
    return drain_s, time.perf_counter() - t2


async def wait_queues_empty(redis: Any, queue_keys: list, timeout: float = 600.0) -> None:
    t0 = time.perf_counter()
    while True:
        pipe = redis.pipeline(transaction=False)
        for k in queue_keys:
            pipe.zcard(k.due)
            pipe.zcard(k.active)
            pipe.zcard(k.delayed)
        if sum(await pipe.execute()) == 0:
            return
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError("the queue did not drain")
        await asyncio.sleep(POLL_S)


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


class Fencepost:
    """One Fencepost case: a fresh database and Redis DB, a client, spawned services, a CPU meter."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.procs: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []

    async def __aenter__(self) -> Self:
        a = self.a
        db_url = await fresh_database(a.admin_url, FP_DB)
        self.settings = Settings(redis_url=a.redis_url, database_url=db_url, prefix="bench")
        self.client = await Client(settings=self.settings).connect()
        self.redis = self.client.stores.redis
        self.keys = self.client.stores.keys(QUEUE)
        await self.redis.flushdb()
        self.done = Redis.from_url(a.done_url)
        await self.done.delete(DONE_KEY, RUNS_KEY)
        await self.client.register(registry)
        self.poll = await asyncpg.connect(db_url)  # the harness's own completion polls (excluded from CPU)
        self.postmaster = parent_pid(await self.poll.fetchval("SELECT pg_backend_pid()")) or 0
        self.redis_pid = int((await self.redis.info("server"))["process_id"])
        return self

    async def __aexit__(self, *exc: object) -> None:
        stop(self.procs)
        for close in (self.poll.close, self.done.aclose, self.client.close):
            try:
                await close()
            except Exception:  # a connection PostgreSQL's restart took (the outage case)
                pass

    def start(self, workers: int, *worker_args: str, reconciler: bool = True) -> None:
        """Spawn the reconcilers (`--reconcilers`, default 1) and `workers` workers; snapshot the harness's
        PostgreSQL backends first."""
        self.harness_backends = pg_backend_pids(self.postmaster, FP_DB)()
        if reconciler:
            for i in range(self.a.reconcilers):  # replicas on one host: an id each (reconciler/shares.py)
                self.procs.append(spawn(self.settings, "reconciler", FENCEPOST_RECORDER_ID=f"bench-rec-{i}"))
        for _ in range(workers):
            self.add_worker(*worker_args)

    def add_worker(self, *worker_args: str) -> subprocess.Popen[bytes]:
        p = spawn(self.settings, "worker", "--app", "bench.app:registry", "--queue", QUEUE, *worker_args)
        self.procs.append(p)
        self.workers.append(p)
        return p

    def meter(self) -> CpuMeter:
        workers = self.workers
        recon = [p for p in self.procs if p not in workers]
        return CpuMeter({
            "worker": lambda: [q for p in workers for q in tree(p.pid)()],
            "recorder": lambda: [q for p in recon for q in tree(p.pid)()],
            "redis": lambda: [self.redis_pid],
            "pg": pg_backend_pids(self.postmaster, FP_DB, exclude=self.harness_backends),
            "pg_shared": pg_aux_pids(self.postmaster),
        }, shared=("redis", "pg_shared"))

    async def settle(self) -> None:
        procs = self.procs
        await asyncio.to_thread(settle, lambda: [q for p in procs for q in tree(p.pid)()])

    async def go(self, workers: int) -> None:
        await self.redis.delete(self.keys.paused)
        await self.redis.rpush(self.keys.wake, *([1] * workers))

    async def q(self, sql: str) -> Any:
        """fetchval on the harness's connection, reconnecting while PostgreSQL is away (the outage case)."""
        while True:
            try:
                return await self.poll.fetchval(sql)
            except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                    asyncpg.exceptions.OperatorInterventionError):
                await asyncio.sleep(0.1)
                try:
                    self.poll = await asyncpg.connect(self.settings.database_url, timeout=2)
                except Exception:
                    pass

    async def wait_history(self, timeout: float = 300.0) -> None:
        t0 = time.perf_counter()
        # the partial index runs_active holds exactly the unfinished runs: a cheap poll
        while await self.q("SELECT EXISTS (SELECT 1 FROM runs WHERE status IN ('PENDING', "
                           "'RETRY_WAIT', 'RUNNING', 'STOPPING', 'PAUSED', 'BLOCKED'))"):
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError("PostgreSQL did not receive every outcome")
            await asyncio.sleep(0.02)

    async def wait_done(self, n: int, key: str = DONE_KEY, timeout: float = 120.0) -> int:
        t0 = time.perf_counter()
        while (got := await self.done.hlen(key)) < n and time.perf_counter() - t0 < timeout:
            await asyncio.sleep(POLL_S)
        return got

    async def starts(self, key: str = DONE_KEY) -> dict[int, float]:
        """Every job's start time, read in slices: one HGETALL of a 15-minute open loop's 1,350,000 fields
        outlasted the client's socket timeout and lost the run."""
        return {int(k): float(v) async for k, v in self.done.hscan_iter(key, count=20_000)}


def per_job_cpu(cpu: dict[str, float], jobs: int) -> dict[str, float]:
    out = {r: round(cpu.get(r, 0.0) / jobs * 1e6, 1) for r in ROLES}
    out["total"] = round(sum(out[r] for r in ROLES), 1)
    out["machine"] = round(cpu.get("machine", 0.0) / jobs * 1e6, 1)
    return out


# --------------------------------------------------------------------------- Fencepost cases

async def fp_drain(a: argparse.Namespace, workers: int) -> dict[str, Any]:
    """Bulk submit onto a paused queue, start the services, then drain; CPU over the drain and the
    recorder's catch-up."""
    handler = "bench.noop" if a.noop else "bench.tiny"
    call = a.call_size or (10_000 if a.noop else 1_000)
    wargs = ("--concurrency", str(a.concurrency)) if a.concurrency else ()
    async with Fencepost(a) as fp:
        await fp.redis.set(fp.keys.paused, 1)  # workers start idle; the clock starts at unpause
        t0 = time.perf_counter()
        for i in range(0, a.jobs, call):
            await fp.client.submit_many([Submit(handler=handler)] * min(call, a.jobs - i))
        submit_s = time.perf_counter() - t0
        fp.start(workers, *wargs)
        await fp.settle()
        meter = fp.meter()
        await asyncio.to_thread(meter.baseline, 1.0)
        stats0 = await fp.redis.info("commandstats")
        meter.start()
        t1 = time.perf_counter()
        await fp.go(workers)
        await wait_queues_empty(fp.redis, [fp.keys])
        drain_s = time.perf_counter() - t1
        await fp.wait_history(timeout=600)
        lag_s = time.perf_counter() - t1 - drain_s
        history_done_at = time.time()
        stats = commandstats_delta(stats0, await fp.redis.info("commandstats"))
        cpu = meter.stop()
        recorded = a.jobs if a.noop else await fp.done.hlen(DONE_KEY)
        events = await fp.q("SELECT count(*) FROM events")
        failed = await fp.q("SELECT count(*) FROM runs WHERE status <> 'SUCCEEDED'")
        alive = sum(1 for p in fp.procs if p.poll() is None)
    out = {"system": "fencepost", "workers": workers, "jobs": a.jobs, "submit_per_s": a.jobs / submit_s,
           "drain_per_s": a.jobs / drain_s, "durable_per_s": a.jobs / (drain_s + lag_s), "history_lag_s": lag_s,
           "cpu_us": per_job_cpu(cpu, a.jobs), "busy_cores": cpu["machine"] / cpu["wall"],
           "cpu_raw": cpu, "commandstats": stats, "events": events, "history_done_at": history_done_at,
           "procs_alive": alive, "procs": len(fp.procs),
           "notes": f"concurrency={a.concurrency or 'default'}; calls of {call}; reconcilers={a.reconcilers}"}
    if recorded != a.jobs or failed:
        out["error"] = f"handler recorded {recorded} of {a.jobs} jobs; {failed} runs not SUCCEEDED"
    return out


async def fp_single(a: argparse.Namespace) -> dict[str, Any]:
    """Sequential single submits: each awaited before the next (no workers running)."""
    async with Fencepost(a) as fp:
        fp.client.enqueue_behind = a.enqueue_behind
        await fp.client.submit("bench.tiny")  # warm the definition cache and the connections
        t0 = time.perf_counter()
        for _ in range(a.single):
            await fp.client.submit("bench.tiny")
        s = time.perf_counter() - t0
        window: list[float] = []
        if a.enqueue_behind:  # the window: from a submit's return until Redis holds its run
            for _ in range(200):
                run_id = await fp.client.submit("bench.tiny")
                t = time.perf_counter()
                while await fp.redis.zscore(fp.keys.due, str(run_id)) is None:
                    await asyncio.sleep(0)
                window.append((time.perf_counter() - t) * 1000)
    out = {"system": "fencepost", "single_per_s": a.single / s}
    if window:
        out.update(window_p50_ms=percentile(window, 50), window_p99_ms=percentile(window, 99),
                   window_max_ms=max(window))
    return out


def lag_summary(intended: dict[int, float], starts: dict[int, float]) -> dict[str, float]:
    lags = [(starts[i] - t) * 1000 for i, t in intended.items() if i in starts]
    return {"p50_ms": percentile(lags, 50), "p99_ms": percentile(lags, 99), "p999_ms": percentile(lags, 99.9),
            "max_ms": max(lags, default=float("nan")), "started": len(lags), "missing": len(intended) - len(lags)}


def lag_windows(intended: dict[Any, float], starts: dict[Any, float], window_s: float) -> list[dict[str, float]]:
    """Submit->start p50/p99 per `window_s` of intended submit time (does the tail grow as the run goes on?)."""
    if not intended:
        return []
    t0 = min(intended.values())
    by: dict[int, list[float]] = {}
    for i, t in intended.items():
        if i in starts:
            by.setdefault(int((t - t0) // window_s), []).append((starts[i] - t) * 1000)
    return [{"from_s": w * window_s, "n": len(v), "p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99)}
            for w, v in sorted(by.items())]


async def produce(rate: float, duration: float, submit: Any) -> tuple[dict[int, float], float]:
    """Submit at `rate` jobs/s in 10 ms ticks for `duration` s; each tick submits every job due by now
    (so a slow call makes the next one bigger, not the rate lower). Returns run id -> intended submit
    time (epoch s; lag is measured from it, so a producer falling behind shows as lag) and the seconds
    the producer took."""
    intended: dict[int, float] = {}
    t0, w0 = time.perf_counter(), time.time()
    sent, tick = 0, 0
    total = int(rate * duration)
    while sent < total:
        due = min(total, int(rate * (time.perf_counter() - t0)))
        if due > sent:
            ids = await submit(due - sent)
            for j, run_id in enumerate(ids):
                intended[run_id] = w0 + (sent + j) / rate
            sent = due
        tick += 1
        delay = t0 + tick * 0.01 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            tick = int((time.perf_counter() - t0) / 0.01)
    return intended, time.perf_counter() - t0


async def fp_open_loop(a: argparse.Namespace, rate: float) -> dict[str, Any]:
    async with Fencepost(a) as fp:
        fp.start(2)
        await fp.settle()
        meter = fp.meter()
        await asyncio.to_thread(meter.baseline, 1.0)
        meter.start()

        async def submit(n: int) -> list[int]:
            return await fp.client.submit_many([Submit(handler="bench.tiny")] * n)

        intended, took = await produce(rate, a.duration, submit)
        got = await fp.wait_done(len(intended), timeout=60)
        await fp.wait_history(timeout=600)
        cpu = meter.stop()
        starts = await fp.starts()
        source = "history" if await fp.poll.fetchval("SELECT to_regclass('history') IS NOT NULL") else "events"
        rows = await fp.poll.fetch(f"SELECT run_id, extract(epoch FROM recorded_at)::float8 AS t FROM {source} "
                                   "WHERE to_status = 'SUCCEEDED'")
    hist = [r["t"] - starts[r["run_id"]] for r in rows if r["run_id"] in starts]
    return {"system": "fencepost", "rate": rate, "achieved": len(intended) / took, "done": got,
            **lag_summary(intended, starts), "windows": lag_windows(intended, starts, a.window_s),
            "history_p50_s": percentile(hist, 50),
            "history_p99_s": percentile(hist, 99), "history_max_s": max(hist, default=float("nan")),
            "cpu_us": per_job_cpu(cpu, max(1, len(intended))), "busy_cores": cpu["machine"] / cpu["wall"]}


async def fp_spike(a: argparse.Namespace) -> dict[str, Any]:
    """N runs due at one instant T (submitted beforehand with run_at=T), 2 idle workers."""
    n = a.spike
    async with Fencepost(a) as fp:
        fp.start(2)
        await fp.settle()
        lead = 3.0 + n / 5000
        at = float(math.ceil(time.time() + lead))  # a whole second, as for the peers (SAQ schedules in seconds)
        run_at = datetime.fromtimestamp(at, UTC)
        for i in range(0, n, 1000):
            await fp.client.submit_many([Submit(handler="bench.tiny", run_at=run_at)] * min(1000, n - i))
        margin = at - time.time()
        got = await fp.wait_done(n, timeout=lead + 120)
        starts = sorted(v - at for v in (await fp.starts()).values())
    return spike_result("fencepost", n, starts, got, margin)


def spike_result(system: str, n: int, starts: list[float], got: int, margin: float) -> dict[str, Any]:
    return {"system": system, "jobs": n, "started": got, "submitted_s_before_T": margin,
            "first_s": starts[0] if starts else float("nan"), "median_s": median(starts),
            "p99_s": percentile(starts, 99), "last_s": starts[-1] if starts else float("nan")}


async def fp_kill(a: argparse.Namespace) -> dict[str, Any]:
    """5,000 jobs of 20 ms, 2 workers; SIGKILL one when half have run, restart it at once."""
    n = a.kill_jobs
    async with Fencepost(a) as fp:
        await fp.redis.set(fp.keys.paused, 1)
        ids = []
        for i in range(0, n, 1000):
            ids += await fp.client.submit_many([Submit(handler="bench.slow")] * min(1000, n - i))
        fp.start(2)
        await fp.settle()
        await fp.go(2)
        await fp.wait_done(n // 2, key=RUNS_KEY)
        victim = fp.workers[0]
        victim.send_signal(signal.SIGKILL)
        t_kill = time.perf_counter()
        fp.add_worker()
        victim.wait()
        timeout = 120.0
        while time.perf_counter() - t_kill < timeout:
            left = await fp.poll.fetchval("SELECT count(*) FROM runs WHERE status NOT IN ('SUCCEEDED', 'FAILED')")
            if left == 0 and await fp.done.hlen(RUNS_KEY) >= n:
                break
            await asyncio.sleep(0.05)
        drained = time.perf_counter() - t_kill
        counts = {int(k): int(v) for k, v in (await fp.done.hgetall(RUNS_KEY)).items()}
        status = dict(await fp.poll.fetch("SELECT status, count(*) FROM runs GROUP BY status"))
    lost = sum(1 for i in ids if i not in counts)
    return {"system": "fencepost", "jobs": n, "lost": lost, "reruns": sum(c - 1 for c in counts.values() if c > 1),
            "drain_after_restart_s": drained, "timed_out": drained >= timeout, "status": status}


# --------------------------------------------------------------------------- peers

def run_peer(a: argparse.Namespace, peer: str, mode: str, *extra: str) -> dict[str, Any]:
    """Run one peer case in the peers' venv; its last JSON line is the result."""
    if not PEER_PY.exists():
        return {"system": peer, "error": "peers not installed: python3 -m venv .venv-bench && "
                                         ".venv-bench/bin/pip install -r bench/peers/requirements.txt"}
    name, batch = ([*peer.split("-b"), ""])[:2]
    cmd = [str(PEER_PY), str(ROOT / "bench" / "peers" / "run_peer.py"), "--peer", name, "--mode", mode,
           "--redis-url", a.redis_url, "--done-url", a.done_url,
           "--database-url", a.admin_url.rsplit("/", 1)[0] + "/" + PEER_DB, *extra]
    if batch:
        cmd += ["--batch", batch]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            data["system"] = peer
            return data
    return {"system": peer, "error": (out.stderr or out.stdout)[-400:]}


def peer_drain(a: argparse.Namespace, peer: str, workers: int) -> dict[str, Any]:
    extra = ["--jobs", str(a.jobs), "--workers", str(workers)]
    if a.noop:
        extra += ["--job", "noop", "--call-size", str(a.call_size or 10_000), "--old-defaults"]
    else:
        extra += ["--call-size", str(a.call_size or 1_000)]
    return run_peer(a, peer, "drain", *extra)


# --------------------------------------------------------------------------- modes and tables

def fmt(v: Any, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (int, float)):
        return f"{v:,.{digits}f}"
    return str(v)


def case(a: argparse.Namespace, system: str, mode: str, workers: int = 2, rate: float = 0.0) -> dict[str, Any]:
    """One case of one system: Fencepost in this process, the reference build through its own interpreter
    (`--ref-python`), a peer through bench/peers/run_peer.py."""
    if system == "fencepost":
        coro = {"drain": lambda: fp_drain(a, workers), "single": lambda: fp_single(a),
                "open": lambda: fp_open_loop(a, rate), "spike": lambda: fp_spike(a), "kill": lambda: fp_kill(a)}[mode]
        # the harness's own Fencepost client (bulk and single submits, the open-loop producer) on uvloop,
        # as the peers' clients are (bench/peers/run_peer.py) and as Fencepost's services are
        return (uvloop.run if uvloop is not None else asyncio.run)(coro())
    if system == REF:
        return run_ref(a, mode, workers, rate)
    if mode == "drain":
        return peer_drain(a, system, workers)
    extra = {"single": ["--jobs", str(a.single)],
             "open": ["--rate", str(rate), "--duration", str(a.duration), "--workers", "2",
                      "--window-s", str(a.window_s)],
             "spike": ["--jobs", str(a.spike), "--workers", "2"],
             "kill": ["--jobs", str(a.kill_jobs), "--workers", "2"]}[mode]
    return run_peer(a, system, mode, *extra)


def run_ref(a: argparse.Namespace, mode: str, workers: int, rate: float) -> dict[str, Any]:
    """This harness run by another build's interpreter (`--ref-python`, e.g. a venv with the commit before
    a change installed), for one case: its services are spawned with that interpreter, so the two builds
    are measured interleaved in one run, on the same machine state."""
    cmd = [a.ref_python, str(Path(__file__).resolve()), "--case", mode, "--workers", str(workers),
           "--jobs", str(a.jobs), "--single", str(a.single), "--duration", str(a.duration),
           "--kill-jobs", str(a.kill_jobs), "--redis-url", a.redis_url, "--done-url", a.done_url,
           "--admin-url", a.admin_url]
    cmd += ["--open-loop", str(rate)] if mode == "open" else []
    cmd += ["--spike", str(a.spike)] if mode == "spike" else []
    cmd += ["--noop"] if a.noop else []
    cmd += ["--enqueue-behind"] if a.enqueue_behind and mode == "single" else []
    cmd += ["--call-size", str(a.call_size)] if a.call_size else []
    cmd += ["--concurrency", str(a.concurrency)] if a.concurrency else []
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            data["system"] = REF
            return data
    return {"system": REF, "error": (out.stderr or out.stdout)[-400:]}


def drain_table(a: argparse.Namespace) -> None:
    systems = [s for s in a.systems if not (a.noop and s == "pgqueuer-b100")]
    results: list[dict[str, Any]] = []
    for rep in range(a.repeats):
        for system in systems:
            for w in a.workers if a.jobs else ():  # --jobs 0: sequential single submits only
                r = case(a, system, "drain", w)
                r.update(repeat=rep, workers=w, system=system)
                if "error" not in r:  # the database of the case is there until the next case drops it
                    r["storage"] = asyncio.run(storage(a.admin_url, system_db(system)))
                results.append(r)
                progress(r)
            if a.single and not a.noop and system != "pgqueuer-b100":
                r = case(a, system, "single")
                r.update(repeat=rep, system=system)
                results.append(r)
                progress(r)
    if a.save:
        Path(a.save).parent.mkdir(parents=True, exist_ok=True)
        Path(a.save).write_text(json.dumps(results, indent=1, default=str))
    print_drain(a, systems, results)
    last = {}
    for r in results:
        if r.get("storage"):
            last[r["system"]] = r
    if last:
        print("\nPostgreSQL storage after the last drain of each system (tables + indexes + TOAST, full history):")
        print_storage(list(last.values()))


def progress(r: dict[str, Any]) -> None:
    keep = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()
            if k not in ("commandstats", "cpu_raw", "status", "storage", "windows")}
    print("  " + json.dumps(keep, default=str), file=sys.stderr, flush=True)


def med(results: list[dict[str, Any]], system: str, key: str, workers: int | None = None,
        sub: str | None = None) -> float:
    vals = []
    for r in results:
        if r.get("system") != system or "error" in r or key not in r:
            continue
        if workers is not None and r.get("workers") != workers:
            continue
        v = r[key][sub] if sub else r[key]
        if v is not None:
            vals.append(float(v))
    return median(vals)


def print_drain(a: argparse.Namespace, systems: list[str], results: list[dict[str, Any]]) -> None:
    peers = [s for s in systems if s != "fencepost"]
    job = "no-op job, --concurrency 500 for Fencepost, peers' old settings" if a.noop else \
        "tiny job (one Redis round trip), default worker settings"
    print(f"\n{os.cpu_count()} cores; {a.jobs:,} jobs; {job}; medians of {a.repeats} interleaved runs; "
          "every Fencepost transition persisted to PostgreSQL by one reconciler")
    short = {"pgqueuer": "pgq", "pgqueuer-b100": "pgq-b100", REF: "fp-ref"}
    cols = systems + ([f"fp/{short.get(p, p)}" for p in peers] if "fencepost" in systems else [])
    print(f"{'':34}" + "".join(f"{c:>15}" for c in cols))

    def row(label: str, key: str, workers: int | None = None, sub: str | None = None, digits: int = 0) -> None:
        vals = {s: med(results, s, key, workers, sub) for s in systems}
        cells = [fmt(vals[s], digits) for s in systems]
        if "fencepost" in systems:
            for p in peers:
                f, v = vals["fencepost"], vals[p]
                cells.append(f"x{f / v:.2f}" if not (math.isnan(f) or math.isnan(v)) and v else "-")
        print(f"{label:34}" + "".join(f"{c:>15}" for c in cells))

    if not a.jobs:
        if a.single and not a.noop:
            row(f"single submit/s ({a.single:,} sequential)", "single_per_s")
        return
    for w in a.workers:
        row(f"drain jobs/s, {w} worker{'s' if w > 1 else ''}", "drain_per_s", w)
    for w in a.workers:
        row(f"  to durable history, {w}w", "durable_per_s", w)
    bulk = a.call_size or (10_000 if a.noop else 1_000)
    row(f"bulk submit/s (calls of {bulk:,})", "submit_per_s", a.workers[0])
    if a.single and not a.noop:
        row(f"single submit/s ({a.single:,} sequential)", "single_per_s")
    for w in a.workers:
        print(f"CPU-us per job, {w} worker{'s' if w > 1 else ''} (lower is better)")
        for role, label in (("worker", "worker process(es)"), ("recorder", "recorder (reconciler)"),
                            ("redis", "Redis server"), ("pg", "PostgreSQL backends"),
                            ("pg_shared", "PostgreSQL shared helpers"), ("total", "total"),
                            ("machine", "whole machine (cross-check)")):
            row(f"  {label}", "cpu_us", w, role, 1)
    for w in a.workers:
        row(f"history lag after drain s, {w}w", "history_lag_s", w, digits=2)
    for w in a.workers:
        row(f"machine busy in the window, cores, {w}w", "busy_cores", w, digits=2)
    idle = {s: (median(r["cpu_raw"].get("redis_idle_per_s", 0) for r in results if r.get("system") == s and "cpu_raw" in r),
                median(r["cpu_raw"].get("pg_shared_idle_per_s", 0) for r in results if r.get("system") == s and "cpu_raw" in r))
            for s in systems}
    print("idle CPU subtracted (median, CPU-s per s; Redis / PostgreSQL helpers): "
          + ", ".join(f"{s} {fmt(i[0], 3)} / {fmt(i[1], 3)}" for s, i in idle.items()))
    errors = [r for r in results if "error" in r]
    for r in errors:
        print(f"error: {r['system']} {r.get('workers', '')}: {r['error']}")
    fp = [r for r in results if r.get("system") == "fencepost" and "commandstats" in r and r.get("workers") == a.workers[0]]
    if fp:
        r = fp[-1]
        top = sorted(r["commandstats"].items(), key=lambda kv: -kv[1]["usec"])[:12]
        where = "a private server" if a.private_redis else "the whole shared server: other users' commands may show"
        print(f"\nFencepost Redis INFO commandstats per job (last run, {r['workers']} worker; {where}):")
        for name, s in top:
            print(f"  {name:22} {s['calls'] / r['jobs']:6.2f} calls  {s['usec'] / r['jobs']:7.1f} us")
        print(f"  events rows: {r['events']:,} ({r['events'] / r['jobs']:.2f} per job)")


def open_loop(a: argparse.Namespace) -> None:
    systems = [s for s in a.systems if s in ("fencepost", REF, "pgqueuer", "pgqueuer-b100")]
    if a.find_max:
        for s in systems:
            best = find_max(a, s)
            print(f"{s}: highest offered rate with p99 submit->start < {a.p99_target_ms:g} ms: {fmt(best)} jobs/s")
        return
    rows = []
    for _ in range(a.repeats):
        for s in systems:
            rows.append(one_open_loop(a, s, a.open_loop))
            progress(rows[-1])
    print(f"\nopen loop: one producer, {a.open_loop:,} jobs/s offered in 10 ms ticks for {a.duration:g} s, 2 workers; "
          "lag from each job's intended submit time to its handler's start"
          + ("; another connection holds a REPEATABLE READ snapshot open in the system's database" if a.hold_snapshot
             else ""))
    print_open(rows)
    print_windows(rows)
    print_storage(rows, per="started")


def system_db(system: str) -> str:
    return FP_DB if system in ("fencepost", REF) else PEER_DB


def one_open_loop(a: argparse.Namespace, system: str, rate: float) -> dict[str, Any]:
    holder = SnapshotHolder(a.admin_url, system_db(system)) if a.hold_snapshot else None
    try:
        r = case(a, system, "open", rate=rate)
    finally:
        if holder is not None:
            holder.release()
    r["system"] = system
    r["snapshot_held_s"] = (time.time() - holder.held_at) if holder is not None and holder.held_at else None
    r["storage"] = asyncio.run(storage(a.admin_url, system_db(system)))
    return r


def print_storage(rows: list[dict[str, Any]], per: str = "jobs") -> None:
    """The hot tables' dead tuples and the bytes per job of each case."""
    for r in rows:
        st = r.get("storage") or {}
        if not st:
            continue
        n = r.get(per) or r.get("started") or 1
        total = sum(v["bytes"] for v in st.values())
        top = sorted(st.items(), key=lambda kv: -kv[1]["bytes"])[:4]
        print(f"  {r['system']:15} {total / n:8,.0f} bytes/job over {n:,} jobs; "
              + "; ".join(f"{t} {v['bytes'] / 1e6:.1f} MB live {v['live']:,} dead {v['dead']:,}" for t, v in top))


def print_windows(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        w = r.get("windows") or []
        if w:
            print(f"  {r['system']:15} p50/p99 ms per window: "
                  + "  ".join(f"{x['p50_ms']:.1f}/{x['p99_ms']:.1f}" for x in w))


def print_open(rows: list[dict[str, Any]]) -> None:
    print(f"{'system':15}{'offered':>9}{'achieved':>9}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>9}{'max ms':>9}"
          f"{'missing':>8}{'hist p99 s':>11}{'hist max s':>11}{'CPU us/job':>11}{'busy cores':>11}")
    for r in rows:
        if "error" in r:
            print(f"{r['system']:15} error: {r['error']}")
            continue
        print(f"{r['system']:15}{fmt(r['rate']):>9}{fmt(r['achieved']):>9}{fmt(r['p50_ms'], 1):>9}"
              f"{fmt(r['p99_ms'], 1):>9}{fmt(r['p999_ms'], 1):>9}{fmt(r['max_ms'], 1):>9}{r['missing']:>8}"
              f"{fmt(r.get('history_p99_s'), 2):>11}{fmt(r.get('history_max_s'), 2):>11}"
              f"{fmt(r.get('cpu_us', {}).get('total'), 1):>11}{fmt(r.get('busy_cores'), 2):>11}")


def find_max(a: argparse.Namespace, system: str) -> float:
    """Double the offered rate until p99 >= target (or the producer falls 5% short), then bisect."""

    def ok(rate: float) -> bool:
        r = one_open_loop(a, system, rate)
        progress(r)
        return "error" not in r and r["missing"] == 0 and r["p99_ms"] < a.p99_target_ms and r["achieved"] >= 0.95 * rate

    good, bad, rate = 0.0, 0.0, float(a.start_rate)
    while rate <= 64_000:
        if ok(rate):
            good, rate = rate, rate * 2
        else:
            bad = rate
            break
    if not bad:
        return good
    for _ in range(a.bisect):
        mid = round((good + bad) / 2, -2)
        if mid in (good, bad):
            break
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def backlog(a: argparse.Namespace) -> None:
    """(b) N queued, then drained by one worker: jobs/s per window of --window-jobs (flat if nothing grows
    with the backlog), beside the system's 20,000-job drain rate from the same run."""
    rows = []
    jobs = a.jobs
    for _ in range(a.repeats):
        for s in [x for x in a.systems if x in ("fencepost", REF, "pgqueuer")]:
            a.jobs = 20_000
            ref = case(a, s, "drain", 1)
            a.jobs = a.backlog
            sampler = DoneSampler(a.done_url)
            r = case(a, s, "drain", 1)
            r["system"], r["ref_drain_per_s"] = s, ref.get("drain_per_s")
            r["windows"] = sampler.windows(a.window_jobs, a.backlog)
            r["storage"] = asyncio.run(storage(a.admin_url, system_db(s)))
            rows.append(r)
            progress(r)
    a.jobs = jobs
    print(f"\nbacklog: {a.backlog:,} queued, then drained by 1 worker; jobs/s per {a.window_jobs:,}-job window")
    for r in rows:
        w = [x["per_s"] for x in r.get("windows") or []]
        ref = r.get("ref_drain_per_s") or float("nan")
        worst = min(w, default=float("nan"))
        print(f"  {r['system']:15} 20k drain {fmt(ref)}/s; windows " + " ".join(fmt(x) for x in w)
              + f"; worst window x{worst / ref:.2f} of the 20k rate" + (f"  error: {r['error']}" if "error" in r else ""))
    print_storage(rows)


def outage(a: argparse.Namespace) -> None:
    """(c) The private PostgreSQL stopped for --pg-outage seconds once --outage-after jobs had started, mid
    drain of --jobs queued (1 worker): jobs started while it was down (and the rate then against before),
    processes still alive, and seconds from its return until the system's history was complete."""
    import threading
    if not PRIVATE_PG:
        raise SystemExit("--pg-outage needs --private-pg (it stops and starts that cluster)")
    rows = []
    for s in [x for x in a.systems if x in ("fencepost", REF, "pgqueuer")]:
        import redis as sync_redis
        done = sync_redis.Redis.from_url(a.done_url)
        done.delete(DONE_KEY)  # the last case's records: the watcher counts this case's only
        mark: dict[str, float] = {}

        def watch(done: Any = done, mark: dict[str, float] = mark) -> None:
            t0 = None
            while True:
                n = int(done.hlen(DONE_KEY))
                if n > 0 and t0 is None:
                    t0 = time.time()
                    mark["t0"] = t0
                if n >= a.outage_after:
                    break
                time.sleep(0.02)
            mark["stop_t"], mark["stop_n"] = time.time(), n
            pg_ctl("stop")
            mark["last_t"], last = mark["stop_t"], n  # when the count last grew: the work may run out first
            while time.time() < mark["stop_t"] + a.pg_outage:
                time.sleep(0.05)
                if (n := int(done.hlen(DONE_KEY))) > last:
                    mark["last_t"], last = time.time(), n
            mark["restart_t"], mark["restart_n"] = time.time(), int(done.hlen(DONE_KEY))
            pg_ctl("start")
            mark["back_t"] = time.time()

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        r = case(a, s, "drain", 1)
        w.join(a.pg_outage + 120)
        r["system"], r["outage"] = s, dict(mark)
        if "stop_t" in mark and "restart_n" in mark:
            before = mark["stop_n"] / max(1e-6, mark["stop_t"] - mark["t0"])
            # over the time jobs kept finishing: the outage's length when they did throughout, less when the
            # queue ran dry during it (dividing by the whole outage would make finishing early look slow)
            during = (mark["restart_n"] - mark["stop_n"]) / max(1e-6, mark["last_t"] - mark["stop_t"])
            r["outage"].update(started_during=mark["restart_n"] - mark["stop_n"], rate_before=before,
                               rate_during=during)
            if r.get("history_done_at"):
                r["outage"]["history_complete_after_return_s"] = r["history_done_at"] - mark["back_t"]
        rows.append(r)
        progress(r)
        if "back_t" not in mark:
            pg_ctl("start")
    print(f"\nPostgreSQL stopped {a.pg_outage:g} s once {a.outage_after:,} of {a.jobs:,} jobs had started (1 worker)")
    for r in rows:
        o = r.get("outage", {})
        print(f"  {r['system']:15} started during the outage {o.get('started_during', '?')}, "
              f"rate during/before {fmt(o.get('rate_during'))}/{fmt(o.get('rate_before'))} jobs/s"
              + (f" (the queue ran dry {o['restart_t'] - o['last_t']:.1f} s before the return)"
                 if o.get("restart_n", 0) >= a.jobs and "last_t" in o else "") + ", "
              f"history complete {fmt(o.get('history_complete_after_return_s'), 1)} s after the return, "
              f"processes alive {r.get('procs_alive', '?')}/{r.get('procs', '?')}"
              + (f"  error: {str(r['error'])[:200]}" if "error" in r else ""))


def spike(a: argparse.Namespace) -> None:
    rows = []
    for _ in range(a.repeats):
        for s in a.systems:
            if s == "pgqueuer-b100":
                continue
            r = case(a, s, "spike")
            rows.append(r)
            progress(r)
    print(f"\nspike: {a.spike:,} runs due at one instant T, 2 idle workers; start time after T (s)")
    print(f"{'system':15}{'started':>9}{'first':>9}{'median':>9}{'p99':>9}{'last':>9}{'submitted before T':>20}")
    for r in rows:
        if "error" in r:
            print(f"{r['system']:15} error: {r['error']}")
            continue
        print(f"{r['system']:15}{r['started']:>9}{fmt(r['first_s'], 3):>9}{fmt(r['median_s'], 3):>9}"
              f"{fmt(r['p99_s'], 3):>9}{fmt(r['last_s'], 3):>9}{fmt(r['submitted_s_before_T'], 2):>20}")


def kill(a: argparse.Namespace) -> None:
    rows = []
    for _ in range(a.repeats):
        for s in a.systems:
            if s == "pgqueuer-b100":
                continue
            r = case(a, s, "kill")
            rows.append(r)
            progress(r)
    print(f"\nkill -9: {a.kill_jobs:,} jobs of 20 ms, 2 workers, one SIGKILLed when half have run and restarted "
          "at once")
    print(f"{'system':15}{'lost':>7}{'re-runs':>9}{'drained s after restart':>25}")
    for r in rows:
        if "error" in r:
            print(f"{r['system']:15} error: {r['error']}")
            continue
        flag = " (timed out)" if r.get("timed_out") else ""
        print(f"{r['system']:15}{r['lost']:>7}{r['reruns']:>9}{fmt(r['drain_after_restart_s'], 2):>25}{flag}")


def private_pg() -> tuple[subprocess.Popen[bytes], int, str]:
    """A PostgreSQL cluster of our own with default settings (autovacuum on, unlike the shared server
    here; cluster_name only names it in process titles, which the CPU meter reads): initdb in a temp
    dir as the `postgres` user, started on a free port. Returns the server, its
    port and its data directory (bench's pg_ctl calls use it: the outage case stops and starts it)."""
    import pwd
    import tempfile
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = tempfile.mkdtemp(prefix="fencepost-bench-pg-")
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root
        user = pwd.getpwnam("postgres")
        os.chown(data, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*run_as, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = subprocess.Popen([*run_as, "postgres", "-D", data, "-p", str(port), "-c", "listen_addresses=127.0.0.1",
                             "-c", f"unix_socket_directories={data}", "-c", "cluster_name=bench"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", str(port)], capture_output=True).returncode == 0:
            PRIVATE_PG.update(data=data, port=str(port), run_as=" ".join(run_as))
            return proc, port, data
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("private postgres did not start")


PRIVATE_PG: dict[str, str] = {}
"""The private cluster of this run (--private-pg): data dir, port, how to run its tools."""


def pg_ctl(action: str) -> None:
    """Stop (fast) or start the private cluster (the outage case)."""
    run_as = PRIVATE_PG["run_as"].split() if PRIVATE_PG.get("run_as") else []
    args = ["-m", "fast"] if action == "stop" else ["-o", f"-p {PRIVATE_PG['port']} -c listen_addresses=127.0.0.1 "
                                                         f"-c unix_socket_directories={PRIVATE_PG['data']} -c cluster_name=bench"]
    subprocess.run([*run_as, "pg_ctl", "-D", PRIVATE_PG["data"], "-w", action, *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class SnapshotHolder:
    """Another connection holds a REPEATABLE READ snapshot open in the system's database for the whole
    case (a long report, a stuck transaction): vacuum cannot remove any row version dead after it. A
    thread waits until the case has made its database and tables, then takes the snapshot."""

    def __init__(self, admin_url: str, db: str) -> None:
        import threading
        self.url = admin_url.rsplit("/", 1)[0] + "/" + db
        self.stop = threading.Event()
        self.held_at: float | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._hold()), daemon=True)
        self.thread.start()

    async def _hold(self) -> None:
        while not self.stop.is_set():
            try:
                conn = await asyncpg.connect(self.url, timeout=2)
            except Exception:
                await asyncio.sleep(0.1)
                continue
            try:
                if await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") < 2:
                    await asyncio.sleep(0.1)
                    continue
                await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                await conn.fetchval("SELECT count(*) FROM pg_class")  # the snapshot is taken here
                self.held_at = time.time()
                while not self.stop.is_set():
                    await asyncio.sleep(0.2)
                    await conn.fetchval("SELECT 1")  # still in the same transaction and snapshot
                return
            except Exception:  # the case dropped its database (a new case): start again
                await asyncio.sleep(0.1)
            finally:
                try:
                    await conn.close(timeout=2)
                except Exception:
                    pass

    def release(self) -> None:
        self.stop.set()
        self.thread.join(10)


class DoneSampler:
    """(time, jobs done) every 50 ms from the handlers' records (Redis DB 15), for every system alike:
    the drain's rate per window of jobs."""

    def __init__(self, done_url: str) -> None:
        import threading

        import redis as sync_redis
        self.r = sync_redis.Redis.from_url(done_url)
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.samples.append((time.perf_counter(), int(self.r.hlen(DONE_KEY))))
            except Exception:
                pass
            self.stop.wait(0.05)

    def windows(self, window: int, total: int) -> list[dict[str, float]]:
        self.stop.set()
        self.thread.join(5)
        start = next((t for t, n in self.samples if n > 0), None)
        if start is None:
            return []
        out, prev_t, prev_n = [], start, 0
        for edge in range(window, total + 1, window):
            hit = next(((t, n) for t, n in self.samples if n >= edge), None)
            if hit is None:
                break
            out.append({"jobs_to": edge, "per_s": (hit[1] - prev_n) / max(1e-6, hit[0] - prev_t)})
            prev_t, prev_n = hit
        return out


async def storage(admin_url: str, db: str) -> dict[str, Any]:
    """Bytes of every table with its indexes and TOAST (history partitions summed into their parent), and
    live / dead tuples, in one system's database after a case."""
    conn = await asyncpg.connect(admin_url.rsplit("/", 1)[0] + "/" + db)
    try:
        rows = await conn.fetch(
            "SELECT COALESCE(p.relname, c.relname) AS t, sum(pg_total_relation_size(c.oid))::bigint AS bytes, "
            "sum(COALESCE(s.n_live_tup, 0))::bigint AS live, sum(COALESCE(s.n_dead_tup, 0))::bigint AS dead "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public' "
            "LEFT JOIN pg_inherits i ON i.inhrelid = c.oid LEFT JOIN pg_class p ON p.oid = i.inhparent "
            "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.relkind = 'r' GROUP BY 1")
    finally:
        await conn.close()
    return {r["t"]: {"bytes": r["bytes"], "live": r["live"], "dead": r["dead"]} for r in rows}


def private_redis() -> tuple[subprocess.Popen[bytes], int]:
    """A redis-server of our own (no persistence, noeviction) on a free port, so its CPU is ours alone."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--maxmemory-policy", "noeviction"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (0: no drain, single submits only)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=(*SYSTEMS, "arq", REF))
    ap.add_argument("--ref-python", default=None, metavar="PY",
                    help="a second Fencepost build to measure interleaved with this one (its venv's python; "
                    "e.g. the commit before a change: git archive REV | tar -x -C DIR; python3 -m venv V; "
                    "V/bin/pip install DIR uvloop); shown as fencepost-ref, with fp/fp-ref ratios")
    ap.add_argument("--case", default=None, choices=("drain", "single", "open", "spike", "kill"),
                    help=argparse.SUPPRESS)  # one Fencepost case as a JSON line (how --ref-python runs)
    ap.add_argument("--reconcilers", type=int, default=1,
                    help="Fencepost reconcilers beside the workers (2: the replica layout, one beside each of 2 workers)")
    ap.add_argument("--single", type=int, default=2_000, help="sequential single submits per system (0: skip)")
    ap.add_argument("--call-size", type=int, default=None, help="jobs per bulk submit call (default 1,000; --noop 10,000)")
    ap.add_argument("--concurrency", type=int, default=None, help="Fencepost worker --concurrency (default: none given)")
    ap.add_argument("--noop", action="store_true", help="the old table: no-op jobs, Fencepost --concurrency 500, "
                    "calls of 10,000, peers at the README's settings (arq 200, SAQ 100, pgqueuer batch 100)")
    ap.add_argument("--open-loop", type=float, default=None, metavar="R", help="offered rate, jobs/s")
    ap.add_argument("--find-max", action="store_true", help="search the highest R with p99 below --p99-target-ms")
    ap.add_argument("--p99-target-ms", type=float, default=50.0)
    ap.add_argument("--start-rate", type=float, default=1000.0)
    ap.add_argument("--bisect", type=int, default=3)
    ap.add_argument("--duration", type=float, default=60.0, help="open-loop seconds")
    ap.add_argument("--spike", type=int, default=None, metavar="N")
    ap.add_argument("--kill", action="store_true")
    ap.add_argument("--kill-jobs", type=int, default=5_000)
    ap.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))
    ap.add_argument("--done-url", default=os.environ.get("BENCH_DONE_URL", "redis://127.0.0.1:6379/15"))
    ap.add_argument("--admin-url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--peers", action="store_true", help="(peers now run by default; kept for old commands)")
    ap.add_argument("--save", default=None, help="write every case's JSON here (e.g. bench/results/x.json)")
    ap.add_argument("--private-redis", action="store_true",
                    help="start a redis-server of our own for the run (exact Redis CPU; other people's "
                    "commands on the shared server are then not in the figures)")
    ap.add_argument("--private-pg", action="store_true",
                    help="initdb and start a PostgreSQL cluster of our own with default settings (autovacuum "
                    "on), stopped at the end")
    ap.add_argument("--hold-snapshot", action="store_true",
                    help="open loop: another connection holds a REPEATABLE READ snapshot for the whole case")
    ap.add_argument("--window-s", type=float, default=60.0, help="open loop: lag percentiles per window")
    ap.add_argument("--backlog", type=int, default=None, metavar="N", help="N queued, then drained: jobs/s per window")
    ap.add_argument("--window-jobs", type=int, default=50_000)
    ap.add_argument("--pg-outage", type=float, default=None, metavar="S",
                    help="stop the private PostgreSQL for S seconds mid-drain (with --private-pg)")
    ap.add_argument("--outage-after", type=int, default=5_000)
    ap.add_argument("--enqueue-behind", action="store_true",
                    help="Fencepost single submits with Client.enqueue_behind (and the window it opens)")
    a = ap.parse_args()
    with private_servers(a, pg=a.private_pg and not a.case):
        if a.case:  # a --ref-python case: the parent run holds the lock
            run_mode(a)
        else:
            with one_bench_at_a_time():
                run_mode(a)


@contextlib.contextmanager
def private_servers(a: argparse.Namespace, *, pg: bool) -> Iterator[None]:
    """A private PostgreSQL cluster (`pg`) and redis-server (`a.private_redis`) for the run, their URLs put
    into `a` (admin_url, redis_url, done_url), stopped and removed on the way out (SIGTERM included)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the private servers on the way out
    server = cluster = None
    if pg:
        cluster, pg_port, _ = private_pg()
        a.admin_url = f"postgresql://postgres@127.0.0.1:{pg_port}/postgres"
    if a.private_redis:
        server, port = private_redis()
        a.redis_url, a.done_url = f"redis://127.0.0.1:{port}/14", f"redis://127.0.0.1:{port}/15"
    os.environ["BENCH_DONE_URL"] = a.done_url  # the spawned workers' handlers write here
    try:
        yield
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        if cluster is not None:
            try:
                pg_ctl("stop")
            except Exception:
                cluster.terminate()
            shutil.rmtree(PRIVATE_PG.get("data", "/nonexistent"), ignore_errors=True)


def run_mode(a: argparse.Namespace) -> None:
    if a.noop and a.concurrency is None:
        a.concurrency = 500
    if a.case:
        r = case(a, "fencepost", a.case, a.workers[0], a.open_loop or 0.0)
        print(json.dumps(r, default=str), flush=True)
        return
    if a.ref_python and REF not in a.systems:
        a.systems.insert(a.systems.index("fencepost") + 1 if "fencepost" in a.systems else 0, REF)
    if a.backlog:
        backlog(a)
    elif a.pg_outage:
        outage(a)
    elif a.open_loop is not None or a.find_max:
        open_loop(a)
    elif a.spike:
        spike(a)
    elif a.kill:
        kill(a)
    else:
        drain_table(a)


if __name__ == "__main__":
    main()
