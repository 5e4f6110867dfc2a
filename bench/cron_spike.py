"""Cron spike: N schedules firing in the same minute, with and without spread, through a
real trigger, reconciler and worker processes (`fencepost loadtest spike`).

    python bench/cron_spike.py                          # 100,000 schedules, spread 0 and 60 s
    python bench/cron_spike.py --schedules 20000 --workers 2 --spreads 0 60

Each case runs on a fresh PostgreSQL database and a fresh Redis key prefix. Prints one
report per case and, with --json, one JSON object per line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parent.parent


async def _create(admin_url: str, name: str) -> str:
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    return admin_url.rsplit("/", 1)[0] + "/" + name


async def _drop(admin_url: str, name: str) -> None:
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


def run_case(schedules: int, workers: int, spread: float, redis_url: str, admin_url: str, as_json: bool,
             extra: list[str]) -> dict:
    name = f"fp_spike_{uuid.uuid4().hex[:8]}"
    url = asyncio.run(_create(admin_url, name))
    env = dict(os.environ, FENCEPOST_REDIS_URL=redis_url, FENCEPOST_DATABASE_URL=url,
               FENCEPOST_PREFIX=f"spike{uuid.uuid4().hex[:6]}", PYTHONPATH=str(ROOT))
    try:
        out = subprocess.run([sys.executable, "-m", "fencepost.cli", "loadtest", "spike", "--schedules", str(schedules),
                              "--workers", str(workers), "--spread", str(spread), "--json", *extra],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        rep = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        asyncio.run(_drop(admin_url, name))
    return rep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--spreads", type=float, nargs="+", default=[0.0, 60.0])
    ap.add_argument("--redis-url", default=os.environ.get("FENCEPOST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--admin-url", default=os.environ.get("FENCEPOST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--json", action="store_true")
    args, extra = ap.parse_known_args()
    sys.path.insert(0, str(ROOT))
    from fencepost.dev.loadtest import format_report

    for spread in args.spreads:
        rep = run_case(args.schedules, args.workers, spread, args.redis_url, args.admin_url, args.json, extra)
        if args.json:
            print(json.dumps(rep), flush=True)
        else:
            print("\n".join(format_report(rep)), flush=True)
            print(flush=True)


if __name__ == "__main__":
    main()
