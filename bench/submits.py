"""Submit cost: sequential single submits, C concurrent single submitters, bulk calls.

    python bench/submits.py                        # 2,000 sequential, 20,000 by 200 concurrent, 20,000 in calls of 1,000
    python bench/submits.py --concurrent 200 --jobs 40000 --repeats 3
    python bench/submits.py --modes bulk --repeats 5 --ref-python /tmp/vb/bin/python --pgqueuer
    python bench/submits.py --phases --repeats 3 --ref-python /tmp/vb/bin/python   # a bulk call, step by step
    python bench/submits.py --modes single behind --pgqueuer --repeats 5   # Client.enqueue_behind against the default
    python bench/submits.py --modes bulk bulk-behind --pgqueuer --repeats 5

`--ref-python` runs every case a second time with another Fencepost build (its venv's python; the
harness is this file), interleaved, as `fencepost-ref`; `--pgqueuer` runs pgqueuer's own calls the
same way (bulk: `Queries.enqueue` with lists of 1,000, one UNNEST insert; single: one `enqueue` after
another; no concurrent case: pgqueuer has no coalescing) from the peers' venv (`--peer-python`,
default .venv-bench/bin/python), on its own database with pgqueuer's schema.

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
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg

try:
    import uvloop
except ImportError:  # the default loop
    uvloop = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.measure import CpuMeter, cpu_seconds, median, parent_pid, pg_aux_pids, pg_backend_pids

if TYPE_CHECKING:
    from fencepost.client import Client

DB = "bench_submits"
PGQ_DB = "bench_submits_pgq"
ROLES = ("client", "pg", "redis", "pg_shared")


async def fresh(admin_url: str, redis_url: str) -> tuple[Client, asyncpg.Connection]:
    # imported here: the pgqueuer case runs this file in the peers' venv, which has no Fencepost
    from bench.app import registry
    from fencepost.client import Client
    from fencepost.core.config import Settings
    from fencepost.core.record import upgrade

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
    from fencepost.core.models import Submit

    client, conn = await fresh(a.admin_url, a.redis_url)
    try:
        postmaster = parent_pid(await conn.fetchval("SELECT pg_backend_pid()")) or 0
        mine = [await conn.fetchval("SELECT pg_backend_pid()")]
        redis_pid = int((await client.stores.redis.info("server"))["process_id"])
        meter = CpuMeter({"client": lambda: [os.getpid()], "pg": pg_backend_pids(postmaster, DB, exclude=mine),
                          "redis": lambda: [redis_pid], "pg_shared": pg_aux_pids(postmaster)},
                         shared=("redis", "pg_shared"))
        n: int = a.single if mode in ("single", "behind") else a.jobs
        client.enqueue_behind = mode in ("behind", "bulk-behind")

        async def go() -> int:
            if mode in ("single", "behind"):
                for _ in range(n):
                    await client.submit("bench.tiny")
                await client._coalescer.drain()  # behind: timed until the last run is in Redis too
                return n
            if mode == "concurrent":
                per = n // a.concurrent

                async def submitter() -> None:
                    for _ in range(per):
                        await client.submit("bench.tiny")

                await asyncio.gather(*(submitter() for _ in range(a.concurrent)))
                return per * int(a.concurrent)
            for i in range(0, n, a.call_size):
                await client.submit_many([Submit(handler="bench.tiny")] * min(a.call_size, n - i))
            await client._coalescer.drain()
            return n

        row = await metered(meter, mode, go)
        got = await conn.fetchval("SELECT count(*) FROM runs") - 1
        if got != row["jobs"]:
            raise SystemExit(f"{mode}: PostgreSQL holds {got} runs, expected {row['jobs']}")
        if mode == "behind":  # the window: from a submit's return until Redis holds its run, 200 more submits
            window: list[float] = []
            due = client.stores.keys("bench").due  # bench.tiny's queue (bench/app.py)
            for _ in range(200):
                run_id = await client.submit("bench.tiny")
                t = time.perf_counter()
                while await client.stores.redis.zscore(due, str(run_id)) is None:
                    await asyncio.sleep(0)
                window.append((time.perf_counter() - t) * 1000)
            window.sort()
            row["window_ms"] = {"p50": window[100], "p99": window[197], "max": window[-1]}
    finally:
        await conn.close()
        await client.close()
    return row


async def metered(meter: CpuMeter, mode: str, go: Callable[[], Awaitable[int]]) -> dict[str, Any]:
    """One case's row: `go` (it returns how many it submitted) timed, with CPU per job and role from
    `meter` (its idle rates measured first, for a second)."""
    await asyncio.to_thread(meter.baseline, 1.0)
    meter.start()
    t0 = time.perf_counter()
    n = await go()
    s = time.perf_counter() - t0
    cpu = await asyncio.to_thread(meter.stop)
    us = {r: cpu.get(r, 0.0) / n * 1e6 for r in ROLES}
    us["total"] = sum(us.values())
    return {"mode": mode, "jobs": n, "per_s": n / s, "cpu_us": us}


async def phases(a: argparse.Namespace) -> dict[str, Any]:
    """Where one bulk call's time goes: `--calls` calls of --call-size runs, each split into its three
    steps (validate and build the rows; the PostgreSQL statement and commit; the enqueue_runs call),
    with this process's, the bench database's backends' and the Redis server's CPU per step (private
    client methods: this is a profile, not a product path). Milliseconds per call, means."""
    from fencepost.core.models import Submit

    client, conn = await fresh(a.admin_url, a.redis_url)
    try:
        postmaster = parent_pid(await conn.fetchval("SELECT pg_backend_pid()")) or 0
        mine = [await conn.fetchval("SELECT pg_backend_pid()")]
        pg = pg_backend_pids(postmaster, DB, exclude=mine)
        redis_pid = int((await client.stores.redis.info("server"))["process_id"])
        reqs = [Submit(handler="bench.tiny")] * a.call_size
        await client.submit_many(reqs)  # warm

        def sample() -> tuple[float, float, float, float]:
            return (time.perf_counter(), time.process_time(), sum(cpu_seconds(p) or 0.0 for p in pg()),
                    cpu_seconds(redis_pid) or 0.0)

        steps: dict[str, list[tuple[float, ...]]] = {"rows": [], "postgresql": [], "redis": []}
        for _ in range(a.calls):
            t0 = sample()
            rows = await client._prepare(reqs, outbox=False)
            t1 = sample()
            ids, created, new_queues = await client._insert(reqs, rows, None)
            await client._stamp_new_queues(new_queues)
            t2 = sample()
            await client._enqueue(created, ids, rows)
            t3 = sample()
            for name, (x, y) in zip(steps, ((t0, t1), (t1, t2), (t2, t3)), strict=True):
                steps[name].append(tuple((v - u) * 1000 for u, v in zip(x, y, strict=True)))
    finally:
        await conn.close()
        await client.close()
    # means, not medians: /proc counts CPU in 10 ms ticks, so one call's PostgreSQL or Redis CPU is 0, 10 or 20
    return {name: [sum(r[i] for r in rs) / len(rs) for i in range(4)] for name, rs in steps.items()}


async def pgq_case(a: argparse.Namespace, mode: str) -> dict[str, Any]:
    """pgqueuer's own submit calls, metered the same way (no Redis: its column stays 0)."""
    from pgqueuer.queries import Queries

    admin = await asyncpg.connect(a.admin_url)
    await admin.execute(f'DROP DATABASE IF EXISTS "{PGQ_DB}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{PGQ_DB}"')
    await admin.close()
    conn = await asyncpg.connect(a.admin_url.rsplit("/", 1)[0] + "/" + PGQ_DB)
    try:
        queries = Queries.from_asyncpg_connection(conn)
        await queries.install()
        await queries.enqueue("tiny", None)  # warm the statement
        postmaster = parent_pid(await conn.fetchval("SELECT pg_backend_pid()")) or 0
        meter = CpuMeter({"client": lambda: [os.getpid()], "pg": pg_backend_pids(postmaster, PGQ_DB),
                          "pg_shared": pg_aux_pids(postmaster)}, shared=("pg_shared",))
        n: int = a.single if mode == "single" else a.jobs

        async def go() -> int:
            if mode == "single":
                for _ in range(n):
                    await queries.enqueue("tiny", None)
            else:
                for i in range(0, n, a.call_size):
                    k = min(a.call_size, n - i)
                    await queries.enqueue(["tiny"] * k, [None] * k, [0] * k)
            return n

        row = await metered(meter, mode, go)
        got = await conn.fetchval("SELECT count(*) FROM pgqueuer") - 1
        if got != n:
            raise SystemExit(f"pgqueuer {mode}: {got} jobs, expected {n}")
    finally:
        await conn.close()
    return row


