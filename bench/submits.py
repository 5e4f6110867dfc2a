"""Submit cost: sequential single submits, C concurrent single submitters, bulk calls.

    python bench/submits.py                        # 2,000 sequential, 20,000 by 200 concurrent, 20,000 in calls of 1,000
    python bench/submits.py --concurrent 200 --jobs 40000 --repeats 3

One client process (this one) submits to a fresh database `bench_submits` and Redis DB 13, no
workers running. Prints jobs/s and CPU-us per job from the kernel (/proc/<pid>/stat): this
client process, the PostgreSQL backends of the bench database, the Redis server (its idle rate
subtracted) and PostgreSQL's shared helpers (WAL writer...). Concurrent submitters are
`asyncio.gather` of C tasks, each awaiting one `client.submit()` after another, as a web app's
request handlers would: the client coalesces them (group commit). Repeats are interleaved; the
loop is uvloop when installed, as for the peers in bench/throughput.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

try:
    import uvloop
except ImportError:  # the default loop
    uvloop = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.app import registry
from bench.measure import CpuMeter, median, parent_pid, pg_aux_pids, pg_backend_pids
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit
from fencepost.core.record import upgrade

DB = "bench_submits"
ROLES = ("client", "pg", "redis", "pg_shared")


async def fresh(admin_url: str, redis_url: str) -> tuple[Client, asyncpg.Connection]:
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{DB}"')
    await admin.close()
    url = admin_url.rsplit("/", 1)[0] + "/" + DB
    conn = await asyncpg.connect(url)
    await upgrade(conn)
    client = await Client(settings=Settings(redis_url=redis_url, database_url=url, prefix="bsub")).connect()
    await client.stores.redis.flushdb()
    await client.register(registry)
    await client.submit("bench.tiny")  # warm the definitions, the pool and the statement cache
    return client, conn


async def case(a: argparse.Namespace, mode: str) -> dict[str, Any]:
    client, conn = await fresh(a.admin_url, a.redis_url)
    try:
        postmaster = parent_pid(await conn.fetchval("SELECT pg_backend_pid()")) or 0
        mine = [await conn.fetchval("SELECT pg_backend_pid()")]
        redis_pid = int((await client.stores.redis.info("server"))["process_id"])
        meter = CpuMeter({"client": lambda: [os.getpid()], "pg": pg_backend_pids(postmaster, DB, exclude=mine),
                          "redis": lambda: [redis_pid], "pg_shared": pg_aux_pids(postmaster)},
                         shared=("redis", "pg_shared"))
        await asyncio.to_thread(meter.baseline, 1.0)
        n = a.single if mode == "single" else a.jobs
        meter.start()
        t0 = time.perf_counter()
        if mode == "single":
            for _ in range(n):
                await client.submit("bench.tiny")
        elif mode == "concurrent":
            per = n // a.concurrent

            async def submitter() -> None:
                for _ in range(per):
                    await client.submit("bench.tiny")

            await asyncio.gather(*(submitter() for _ in range(a.concurrent)))
            n = per * a.concurrent
        else:
            for i in range(0, n, a.call_size):
                await client.submit_many([Submit(handler="bench.tiny")] * min(a.call_size, n - i))
        s = time.perf_counter() - t0
        cpu = await asyncio.to_thread(meter.stop)
        got = await conn.fetchval("SELECT count(*) FROM runs") - 1
        if got != n:
            raise SystemExit(f"{mode}: PostgreSQL holds {got} runs, expected {n}")
    finally:
        await conn.close()
        await client.close()
    us = {r: cpu.get(r, 0.0) / n * 1e6 for r in ROLES}
    us["total"] = sum(us.values())
    return {"mode": mode, "jobs": n, "per_s": n / s, "cpu_us": us}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--single", type=int, default=2_000)
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs for the concurrent and bulk cases")
    ap.add_argument("--concurrent", type=int, default=200, help="concurrent single submitters")
    ap.add_argument("--call-size", type=int, default=1_000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--modes", nargs="+", default=["single", "concurrent", "bulk"],
                    choices=("single", "concurrent", "bulk"))
    ap.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    ap.add_argument("--admin-url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    a = ap.parse_args()
    results: list[dict[str, Any]] = []
    for _ in range(a.repeats):
        for mode in a.modes:
            r = (uvloop.run if uvloop is not None else asyncio.run)(case(a, mode))
            results.append(r)
            print("  " + " ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
                                  if k != "cpu_us") + "  cpu_us " +
                  " ".join(f"{k}={v:.0f}" for k, v in r["cpu_us"].items()), file=sys.stderr, flush=True)
    labels = {"single": f"single, {a.single:,} sequential", "concurrent": f"{a.concurrent} concurrent submitters",
              "bulk": f"bulk, calls of {a.call_size:,}"}
    print(f"\nmedians of {a.repeats}; CPU-us per job from /proc")
    print(f"{'':32}{'jobs/s':>10}" + "".join(f"{r:>11}" for r in (*ROLES, "total")))
    for mode in a.modes:
        rs = [r for r in results if r["mode"] == mode]
        cells = [median([r["cpu_us"][k] for r in rs]) for k in (*ROLES, "total")]
        print(f"{labels[mode]:32}{median([r['per_s'] for r in rs]):>10,.0f}" + "".join(f"{c:>11.0f}" for c in cells))


if __name__ == "__main__":
    main()
