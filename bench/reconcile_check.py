"""`fencepost reconcile --check` at scale (issue 24 item 12): N pending runs (default 1,000,000) in
PostgreSQL and Redis, one injected drift of every kind the check reports, then the check timed (the
wall time of the command, as an operator runs it) and its findings compared with what was injected.

    .venv/bin/python bench/reconcile_check.py [--runs 1000000] [--repeat 3] [--keep]
    .venv/bin/python bench/reconcile_check.py --ref-python /tmp/vb/bin/python   # interleaved with another build

The dataset lives in a private database (fp_bench_rc_<pid>, dropped at the end unless --keep) on the
PostgreSQL of FENCEPOST_BENCH_PG and in a private redis-server started on a free loopback port (stopped
by its pid at the end). Rows are INSERTed with generate_series (bench/listing_scale.py's builder) and
the run hashes and the due set are written by a Lua loop in chunks of 50,000, with the fields
enqueue_runs.lua writes: building 1,000,000 runs takes about two minutes on two cores.
`--ref-python` runs the same command with another interpreter where another build of Fencepost is
installed (bench/README.md: `git archive REV | tar -x -C /tmp/before`, a venv, `pip install
--no-deps /tmp/before`), alternating with this checkout's, on the same dataset.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG = os.environ.get("FENCEPOST_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
Q = "bench"

_BUILD = """
local base, lo, hi, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for i = lo, hi do
  redis.call('HSET', base .. 'run:' .. i, 'state', 'PENDING', 'run_at', now - (hi - i), 'priority', 0,
             'handler', 'bench.work', 'payload', ARGV[5], 'max_retries', 3, 'timeout_ms', 300000,
             'attempt', 0, 'version', 0, 'gen', 0, 'qpos', i)
  redis.call('ZADD', base .. 'due', i, i)
end
return hi - lo + 1
"""


async def build(dsn: str, redis_url: str, prefix: str, runs: int) -> dict[str, int]:
    """The dataset, with one run of each drift kind; returns kind -> run id."""
    from fencepost.core.config import Settings
    from fencepost.core.hot import StampArgs
    from fencepost.core.record import upgrade
    from fencepost.core.stores import Stores

    conn = await asyncpg.connect(dsn)
    try:
        await upgrade(conn)
        t0 = time.perf_counter()
        await conn.execute("INSERT INTO queues (name) VALUES ($1) ON CONFLICT DO NOTHING", Q)
        await conn.execute("INSERT INTO job_definitions (name, queue) VALUES ('bench.work', $1) "
                           "ON CONFLICT DO NOTHING", Q)
        # settled rows (updated an hour ago): the check's grace period leaves none of them out
        await conn.execute(f"""
            INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, created_at, run_at,
                              updated_at, submitted_by)
            SELECT i, 'bench.work', '{Q}', 'PENDING', '\\x929180'::bytea, 3, 300,
                   now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour', 'bench'
            FROM generate_series(1, {runs}) i""")
        await conn.execute(f"SELECT setval(pg_get_serial_sequence('runs', 'id'), {runs + 10})")
        await conn.execute("ANALYZE runs")
        epoch = await conn.fetchval("SELECT epoch FROM queues WHERE name = $1", Q)
        print(f"postgresql: {runs:,} pending runs in {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        await conn.close()
    stores = await Stores(Settings(redis_url=redis_url, database_url=dsn, prefix=prefix)).connect()
    try:
        t0 = time.perf_counter()
        k, r = stores.keys(Q), stores.redis
        now = int(time.time() * 1000)
        build_sha = await r.script_load(_BUILD)
        for lo in range(1, runs + 1, 50_000):
            await r.evalsha(build_sha, 1, k.due, k.base, lo, min(runs, lo + 49_999), now, b"\x92\x91\x80")
        await r.zadd(k.tenants, {"": 0})  # the default tenant is registered: its due set is claimed from
        await stores.scripts.stamp_queue(k, StampArgs(int(epoch), 1))
        print(f"redis: {runs:,} run hashes and due members in {time.perf_counter() - t0:.1f} s", flush=True)
        return await inject(stores, dsn, runs)
    finally:
        await stores.close()


def _injected(runs: int) -> dict[str, int]:
    """Drift kind -> the run it is injected in (corrupt twice: a garbage state, a hash without its handler)."""
    step = runs // 12
    ids = {kind: step * (i + 1) for i, kind in enumerate(
        ("missing", "unqueued", "corrupt", "corrupt_handler", "terminal_in_pg", "stale_hash", "lost_lease",
         "unrecorded"))}
    return {**ids, "orphan_hash": runs + 5, "orphan_member": runs + 6}


async def inject(stores, dsn: str, runs: int) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """One run of every drift kind, spread over the id range (tests/test_drift.py's inject, by hand)."""
    k, r = stores.keys(Q), stores.redis
    ids = _injected(runs)
    conn = await asyncpg.connect(dsn)
    try:
        await r.delete(k.run(ids["missing"]))
        await r.zrem(k.due, ids["missing"])
        await r.zrem(k.due, ids["unqueued"])
        await r.hset(k.run(ids["corrupt"]), "state", "GARBAGE")
        await r.hdel(k.run(ids["corrupt_handler"]), "handler")
        old = "updated_at = now() - interval '1 hour'"
        await conn.execute(f"UPDATE runs SET status = 'CANCELLED', finished_at = now(), version = version + 1, {old} "
                           "WHERE id = $1", ids["terminal_in_pg"])
        await conn.execute(f"UPDATE runs SET version = version + 3, {old} WHERE id = $1", ids["stale_hash"])
        # leased in PostgreSQL (attempt 1), no hash in Redis
        for kind in ("lost_lease", "unrecorded"):
            await conn.execute(f"UPDATE runs SET status = 'RUNNING', attempt = 1, version = 1, token = 1, "
                               f"lease_owner = 'w', lease_expires_at = now() + interval '1 hour', started_at = now(), "
                               f"{old} WHERE id = $1", ids[kind])
            await conn.execute("INSERT INTO attempts (run_id, attempt, token, worker_id, started_at) "
                               "VALUES ($1, 1, 1, 'w', now())", ids[kind])
            await r.zrem(k.due, ids[kind])
        await r.delete(k.run(ids["lost_lease"]))
        # finished in Redis (v2), the stream entry gone: PostgreSQL still has it RUNNING (v1)
        await r.hset(k.run(ids["unrecorded"]), mapping={"state": "SUCCEEDED", "version": 2, "attempt": 1,
                                                         "token": 1, "reason": ""})
        await r.hset(k.run(ids["orphan_hash"]), mapping={"state": "PENDING", "version": 0, "handler": "bench.work",
                                                         "payload": b"\x90", "priority": 0, "run_at": 0})
        await r.zadd(k.due, {str(ids["orphan_hash"]): 1})
        await r.zadd(k.due, {str(ids["orphan_member"]): 2})
    finally:
        await conn.close()
    return ids


def check(python: str, dsn: str, redis_url: str, prefix: str, *flags: str) -> tuple[float, float, float, int, str]:
    """One `fencepost reconcile --check` as a subprocess: wall time, its CPU time, the redis-server's CPU
    time meanwhile, exit code, output."""
    env = {**os.environ, "FENCEPOST_DATABASE_URL": dsn, "FENCEPOST_REDIS_URL": redis_url, "FENCEPOST_PREFIX": prefix}
    env.pop("PYTHONPATH", None)
    r = redis.Redis.from_url(redis_url)

    def redis_cpu() -> float:
        info = r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    c0, r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), redis_cpu(), time.perf_counter()
    out = subprocess.run([python, "-m", "fencepost.cli", "reconcile", "--check", *flags], cwd="/", env=env,
                         capture_output=True, text=True, timeout=3600)
    dt, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    rcpu = redis_cpu() - r0
    r.close()
    cpu = c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime
    return dt, cpu, rcpu, out.returncode, out.stdout + out.stderr