def other(python: str, a: argparse.Namespace, mode: str, peer: bool) -> dict[str, Any]:
    """One case in another interpreter (this file, `--one MODE`): its JSON line."""
    argv = [python, __file__, "--one", mode, "--single", str(a.single), "--jobs", str(a.jobs),
            "--concurrent", str(a.concurrent), "--call-size", str(a.call_size), "--redis-url", a.redis_url,
            "--admin-url", a.admin_url] + (["--peer-case"] if peer else [])
    out = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def run_loop(coro: Any) -> Any:
    return (uvloop.run if uvloop is not None else asyncio.run)(coro)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--single", type=int, default=2_000)
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs for the concurrent and bulk cases")
    ap.add_argument("--concurrent", type=int, default=200, help="concurrent single submitters")
    ap.add_argument("--call-size", type=int, default=1_000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--modes", nargs="+", default=["single", "concurrent", "bulk"],
                    choices=("single", "behind", "concurrent", "bulk", "bulk-behind"))
    ap.add_argument("--ref-python", metavar="PY", help="a second Fencepost build's python, run interleaved")
    ap.add_argument("--pgqueuer", action="store_true", help="pgqueuer's submits too, interleaved")
    ap.add_argument("--peer-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    ap.add_argument("--phases", action="store_true",
                    help="instead: where a bulk call's time goes, step by step (CPU of client, PostgreSQL, Redis)")
    ap.add_argument("--calls", type=int, default=20, help="bulk calls measured by --phases")
    ap.add_argument("--one", choices=("single", "behind", "concurrent", "bulk", "bulk-behind"), help=argparse.SUPPRESS)
    ap.add_argument("--peer-case", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--phases-json", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    ap.add_argument("--admin-url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    a = ap.parse_args()
    if a.one:  # a case for another interpreter's caller: one JSON line
        print(json.dumps(run_loop((pgq_case if a.peer_case else case)(a, a.one))))
        return
    if a.phases:
        builds = [("fencepost", None)] + ([("fencepost-ref", a.ref_python)] if a.ref_python else [])
        out: dict[str, list[dict[str, list[float]]]] = {b: [] for b, _ in builds}
        for _ in range(a.repeats):
            for build, python in builds:
                if python is None:
                    out[build].append(run_loop(phases(a)))
                else:
                    argv = [python, __file__, "--phases-json", "--calls", str(a.calls), "--call-size",
                            str(a.call_size), "--redis-url", a.redis_url, "--admin-url", a.admin_url]
                    done = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=ROOT)
                    out[build].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"\nms per call of {a.call_size:,} (means of {a.calls} calls, then medians of {a.repeats} repeats)")
        print(f"{'':16}{'step':>12}{'wall':>9}{'client':>9}{'PG CPU':>9}{'Redis':>9}")
        for build, rs in out.items():
            for step in ("rows", "postgresql", "redis"):
                cells = [median([r[step][i] for r in rs]) for i in range(4)]
                print(f"{build:16}{step:>12}" + "".join(f"{c:>9.1f}" for c in cells))
        return
    if a.phases_json:
        print(json.dumps(run_loop(phases(a))))
        return
    systems = ["fencepost"] + (["fencepost-ref"] if a.ref_python else []) + (["pgqueuer"] if a.pgqueuer else [])
    results: list[dict[str, Any]] = []
    for _ in range(a.repeats):
        for mode in a.modes:
            for system in systems:
                if system == "pgqueuer" and mode in ("concurrent", "behind", "bulk-behind"):
                    continue
                if system == "fencepost":
                    r = run_loop(case(a, mode))
                else:
                    r = other(a.ref_python if system == "fencepost-ref" else a.peer_python, a, mode,
                              peer=system == "pgqueuer")
                r["system"] = system
                results.append(r)
                print(f"  {system:14}" + " ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}"
                                                  for k, v in r.items() if k not in ("cpu_us", "system", "window_ms"))
                      + "  cpu_us " + " ".join(f"{k}={v:.0f}" for k, v in r["cpu_us"].items()),
                      file=sys.stderr, flush=True)
    labels = {"single": f"single, {a.single:,} sequential", "behind": "single, Client.enqueue_behind",
              "concurrent": f"{a.concurrent} concurrent submitters",
              "bulk": f"bulk, calls of {a.call_size:,}", "bulk-behind": "bulk, Client.enqueue_behind"}
    print(f"\nmedians of {a.repeats}, interleaved; CPU-us per job from /proc")
    print(f"{'':32}{'system':>15}{'jobs/s':>10}" + "".join(f"{r:>11}" for r in (*ROLES, "total")))
    med: dict[tuple[str, str], dict[str, float]] = {}
    for mode in a.modes:
        for system in systems:
            rs = [r for r in results if r["mode"] == mode and r["system"] == system]
            if not rs:
                continue
            m = {k: median([r["cpu_us"][k] for r in rs]) for k in (*ROLES, "total")}
            m["per_s"] = median([r["per_s"] for r in rs])
            med[mode, system] = m
            print(f"{labels[mode]:32}{system:>15}{m['per_s']:>10,.0f}"
                  + "".join(f"{m[k]:>11.0f}" for k in (*ROLES, "total")))
            for r in rs:
                if "window_ms" in r:
                    print(f"{'':32}{'':>15}  window (return -> in Redis) ms: " + "  ".join(
                        f"{k} {v:.2f}" for k, v in r["window_ms"].items()))
    if ("single", "fencepost") in med and ("behind", "fencepost") in med:
        on, off = med["behind", "fencepost"], med["single", "fencepost"]
        print(f"enqueue_behind / default, sequential single submits: jobs/s x{on['per_s'] / off['per_s']:.2f}, "
              f"CPU per job x{on['total'] / off['total']:.2f}")
        if ("single", "pgqueuer") in med:
            print(f"enqueue_behind / pgqueuer single: jobs/s x{on['per_s'] / med['single', 'pgqueuer']['per_s']:.2f}")
    if ("bulk", "fencepost") in med and ("bulk-behind", "fencepost") in med:
        on, off = med["bulk-behind", "fencepost"], med["bulk", "fencepost"]
        print(f"enqueue_behind / default, bulk calls: jobs/s x{on['per_s'] / off['per_s']:.2f}, "
              f"CPU per job x{on['total'] / off['total']:.2f}")
        if ("bulk", "pgqueuer") in med:
            print(f"enqueue_behind / pgqueuer bulk: jobs/s x{on['per_s'] / med['bulk', 'pgqueuer']['per_s']:.2f}")
    for peer in systems[1:]:
        for mode in a.modes:
            if (mode, peer) in med:
                fp, other_ = med[mode, "fencepost"], med[mode, peer]
                print(f"fencepost / {peer}, {labels[mode]}: jobs/s x{fp['per_s'] / other_['per_s']:.2f}, "
                      f"CPU per job x{fp['total'] / other_['total']:.2f} (client x{fp['client'] / other_['client']:.2f}, "
                      f"PostgreSQL x{fp['pg'] / max(other_['pg'], 1e-9):.2f})")


if __name__ == "__main__":
    main()
