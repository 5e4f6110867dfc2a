"""What one lone statement costs the client (issue 23 item 3): a lone submit's insert and SELECT 1, through
asyncpg's pool (acquire and release around each), on a held connection, and through the gateway
(`Database.fetch`, which runs lone statements on its lane). Client CPU (this process) and wall per
statement, medians of --rounds interleaved; a fresh database `bench_lone` on the local PostgreSQL.

    python bench/lone_statement.py --rounds 3 --n 1500
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg

from fencepost.core.record import Database, query, upgrade
from fencepost.core.submit import _fresh_columns

DB = "bench_lone"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    a = ap.parse_args()
    admin = await asyncpg.connect(a.admin_url)
    await admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{DB}"')
    url = a.admin_url.rsplit("/", 1)[0] + "/" + DB
    conn = await asyncpg.connect(url)
    await upgrade(conn)
    db = await Database(url, max_size=4).connect()
    pool = db.pool
    assert pool is not None
    await db.execute("declare_queues", ["bench"])
    from datetime import UTC, datetime

    from fencepost.core.models import RunRow
    row = RunRow(queue="bench", handler="bench.tiny", payload=b"\x92\x90\x80", priority=0,
                 run_at=datetime.now(UTC), max_retries=3, timeout_s=30.0, status="PENDING")
    cols = _fresh_columns([row])
    sql = query("insert_runs_fresh")
    n = a.n

    async def pooled_insert() -> None:
        for _ in range(n):
            await pool.fetch(sql, *cols, "bench")

    async def held_insert() -> None:
        async with pool.acquire() as c:
            for _ in range(n):
                await c.fetch(sql, *cols, "bench")

    async def gateway_insert() -> None:
        for _ in range(n):
            await db.fetch("insert_runs_fresh", *cols, "bench")

    async def pooled_select() -> None:
        for _ in range(n):
            await pool.fetchval("SELECT 1")

    async def held_select() -> None:
        async with pool.acquire() as c:
            for _ in range(n):
                await c.fetchval("SELECT 1")

    async def gateway_select() -> None:
        for _ in range(n):
            await db.fetchval("db_now")

    cases: dict[str, Any] = {"insert_runs_fresh, pool": pooled_insert, "insert_runs_fresh, held": held_insert,
                             "insert_runs_fresh, gateway": gateway_insert, "SELECT 1, pool": pooled_select,
                             "SELECT 1, held": held_select, "db_now, gateway": gateway_select}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for _ in range(a.rounds):
        for k, go in cases.items():
            c0, w0 = time.process_time(), time.perf_counter()
            await go()
            got[k].append(((time.process_time() - c0) / n * 1e6, (time.perf_counter() - w0) / n * 1e6))
    await db.close()
    await conn.close()
    await admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    await admin.close()
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"client CPU and wall per lone statement, medians of {a.rounds} rounds of {n:,} (load {load})")
    for k, v in got.items():
        print(f"  {k:28} {statistics.median(x[0] for x in v):7.1f} us CPU {statistics.median(x[1] for x in v):8.1f} us wall")


if __name__ == "__main__":
    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