def found(out: str) -> set[tuple[str, int]]:
    rows = set()
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[2].isdigit():
            rows.add((parts[1], int(parts[2])))
    return rows


async def main() -> None:
    from tests.servers import RedisServer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="timed checks per build")
    ap.add_argument("--ref-python", help="also time the check with this interpreter's Fencepost, alternating")
    ap.add_argument("--flags", default="", help="more flags for the reference build's check (e.g. --fast)")
    ap.add_argument("--keep", action="store_true", help="keep the database and the redis-server (prints them)")
    ap.add_argument("--reuse", action="store_true", help="time a dataset kept with --keep (FENCEPOST_DATABASE_URL, "
                    "FENCEPOST_REDIS_URL, FENCEPOST_PREFIX and the same --runs): build nothing, drop nothing")
    a = ap.parse_args()
    if a.reuse:
        dsn, redis_url, prefix = (os.environ[f"FENCEPOST_{v}"] for v in ("DATABASE_URL", "REDIS_URL", "PREFIX"))
        injected = _injected(a.runs)
        await measure(a, dsn, redis_url, prefix, injected)
        return
    name, prefix = f"fp_bench_rc_{os.getpid()}", f"fprc{os.getpid()}"
    dsn = f"{PG}/{name}"
    server = await RedisServer().start()
    redis_url = server.url
    admin = await asyncpg.connect(f"{PG}/postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        injected = await build(dsn, redis_url, prefix, a.runs)
        await measure(a, dsn, redis_url, prefix, injected)
    finally:
        if a.keep:
            print(f"kept: FENCEPOST_DATABASE_URL={dsn} FENCEPOST_REDIS_URL={redis_url} FENCEPOST_PREFIX={prefix} "
                  f"(redis-server pid {server.pid}; stop it by its pid)")
        else:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            server.cleanup()
        await admin.close()


async def measure(a: argparse.Namespace, dsn: str, redis_url: str, prefix: str, injected: dict[str, int]) -> None:
    want = {(kind if kind != "corrupt_handler" else "corrupt", rid) for kind, rid in injected.items()}
    builds = [("this checkout", sys.executable, ())]
    if a.ref_python:
        builds.append(("reference", a.ref_python, tuple(a.flags.split())))
    times: dict[str, list[float]] = {label: [] for label, _, _ in builds}
    for _ in range(a.repeat):
        for label, python, flags in builds:
            dt, cpu, rcpu, rc, out = check(python, dsn, redis_url, prefix, *flags)
            got = found(out)
            verdict = "all injected drift reported" if got == want else \
                f"MISSED {sorted(want - got)} EXTRA {sorted(got - want)[:5]}"
            times[label].append(dt)
            print(f"{label}: fencepost reconcile --check {' '.join(flags)} at {a.runs:,} runs: {dt:.1f} s "
                  f"(CPU: the command {cpu:.1f} s, redis-server {rcpu:.1f} s; load {os.getloadavg()[0]:.1f}), "
                  f"exit {rc}, {verdict}", flush=True)
    for label, ts in times.items():
        if ts:
            print(f"{label}: median {statistics.median(ts):.1f} s over {len(ts)} "
                  f"({', '.join(f'{t:.1f}' for t in ts)})")


if __name__ == "__main__":
    asyncio.run(main())
