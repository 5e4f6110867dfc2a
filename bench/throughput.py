"""Throughput: bulk submit, then drain N no-op jobs with 1 and 2 worker processes while the
recorder persists every transition to PostgreSQL; compared with peers run the same way.

    python bench/throughput.py --jobs 20000 --workers 1 2            # Fencepost only
    python bench/throughput.py --jobs 20000 --workers 1 2 --peers    # + arq, SAQ, pgqueuer

Method (the same for every system): submit N jobs with the fastest bulk API (submit/s);
start W worker processes; drain/s = N / (time from the start signal to the last job
finished). Fencepost workers start on a paused queue and the clock starts at unpause,
so process start-up is not counted; peers are started and timed by bench/peers/run_peer.py.
Fencepost's history lag = time from the last job finished until PostgreSQL holds every
transition (the recorder runs during the drain, on the same two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fencepost.client import Client  # noqa: E402
from fencepost.core.config import Settings  # noqa: E402
from fencepost.core.record import upgrade  # noqa: E402
from fencepost.core.models import Submit  # noqa: E402

from bench.app import registry  # noqa: E402

QUEUE = "bench"


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


def spawn(settings: Settings, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, FENCEPOST_REDIS_URL=settings.redis_url, FENCEPOST_DATABASE_URL=settings.database_url,
               FENCEPOST_PREFIX=settings.prefix, FENCEPOST_LOG_FORMAT="json", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def drain_and_record(client: Client, queue_keys: list, workers: int) -> tuple[float, float]:
    """Unpause the queues the (already started) workers wait on; return (seconds until Redis
    holds no due, delayed or active run, then seconds until PostgreSQL has every run SUCCEEDED)."""
    redis = client.stores.redis
    await asyncio.sleep(3)  # let the processes import and connect (not timed)
    t1 = time.perf_counter()
    for k in queue_keys:
        await redis.delete(k.paused)
        await redis.rpush(k.wake, *([1] * workers))
    while True:
        pipe = redis.pipeline(transaction=False)
        for k in queue_keys:
            pipe.zcard(k.due)
            pipe.zcard(k.active)
            pipe.zcard(k.delayed)
        if sum(await pipe.execute()) == 0:
            break
        await asyncio.sleep(0.005)
    drain_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    pool = client.stores.db.pool
    assert pool is not None
    while await pool.fetchval("SELECT count(*) FROM runs WHERE status <> 'SUCCEEDED'") > 0:
        await asyncio.sleep(0.02)
    return drain_s, time.perf_counter() - t2


async def run_fencepost(jobs: int, workers: int, redis_url: str, admin_url: str, concurrency: int) -> dict:
    db_url = await fresh_database(admin_url, "fencepost_bench")
    settings = Settings(redis_url=redis_url, database_url=db_url, prefix=f"bench{os.getpid()}")
    client = await Client(settings=settings).connect()
    redis = client.stores.redis
    keys = client.stores.keys(QUEUE)
    await redis.flushdb()
    await client.register(registry)
    await redis.set(keys.paused, 1)  # workers start idle; the clock starts at unpause
    t0 = time.perf_counter()
    batch = 10_000
    for i in range(0, jobs, batch):
        await client.submit_many([Submit(handler="bench.noop")] * min(batch, jobs - i))
    submit_s = time.perf_counter() - t0

    procs = [spawn(settings, "reconciler")]
    procs += [spawn(settings, "worker", "--app", "bench.app:registry", "--queue", QUEUE,
                    "--concurrency", str(concurrency)) for _ in range(workers)]
    try:
        drain_s, lag_s = await drain_and_record(client, [keys], workers)
        pool = client.stores.db.pool
        events = await pool.fetchval("SELECT count(*) FROM events")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        await client.close()
    return {"system": "fencepost", "jobs": jobs, "workers": workers, "submit_per_s": round(jobs / submit_s),
            "drain_per_s": round(jobs / drain_s), "history_lag_s": round(lag_s, 2), "events": events}


def run_peer(peer: str, jobs: int, workers: int, redis_url: str, admin_url: str) -> dict:
    py = ROOT / ".venv-bench" / "bin" / "python"
    if not py.exists():
        return {"system": peer, "error": "peers not installed: python3 -m venv .venv-bench && "
                                         ".venv-bench/bin/pip install -r bench/peers/requirements.txt"}
    out = subprocess.run([str(py), str(ROOT / "bench" / "peers" / "run_peer.py"), "--peer", peer, "--jobs", str(jobs),
                          "--workers", str(workers), "--redis-url", redis_url, "--database-url",
                          admin_url.rsplit("/", 1)[0] + "/bench_peers"],
                         capture_output=True, text=True, timeout=900)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            data["system"] = data.pop("peer", peer)
            return data
    return {"system": peer, "error": (out.stderr or out.stdout)[-300:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--concurrency", type=int, default=500)
    ap.add_argument("--peers", action="store_true", help="also run arq, saq and pgqueuer")
    ap.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))
    ap.add_argument("--admin-url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results = []
    for w in a.workers:
        results.append(asyncio.run(run_fencepost(a.jobs, w, a.redis_url, a.admin_url, a.concurrency)))
        if a.peers:
            for peer in ("arq", "saq", "pgqueuer"):
                results.append(run_peer(peer, a.jobs, w, a.redis_url, a.admin_url))
    if a.json:
        print(json.dumps(results))
        return
    print(f"{os.cpu_count()} cores; {a.jobs} no-op jobs; every Fencepost transition persisted to PostgreSQL")
    print(f"{'system':10} {'workers':>7} {'submit/s':>9} {'drain/s':>8} {'hist lag s':>10}")
    for r in results:
        if "error" in r:
            print(f"{r['system']:10} error: {r['error']}")
            continue
        print(f"{r['system']:10} {r['workers']:>7} {r['submit_per_s']:>9} {r['drain_per_s']:>8} "
              f"{r.get('history_lag_s', ''):>10}")
    fp = {r["workers"]: r for r in results if r["system"] == "fencepost"}
    for r in results:
        if r["system"] != "fencepost" and "error" not in r and r["workers"] in fp:
            f = fp[r["workers"]]
            print(f"fencepost / {r['system']} ({r['workers']} worker): submit x{f['submit_per_s'] / r['submit_per_s']:.2f}, "
                  f"drain x{f['drain_per_s'] / r['drain_per_s']:.2f}")


if __name__ == "__main__":
    main()
