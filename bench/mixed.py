"""Workload (d) of issue 23: long jobs running while tiny jobs keep arriving.

    python bench/mixed.py --private-pg --private-redis                       # 2,000 x 60 s beside 3,000/s
    python bench/mixed.py --private-pg --private-redis --rate 1000 --duration 40 --long 2000 --long-s 60

Each system gets two workers. First `--long` jobs of `--long-s` seconds are submitted and the harness
waits until every one of them has started (each records its start in `bench:long`); then one producer
offers tiny jobs (the realistic tiny job of bench/throughput.py) at `--rate` per second for `--duration`
seconds, in 10 ms ticks, while the long jobs still hold their slots (`--long-s` must exceed the loop's
duration). Printed per system: the tiny jobs' submit->start lag (p50, p99, max) from each job's intended
submit time, the CPU per tiny job of every process, and the WAL PostgreSQL wrote per second over the
loop (`pg_current_wal_lsn()` before and after, on the private cluster: only this system writes there).

What it shows: a PostgreSQL-only queue keeps every running job's liveness in its table (pgqueuer
updates a heartbeat column of each picked row), so thousands of long jobs write WAL and dead rows all
the time and compete with the tiny jobs' dequeues; Fencepost's leases live in Redis (one
`renew_leases` call per worker per beat), and PostgreSQL sees only the transitions.

Settings: Fencepost workers with `--concurrency long/2 + 100` each (the default is 100 slots; the long
jobs need 1,000 each, and 100 stay for the tiny ones), one reconciler; pgqueuer `QueueManager.run()`
defaults (batch 10, no limit on concurrent tasks, which already runs every long job at once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.app import LONG_KEY
from bench.measure import one_bench_at_a_time
from bench.throughput import Fencepost, fmt, lag_summary, per_job_cpu, private_servers, produce, run_peer
from fencepost.client import Submit

try:
    import uvloop
except ImportError:  # pragma: no cover
    uvloop = None  # type: ignore[assignment]


async def fp_mixed(a: argparse.Namespace) -> dict[str, Any]:
    async with Fencepost(a) as fp:
        await fp.done.delete(LONG_KEY)
        fp.start(2, "--concurrency", str(a.long // 2 + 100))
        await fp.settle()
        for i in range(0, a.long, 1000):
            await fp.client.submit_many([Submit(handler="bench.long", kwargs={"seconds": a.long_s})]
                                        * min(1000, a.long - i))
        long_started = await fp.wait_done(a.long, key=LONG_KEY, timeout=120)
        lsn0 = await fp.poll.fetchval("SELECT pg_current_wal_lsn()")
        meter = fp.meter()
        await asyncio.to_thread(meter.baseline, 1.0)
        t0 = time.perf_counter()
        meter.start()

        async def submit(n: int) -> list[int]:
            return await fp.client.submit_many([Submit(handler="bench.tiny")] * n)

        intended, took = await produce(a.rate, a.duration, submit)
        got = await fp.wait_done(len(intended), timeout=60)
        cpu = meter.stop()
        wal = await fp.poll.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)", lsn0)
        wall = time.perf_counter() - t0
        starts = await fp.starts()
    return {"system": "fencepost", "rate": a.rate, "achieved": len(intended) / took, "done": got,
            "long": a.long, "long_started": long_started, "long_s": a.long_s, **lag_summary(intended, starts),
            "wal_bytes_per_s": float(wal) / wall, "cpu_us": per_job_cpu(cpu, max(1, len(intended))),
            "busy_cores": cpu["machine"] / cpu["wall"]}


def one(a: argparse.Namespace, system: str) -> dict[str, Any]:
    if system == "fencepost":
        return (uvloop.run if uvloop is not None else asyncio.run)(fp_mixed(a))
    return run_peer(a, system, "mixed", "--rate", str(a.rate), "--duration", str(a.duration), "--workers", "2",
                    "--long", str(a.long), "--long-s", str(a.long_s))


def report(rows: list[dict[str, Any]], a: argparse.Namespace) -> None:
    print(f"\nmixed: {a.long:,} jobs of {a.long_s:g} s running, tiny jobs offered at {a.rate:,.0f}/s for "
          f"{a.duration:g} s, 2 workers; lag from each tiny job's intended submit time to its start")
    print(f"{'system':<12} {'long up':>8} {'achieved':>9} {'p50 ms':>8} {'p99 ms':>9} {'max ms':>9} {'missing':>8} "
          f"{'WAL KB/s':>9} {'CPU us/tiny':>12}")
    for r in rows:
        if "error" in r:
            print(f"{r['system']:<12} error: {r['error']}")
            continue
        print(f"{r['system']:<12} {fmt(r.get('long_started')):>8} {fmt(r.get('achieved')):>9} "
              f"{fmt(r.get('p50_ms'), 1):>8} {fmt(r.get('p99_ms'), 1):>9} {fmt(r.get('max_ms'), 1):>9} "
              f"{fmt(r.get('missing')):>8} {fmt(r.get('wal_bytes_per_s', 0) / 1024, 1):>9} "
              f"{fmt((r.get('cpu_us') or {}).get('total'), 1):>12}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", nargs="+", default=["fencepost", "pgqueuer"], choices=("fencepost", "pgqueuer"))
    ap.add_argument("--long", type=int, default=2000)
    ap.add_argument("--long-s", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=3000.0)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))
    ap.add_argument("--done-url", default=os.environ.get("BENCH_DONE_URL", "redis://127.0.0.1:6379/15"))
    ap.add_argument("--admin-url", default=os.environ.get("BENCH_DATABASE_URL",
                                                          "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--private-redis", action="store_true")
    ap.add_argument("--private-pg", action="store_true")
    ap.add_argument("--save", default=None)
    a = ap.parse_args()
    if a.long_s <= a.duration + 10:
        ap.error("--long-s must exceed --duration by more than 10 s: the long jobs hold their slots all along")
    rows: list[dict[str, Any]] = []
    with private_servers(a, pg=a.private_pg), one_bench_at_a_time():
        for _ in range(a.repeats):
            for system in a.systems:
                r = one(a, system)
                r["system"] = system
                print("  " + json.dumps(r, default=str), flush=True)
                rows.append(r)
    report(rows, a)
    if a.save:
        Path(a.save).write_text(json.dumps(rows, default=str, indent=1))


if __name__ == "__main__":
    main()
