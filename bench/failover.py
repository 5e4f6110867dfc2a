"""Failover: 100,000 pending runs, then Redis loses everything (FLUSHDB of a private
redis-server). Prints the time until workers claim again, the time until the hot state is
fully rebuilt from PostgreSQL, and how many runs were executed more than once (must be 0
for the runs that were already terminal before the loss).

    python bench/failover.py                     # 100,000 pending + 10,000 already done
    python bench/failover.py --pending 20000     # smaller

Method: a private redis-server on a free loopback port (stopped by pid at the end), a fresh
PostgreSQL database, one reconciler process and one worker process (concurrency 200).
Phase 1: `--done` runs are executed and recorded. Phase 2: the queue is paused in Redis and
`--pending` runs are submitted (durable in PostgreSQL, queued in Redis). Then FLUSHDB: the
clock starts. "claim again" = the first claim on the rebuilt dataset (the queue's token
counter reappears); "fully rebuilt" = the reconciler's queue_rebuilt log line. Every
execution is counted by the handler in another Redis database (db 1), which the flush
does not touch; at the end every run must be SUCCEEDED in PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.throughput import fresh_database
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit
from fencepost.core.registry import Registry

QUEUE = "failover"
registry = Registry()
_execs: aioredis.Redis | None = None


@registry.job("bench.counted", queue=QUEUE, max_retries=3)
async def counted(ctx) -> None:
    """Counts its executions per run in Redis db 1 (untouched by the FLUSHDB of db 0)."""
    global _execs
    if _execs is None:
        _execs = aioredis.Redis.from_url(os.environ["FP_BENCH_EXEC_URL"])
    await _execs.hincrby("execs", str(ctx.run_id), 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(settings: Settings, log: Path, exec_url: str, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, FENCEPOST_REDIS_URL=settings.redis_url, FENCEPOST_DATABASE_URL=settings.database_url,
               FENCEPOST_PREFIX=settings.prefix, FENCEPOST_LOG_FORMAT="json", PYTHONPATH=str(ROOT),
               FP_BENCH_EXEC_URL=exec_url)
    out = open(log, "ab")
    return subprocess.Popen([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env=env, stdout=out, stderr=out)


async def _until(pred, timeout: float, what: str, interval: float = 0.005) -> float:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(interval)
    return time.monotonic()


def _rebuild_line(log: Path) -> dict | None:
    if not log.exists():
        return None
    for line in log.read_text(errors="replace").splitlines():
        if '"queue_rebuilt"' in line and f'"queue": "{QUEUE}"' in line:
            return json.loads(line)
    return None


async def run(pending: int, done: int, admin_url: str, concurrency: int) -> dict:
    port = _free_port()
    rdir = tempfile.mkdtemp(prefix="fp-bench-redis-")
    server = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                               "--appendonly", "no", "--dir", rdir, "--maxmemory-policy", "noeviction"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    logdir = Path(tempfile.mkdtemp(prefix="fp-bench-logs-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        redis_url, exec_url = f"redis://127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/1"
        db_url = await fresh_database(admin_url, "fencepost_bench_failover")
        settings = Settings(redis_url=redis_url, database_url=db_url, prefix="fpb")
        r = aioredis.Redis.from_url(redis_url)
        await _until(lambda: r.ping(), 10, "redis-server to start", 0.02)
        execs = aioredis.Redis.from_url(exec_url)
        client = await Client(settings=settings).connect()
        await client.register(registry)
        keys = client.stores.keys(QUEUE)
        pool = client.stores.db.pool
        assert pool is not None

        # Phase 1: runs executed and recorded before the loss.
        done_ids: list[int] = []
        for i in range(0, done, 10_000):
            done_ids += await client.submit_many([Submit(handler="bench.counted")] * min(10_000, done - i))
        procs.append(_spawn(settings, logdir / "reconciler.log", exec_url, "reconciler"))
        procs.append(_spawn(settings, logdir / "worker.log", exec_url, "worker", "--app", "bench.failover:registry",
                            "--queue", QUEUE, "--concurrency", str(concurrency), "--processes", "1"))

        async def phase1_recorded() -> bool:
            return await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'SUCCEEDED'") >= done

        await _until(phase1_recorded, 300, "phase 1 to be executed and recorded", 0.1)

        # Phase 2: pending runs, durable in PostgreSQL and queued in Redis (queue paused in Redis only).
        await r.set(keys.paused, 1)
        t = time.perf_counter()
        for i in range(0, pending, 10_000):
            await client.submit_many([Submit(handler="bench.counted")] * min(10_000, pending - i))
        submit_s = time.perf_counter() - t
        assert await r.zcard(keys.due) == pending

        # The loss.
        t0 = time.monotonic()
        await r.flushdb()
        t_claim = await _until(lambda: r.exists(keys.token), 120, "the first claim after the loss")
        t_rebuilt = await _until(lambda: asyncio.sleep(0, _rebuild_line(logdir / "reconciler.log") is not None),
                                 300, "the rebuild to finish", 0.01)
        line = _rebuild_line(logdir / "reconciler.log") or {}

        async def all_succeeded() -> bool:
            return await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'SUCCEEDED'") == done + pending

        t_all = await _until(all_succeeded, 900, "every run to succeed", 0.2)
        counts = {int(k): int(v) for k, v in (await execs.hgetall("execs")).items()}
        done_set = set(done_ids)
        twice = [rid for rid, n in counts.items() if n > 1]
        twice_done = [rid for rid in twice if rid in done_set]
        never = done + pending - len(counts)
        claims_after = await pool.fetchval(
            """SELECT count(*) FROM events c JOIN (SELECT run_id, min(recorded_at) AS t FROM events
               WHERE to_status = 'SUCCEEDED' GROUP BY run_id) s ON s.run_id = c.run_id
               WHERE c.type = 'claimed' AND c.at > s.t""")
        await client.close()
        await r.aclose()
        await execs.aclose()
        return {"pending": pending, "done_before": done, "submit_per_s": round(pending / submit_s),
                "claim_again_s": round(t_claim - t0, 3), "rebuilt_s": round(t_rebuilt - t0, 3),
                "rebuild_log": line.get("msg", ""), "all_succeeded_s": round(t_all - t0, 1),
                "executed_more_than_once": len(twice), "executed_more_than_once_of_done": len(twice_done),
                "never_executed": never, "claimed_after_recorded_success": claims_after}
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        server.kill()  # by pid
        server.wait(10)
        shutil.rmtree(rdir, ignore_errors=True)
        shutil.rmtree(logdir, ignore_errors=True)
        admin = await asyncpg.connect(admin_url)
        await admin.execute('DROP DATABASE IF EXISTS "fencepost_bench_failover" WITH (FORCE)')
        await admin.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pending", type=int, default=100_000)
    ap.add_argument("--done", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--admin-url", default=os.environ.get("BENCH_DATABASE_URL",
                                                          "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = asyncio.run(run(a.pending, a.done, a.admin_url, a.concurrency))
    if a.json:
        print(json.dumps(res))
        return
    print(f"{os.cpu_count()} cores; {res['pending']} pending runs + {res['done_before']} already done; Redis FLUSHDB")
    print(f"  workers claim again after      {res['claim_again_s']:>7.3f} s")
    print(f"  hot state fully rebuilt after  {res['rebuilt_s']:>7.3f} s   ({res['rebuild_log']})")
    print(f"  every run succeeded after      {res['all_succeeded_s']:>7.1f} s")
    print(f"  runs executed more than once   {res['executed_more_than_once']:>7}   "
          f"(of the runs already done before the loss: {res['executed_more_than_once_of_done']})")
    print(f"  runs never executed            {res['never_executed']:>7}")
    print(f"  claims after a recorded success {res['claimed_after_recorded_success']:>6}")


if __name__ == "__main__":
    main()
