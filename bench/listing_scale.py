"""Listing routes at scale (issue 24 item 12): 1,000,000 pending runs, then the median and max time of
every listing route the dashboard uses (and the first call's), and of `fencepost reconcile --check --fast`
(--full-check: the full one too). Beside the pending runs: 5,000 dead-lettered, 3,000 retrying and 3,000
scheduled runs, 100,000 finished runs of five handlers with their attempts over the last day, and 2,000
batches of 20 of them, for the operations views (/v1/ops/..., /v1/batches); 20,000 audit rows (a tenth
payments') and 4,000 operator commands on runs (--commands: those on bench runs), for the audit view's
first and deep pages of a queue.

    .venv/bin/python bench/listing_scale.py [--runs 1000000] [--repeat 30] [--keep]

The dataset lives in a private database (fp_bench_listing_<pid>, dropped at the end unless --keep) and
a private Redis key prefix: generate_series INSERTs (runs and their `submitted` events, a few thousand
dead-lettered and operator-commanded runs beside the pending ones) and the queue's due set in Redis
(ZADD in chunks), so building 1,000,000 runs takes about a minute on two cores. The API runs in this
process (ASGI, no sockets): what is timed is the route, PostgreSQL and Redis, not HTTP parsing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("FENCEPOST_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
REDIS = os.environ.get("FENCEPOST_BENCH_REDIS", "redis://127.0.0.1:6379/0")
QUEUES = ("bench", "payments", "emails")


async def build(dsn: str, prefix: str, runs: int, commands: int = 2000) -> None:
    from fencepost.core.config import Settings
    from fencepost.core.record import upgrade
    from fencepost.core.stores import Stores

    conn = await asyncpg.connect(dsn)
    try:
        await upgrade(conn)
        started = time.perf_counter()
        await conn.execute("INSERT INTO queues (name) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING", list(QUEUES))
        await conn.execute("INSERT INTO job_definitions (name, queue) VALUES ('bench.work', 'bench') ON CONFLICT DO NOTHING")
        # pending runs: args ["<8 digits>"] (msgpack [[str8], {}]), created over the last 50 minutes
        # the run row is the submitted record (021: submitted_by, no 'submitted' event row)
        await conn.execute(f"""
            INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, created_at, run_at,
                              submitted_by)
            SELECT i, 'bench.work', 'bench', 'PENDING',
                   '\\x9291a8'::bytea || convert_to(lpad(i::text, 8, '0'), 'UTF8') || '\\x80'::bytea, 3, 300,
                   now() - make_interval(secs => ({runs} - i) * 3000.0 / {runs}),
                   now() - make_interval(secs => ({runs} - i) * 3000.0 / {runs}), 'token:1@127.0.0.1'
            FROM generate_series(1, {runs}) i""")
        # dead letter and review in the other queues, some operator commands for the audit view; history rows
        # carry their queue as written since 047 (a database built before has them without: 047 fills them)
        base = runs + 1
        await conn.execute(f"""
            INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, attempt, finished_at,
                              reason, last_error_class, last_error)
            SELECT {base} + i, 'bench.work', CASE WHEN i % 2 = 0 THEN 'payments' ELSE 'emails' END, 'FAILED',
                   '\\x929180'::bytea, 3, 300, 1, now() - make_interval(secs => i),
                   CASE WHEN i % 10 = 0 THEN 'review' ELSE 'max_retries' END, 'ValueError', 'boom'
            FROM generate_series(1, 5000) i""")
        await conn.execute(f"""
            INSERT INTO events (run_id, queue, type, from_status, to_status, version, actor, reason, at)
            SELECT {base} + i, CASE WHEN i % 2 = 0 THEN 'payments' ELSE 'emails' END, 'retried', 'FAILED', 'PENDING',
                   1, 'token:1@127.0.0.1', 'bench', now() - make_interval(secs => i)
            FROM generate_series(1, 2000) i""")
        # the audit view at depth (issue 24): 20,000 audit rows over the last 50 minutes, a tenth of them
        # payments' (the rest bench's), and COMMANDS operator commands on bench runs among them (2,000: as
        # many as the retries above), so a page of payments' entries deep in the log has other queues' rows
        # on both sides of the merge
        await conn.execute("""
            INSERT INTO audit_log (actor, action, queue, at)
            SELECT 'token:2@127.0.0.1', 'queue_paused', CASE WHEN i % 10 = 0 THEN 'payments' ELSE 'bench' END,
                   now() - make_interval(secs => i * 0.15)
            FROM generate_series(1, 20000) i""")
        await conn.execute(f"""
            INSERT INTO events (run_id, queue, type, actor, reason, at)
            SELECT i * {max(1, runs // commands)}, 'bench', 'paused', 'token:2@127.0.0.1', 'bench',
                   now() - make_interval(secs => i * 3000.0 / {commands} + 0.07)
            FROM generate_series(1, {commands}) i""")
        # the operations views' data (issue 24): retries waiting and scheduled runs (their lists page
        # through the partial index of waiting runs, which the 1,000,000 due PENDING runs also fill),
        # 100,000 finished runs of five handlers with their attempts over the last day (per-handler
        # charts), and 2,000 batches of 20 of them (the batches view)
        w = base + 6000
        await conn.execute(f"""
            INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, attempt, run_at,
                              last_error_class, last_error)
            SELECT {w} + i, 'bench.work', CASE WHEN i % 2 = 0 THEN 'payments' ELSE 'emails' END, 'RETRY_WAIT',
                   '\\x929180'::bytea, 3, 300, 1, now() + make_interval(secs => i), 'ValueError', 'boom'
            FROM generate_series(1, 3000) i""")
        await conn.execute(f"""
            INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, run_at)
            SELECT {w} + 3000 + i, 'bench.work', CASE WHEN i % 3 = 0 THEN 'payments' ELSE 'bench' END, 'PENDING',
                   '\\x929180'::bytea, 3, 300, now() + make_interval(secs => 60 + i)
            FROM generate_series(1, 3000) i""")
        done = w + 6000
        await conn.execute(f"""
            INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, attempt, created_at,
                              run_at, started_at, finished_at)
            SELECT {done} + i, 'bench.h' || (i % 5), CASE WHEN i % 4 = 0 THEN 'payments' ELSE 'bench' END,
                   'SUCCEEDED', '\\x929180'::bytea, 3, 300, 1, t, t, t, t + make_interval(secs => (i % 50) / 10.0)
            FROM (SELECT i, now() - make_interval(secs => i * 86400.0 / 100000) AS t
                  FROM generate_series(1, 100000) i) x""")
        await conn.execute(f"""
            INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome, queue)
            SELECT id, 1, id, 'bench-worker', started_at, finished_at,
                   CASE WHEN id % 20 = 0 THEN 'error' ELSE 'succeeded' END, queue
            FROM runs WHERE id > {done}""")
        await conn.execute("""
            INSERT INTO batches (id, name, created_at, settled_at)
            SELECT md5(i::text)::uuid, 'batch ' || i, now() - make_interval(secs => i * 40), now() - make_interval(secs => i * 40)
            FROM generate_series(1, 2000) i""")
        await conn.execute(f"""
            INSERT INTO batch_members (run_id, batch_id)
            SELECT {done} + i, md5(((i - 1) / 20 + 1)::text)::uuid FROM generate_series(1, 40000) i""")
        await conn.execute(f"SELECT setval(pg_get_serial_sequence('runs', 'id'), {done + 100000 + 1})")
        await conn.execute("VACUUM ANALYZE attempts")  # as autovacuum would: summarizes its BRIN ranges
        await conn.execute("ANALYZE")
        print(f"postgresql: {runs:,} pending + 5,000 dead runs in {time.perf_counter() - started:.1f} s", flush=True)
    finally:
        await conn.close()
    stores = Stores(Settings(redis_url=REDIS, database_url=dsn, prefix=prefix))
    await stores.connect()
    try:
        started = time.perf_counter()
        k = stores.keys("bench")
        r = stores.redis
        chunk = 20_000
        now_ms = int(time.time() * 1000)
        for lo in range(1, runs + 1, chunk):
            hi = min(runs, lo + chunk - 1)
            await r.zadd(k.due, {str(i): float(i) for i in range(lo, hi + 1)})
        await r.zadd(k.tenants, {"": 0})  # the default tenant is registered: its due set is claimed from
        for lo in range(1, runs + 1, chunk):  # the run hashes a submit writes (the fields drift compares)
            pipe = r.pipeline(transaction=False)
            for i in range(lo, min(runs, lo + chunk - 1) + 1):
                pipe.hset(k.run(i), mapping={"state": "PENDING", "version": 0, "handler": "bench.work", "priority": 0,
                                             "attempt": 0, "run_at": now_ms - (runs - i) * 3, "max_retries": 3,
                                             "timeout_ms": 300_000, "payload": b"\x9291a800000000\x80", "gen": 0})
            await pipe.execute()
        print(f"redis: {runs:,} due runs and their hashes in {time.perf_counter() - started:.1f} s", flush=True)
    finally:
        await stores.close()


async def _upgrade(dsn: str) -> None:
    from fencepost.core.record import upgrade

    conn = await asyncpg.connect(dsn)
    try:
        for name in await upgrade(conn):
            print(f"applied {name}", flush=True)
    finally:
        await conn.close()


ROUTES = [
    ("GET", "/v1/queues", "admin"),
    ("GET", "/v1/runs", "admin"),
    ("GET", "/v1/runs?queue=bench&status=PENDING", "admin"),
    ("GET", "/v1/runs?sort=created_at", "admin"),
    ("GET", "/v1/runs?sort=created_at&order=asc", "admin"),
    ("GET", "/v1/runs?arg=00999999", "admin"),
    ("GET", "/v1/runs?queue=payments", "scoped"),
    ("GET", "/v1/runs?queue=payments&sort=status", "admin"),
    ("GET", "/v1/runs?queue=payments&status=FAILED&sort=attempt", "admin"),  # a top-N sort of 2,500 matches
    ("GET", "/v1/runs?sort=attempt", "admin"),  # 1,000,000 matches: refused (422 naming sort)
    ("GET", "/v1/runs?sort=status", "scoped"),  # its queues: runs_queue_status range by range
    ("GET", "/v1/dead-letter", "admin"),
    ("GET", "/v1/dead-letter", "scoped"),
    ("GET", "/v1/review", "admin"),
    ("GET", "/v1/events", "admin"),
    ("GET", "/v1/events", "scoped"),
    ("GET", "/v1/events?queue=payments", "admin"),
    ("GET", "/v1/audit", "admin"),
    ("GET", "/v1/stats", "admin"),
    ("GET", "/v1/workers", "admin"),
    ("GET", "/v1/schedules", "admin"),
    ("GET", "/v1/runs/1", "admin"),
    ("GET", "/v1/runs/1/events", "admin"),
    # the dashboard's operations routes (scheduler/api/routes_ops.py)
    ("GET", "/v1/ops/queues", "admin"),
    ("GET", "/v1/ops/queues", "scoped"),
    ("GET", "/v1/ops/lists/dead", "admin"),
    ("GET", "/v1/ops/lists/dead", "scoped"),
    ("GET", "/v1/ops/lists/review", "admin"),
    ("GET", "/v1/ops/lists/retries", "admin"),
    ("GET", "/v1/ops/lists/retries?queue=emails", "admin"),
    ("GET", "/v1/ops/lists/scheduled", "admin"),
    ("GET", "/v1/ops/lists/scheduled", "scoped"),
    ("GET", "/v1/ops/handlers?window=1h", "admin"),
    ("GET", "/v1/ops/handlers?window=24h", "admin"),
    ("GET", "/v1/ops/handlers?window=7d", "admin"),
    ("GET", "/v1/ops/handlers?window=24h&handler=bench.h1", "admin"),
    ("GET", "/v1/ops/handlers?window=24h", "scoped"),
    ("GET", "/v1/batches", "admin"),
    ("GET", "/v1/batches", "scoped"),
    ("GET", "/v1/states", "admin"),
    ("GET", "/v1/runs/1/timeline", "admin"),
]


async def measure(dsn: str, prefix: str, repeat: int, extra: list[str]) -> None:
    from fencepost.api import ApiConfig, create_app
    from fencepost.api.auth import create_token
    from fencepost.core.config import Settings

    settings = Settings(redis_url=REDIS, database_url=dsn, prefix=prefix)
    app = create_app(settings, ApiConfig(rate_limit=0, token_cache_s=60))
    async with app.router.lifespan_context(app):
        db = app.state.api.client.stores.db
        _, admin = await create_token(db, "admin", [], "bench", "bench")
        _, scoped = await create_token(db, "operator", ["payments"], "bench-op", "bench")
        tokens = {"admin": admin, "scoped": scoped}
        deep = await _deep_audit(db)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            print(f"{'route':58} {'as':7} {'status':>6} {'median ms':>10} {'max ms':>8} {'first ms':>9}")
            for method, path, who in ROUTES + deep + [("GET", p, "admin") for p in extra]:
                times, status, first = [], 0, 0.0
                for i in range(repeat + 2):
                    t0 = time.perf_counter()
                    resp = await http.request(method, path, headers={"Authorization": f"Bearer {tokens[who]}"})
                    dt = (time.perf_counter() - t0) * 1000
                    status = resp.status_code
                    if i == 0:  # the first call also pays for what is done once (a rollup of closed buckets)
                        first = dt
                    if i >= 2:  # two warm-up calls (connections, plans, the token cache)
                        times.append(dt)
                print(f"{path:58} {who:7} {status:>6} {statistics.median(times):>10.1f} {max(times):>8.1f} "
                      f"{first:>9.1f}", flush=True)


async def _deep_audit(db: Any) -> list[tuple[str, str, str]]:
    """The audit view's queue-filtered and scoped pages from the middle of the log (what page 100 of 100
    would send: a cursor from audit row 10,000 of 20,000), beside its first page of one queue."""
    from fencepost.core import cursors

    row = await db.pool.fetchrow("SELECT at, id FROM audit_log WHERE id = 10000")
    if row is None:  # a database built before the audit rows were
        return []
    cur = cursors.encode("audit", [row["at"], row["id"], "config"])
    return [("GET", "/v1/audit?queue=payments", "admin"), ("GET", f"/v1/audit?queue=payments&cursor={cur}", "admin"),
            ("GET", f"/v1/audit?queue=emails&cursor={cur}", "admin"), ("GET", f"/v1/audit?cursor={cur}", "scoped"),
            ("GET", f"/v1/audit?cursor={cur}", "admin")]


def reconcile_check(dsn: str, prefix: str, *flags: str) -> None:
    env = {**os.environ, "FENCEPOST_DATABASE_URL": dsn, "FENCEPOST_REDIS_URL": REDIS, "FENCEPOST_PREFIX": prefix}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "fencepost.cli", "reconcile", "--check", *flags], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1800)
    dt = time.perf_counter() - t0
    tail = (out.stdout + out.stderr).strip().splitlines()[-2:]
    print(f"fencepost reconcile --check {' '.join(flags)}: exit {out.returncode} in {dt:.1f} s  | " + " / ".join(tail),
          flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--commands", type=int, default=2000,
                    help="operator commands on bench runs over the 50 minutes, beside 2,000 retries (audit view)")
    ap.add_argument("--keep", action="store_true", help="keep the database and keys (prints their names)")
    ap.add_argument("--reuse", help="measure an existing database built with --keep (name), skip building")
    ap.add_argument("--prefix", help="with --reuse: its Redis prefix")
    ap.add_argument("--no-check", action="store_true", help="skip `fencepost reconcile --check --fast`")
    ap.add_argument("--full-check", action="store_true", help="also time the full `fencepost reconcile --check`")
    ap.add_argument("--route", action="append", default=[], help="another GET path to time (as admin)")
    args = ap.parse_args()
    name = args.reuse or f"fp_bench_listing_{os.getpid()}"
    prefix = args.prefix or f"fpbl{os.getpid()}"
    dsn = f"{PG}/{name}"
    admin = await asyncpg.connect(f"{PG}/postgres")
    try:
        if not args.reuse:
            await admin.execute(f'CREATE DATABASE "{name}"')
            await build(dsn, prefix, args.runs, args.commands)
        else:  # the code measured may have migrations newer than the database (an index added since)
            await _upgrade(dsn)
        await measure(dsn, prefix, args.repeat, args.route)
        if not args.no_check:
            reconcile_check(dsn, prefix, "--fast")
            if args.full_check:
                reconcile_check(dsn, prefix)
    finally:
        if args.keep or args.reuse:
            print(f"kept: --reuse {name} --prefix {prefix}")
        else:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            r = aioredis.Redis.from_url(REDIS)
            keys = [k async for k in r.scan_iter(match=f"{prefix}:*", count=1000)]
            for i in range(0, len(keys), 500):
                await r.delete(*keys[i:i + 500])
            await r.aclose()
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
