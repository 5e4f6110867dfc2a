"""Scale-out: throughput with 1, 2 and 4 worker processes on one Redis and on a local 3-master
Redis Cluster (+1 replica each), printed side by side.

    python bench/scale.py                      # 20000 no-op jobs per run
    python bench/scale.py --jobs 40000 --workers 1 2 4

Method: bench/throughput.py's, unchanged except that the jobs are spread over three queues
whose hash slots belong to the three different cluster primaries (on the single Redis all
three live on one server), and every worker serves all three. Submit N no-op jobs with the
bulk API (submit/s); start W worker processes and the reconciler on paused queues; the clock
starts at unpause; drain/s = N / (time until every queue is empty). The recorder persists
every transition to PostgreSQL during the drain (history lag = time after the drain until
PostgreSQL holds every run as SUCCEEDED). The cluster is started on loopback ports for the
run and stopped by pid afterwards; the single Redis is the machine's (--redis-url).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis.crc import key_slot

from bench.app import registry
from bench.throughput import drain_and_record, fresh_database
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit


def spread_queues(n: int = 3) -> list[str]:
    """n queue names whose hash slots fall in n different thirds of the slot space (the ranges
    `redis-cli --cluster create` gives n primaries): one queue per primary."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < n:
        name = f"bench{i}"
        found.setdefault(key_slot(name.encode()) * n // 16384, name)
        i += 1
    return [found[k] for k in sorted(found)]


def spawn(settings: Settings, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, FENCEPOST_REDIS_URL=settings.redis_url, FENCEPOST_DATABASE_URL=settings.database_url,
               FENCEPOST_PREFIX=settings.prefix, FENCEPOST_LOG_FORMAT="json", PYTHONPATH=str(ROOT),
               FENCEPOST_REDIS_CLUSTER="1" if settings.redis_cluster else "0")
    return subprocess.Popen([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def run_once(jobs: int, workers: int, redis_url: str, cluster: bool, admin_url: str,
                   concurrency: int) -> dict:
    queues = spread_queues()
    db_url = await fresh_database(admin_url, "fencepost_bench_scale")
    settings = Settings(redis_url=redis_url, redis_cluster=cluster, database_url=db_url,
                        prefix=f"scale{os.getpid()}")
    client = await Client(settings=settings).connect()
    redis = client.stores.redis
    keys = [client.stores.keys(q) for q in queues]
    await redis.flushdb()  # (the cluster client sends it to every primary)
    await client.register(registry)
    for k in keys:
        await redis.set(k.paused, 1)  # workers start idle; the clock starts at unpause
    t0 = time.perf_counter()
    batch = 10_000
    per_queue = [jobs // len(queues) + (1 if i < jobs % len(queues) else 0) for i in range(len(queues))]
    for q, n in zip(queues, per_queue):
        for i in range(0, n, batch):
            await client.submit_many([Submit(handler="bench.noop", queue=q)] * min(batch, n - i))
    submit_s = time.perf_counter() - t0

    procs = [spawn(settings, "reconciler")]
    qargs = [a for q in queues for a in ("--queue", q)]
    procs += [spawn(settings, "worker", "--app", "bench.app:registry", *qargs, "--concurrency", str(concurrency))
              for _ in range(workers)]
    try:
        drain_s, lag_s = await drain_and_record(client, keys, workers)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        await client.close()
    return {"redis": "cluster" if cluster else "single", "jobs": jobs, "workers": workers,
            "submit_per_s": round(jobs / submit_s), "drain_per_s": round(jobs / drain_s),
            "history_lag_s": round(lag_s, 2)}


async def main_async(a: argparse.Namespace) -> list[dict]:
    from tests.servers import RedisClusterServers

    results = []
    for w in a.workers:
        results.append(await run_once(a.jobs, w, a.redis_url, False, a.admin_url, a.concurrency))
    cluster = await RedisClusterServers(masters=3, replicas=1).start()
    try:
        for w in a.workers:
            results.append(await run_once(a.jobs, w, cluster.url, True, a.admin_url, a.concurrency))
    finally:
        cluster.cleanup()  # every node stopped by its pid
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--concurrency", type=int, default=500)
    ap.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))
    ap.add_argument("--admin-url", default=os.environ.get("BENCH_DATABASE_URL",
                                                          "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results = asyncio.run(main_async(a))
    if a.json:
        print(json.dumps(results))
        return
    by = {(r["redis"], r["workers"]): r for r in results}
    print(f"{os.cpu_count()} cores; {a.jobs} no-op jobs over 3 queues ({', '.join(spread_queues())}); "
          f"every transition persisted to PostgreSQL")
    print(f"{'workers':>7} | {'single Redis':^32} | {'3-master cluster':^32}")
    print(f"{'':>7} | {'submit/s':>9} {'drain/s':>9} {'hist lag s':>11} | {'submit/s':>9} {'drain/s':>9} "
          f"{'hist lag s':>11}")
    for w in a.workers:
        row = f"{w:>7} |"
        for mode in ("single", "cluster"):
            r = by[(mode, w)]
            row += f" {r['submit_per_s']:>9} {r['drain_per_s']:>9} {r['history_lag_s']:>11} |"
        print(row.rstrip("|"))


if __name__ == "__main__":
    main()
