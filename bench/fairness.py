"""What fair sharing and concurrency keys cost the claim script, on real Redis.

    python bench/fairness.py --runs 100000 --tenants 1 10 1000 --batch 100

For each tenant count T: enqueue --runs runs spread evenly over T tenants (enqueue_runs,
2000 per call), then claim them all in batches of --batch (claim_due), and print runs per
second for both, the claim-side cost relative to T = 1, and the largest deviation of any
tenant's share from its fair share over the first half of the dispatch. A last row runs
T = 1 with every run under one of 100 concurrency keys (limit 1000: never full), the cost
of the per-key lease sets alone. Only Redis and the Lua scripts are measured (no worker,
no PostgreSQL): the dispatch decision itself.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fencepost.core.config import Settings
from fencepost.core.stores import Stores

T0 = 1_700_000_000_000


def _row(rid: int, tenant: str, ckey: str) -> list[object]:
    # enqueue_runs, 18 per run (see its header)
    return [rid, "PENDING", T0, 0, "bench.noop", b"\x90", 3, 60000, 0, 1, "", "", 0, tenant,
            ckey, 1000 if ckey else "", "", "", ""]


async def one(stores: Stores, runs: int, tenants: int, batch: int, keys: int) -> dict[str, float]:
    k = stores.keys(f"fair-{uuid.uuid4().hex[:8]}")
    await stores.scripts.run("stamp_queue", k, [1, 1])
    names = [f"t{i}" for i in range(tenants)] if tenants > 1 else [""]
    t = time.perf_counter()
    for start in range(0, runs, 2000):
        args: list[object] = []
        for rid in range(start, min(runs, start + 2000)):
            args += _row(rid + 1, names[rid % len(names)], f"key{rid % keys}" if keys else "")
        await stores.scripts.run("enqueue_runs", k, args)
    enq = runs / (time.perf_counter() - t)
    got: list[str] = []
    t = time.perf_counter()
    while True:
        out = await stores.scripts.run("claim_due", k, [batch, "w", 600000, 100])
        if not out:
            break
        got += [out[i].decode() if isinstance(out[i], bytes) else str(out[i]) for i in range(0, len(out), 10)]
    claim = len(got) / (time.perf_counter() - t)
    assert len(got) == runs, f"claimed {len(got)} of {runs}"
    half = got[: runs // 2]
    share = Counter(names[(int(r) - 1) % len(names)] for r in half)
    fair = len(half) / len(names)
    dev = max(abs(share[n] - fair) for n in names)
    await stores.redis.delete(*[k.base + s for s in ("tenants", "fair", "seq", "token", "events")])
    return {"enqueue": enq, "claim": claim, "dev": dev}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--tenants", type=int, nargs="+", default=[1, 10, 1000])
    ap.add_argument("--batch", type=int, default=100)
    a = ap.parse_args()
    settings = Settings.from_env()
    settings.prefix = f"fpbench{uuid.uuid4().hex[:6]}"
    stores = await Stores(settings).connect(database=False)
    try:
        print(f"{a.runs} runs, claim batches of {a.batch}; Redis at {settings.redis_url}")
        print(f"{'tenants':>8} {'keys':>5} {'enqueue/s':>10} {'claim/s':>9} {'claim vs T=1':>13} {'max share dev':>14}")
        base = None
        cases = [(t, 0) for t in a.tenants] + [(1, 100)]
        for tenants, keys in cases:
            r = await one(stores, a.runs, tenants, a.batch, keys)
            base = base or r["claim"]
            print(f"{tenants:>8} {keys:>5} {r['enqueue']:>10.0f} {r['claim']:>9.0f} {r['claim'] / base:>13.2f} "
                  f"{r['dev']:>14.1f}")
        # leave nothing behind: every run hash of the benchmark prefix
        async for key in stores.redis.scan_iter(match=f"{settings.prefix}:*", count=5000):
            await stores.redis.unlink(key)
    finally:
        await stores.close()


if __name__ == "__main__":
    asyncio.run(main())
