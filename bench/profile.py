"""Where a Fencepost worker and the recorder spend their CPU during a drain (py-spy).

    .venv/bin/pip install py-spy
    python bench/profile.py --jobs 60000            # writes bench/results/profile-*.txt

The same drain as bench/throughput.py's default (tiny job, default worker settings, one
reconciler, calls of 1,000), but py-spy samples the worker and the reconciler from the start
signal until the queue is empty. Each process gets a raw collapsed-stack file and a summary of
the top functions by own time (the frame on top of the stack) and by total time (anywhere on it).
Sampling slows the sampled processes, so the drain rate printed here is not a benchmark figure.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.measure import one_bench_at_a_time
from bench.throughput import Fencepost, wait_queues_empty
from fencepost.core.models import Submit

PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def short(frame: str) -> str:
    """`fn (/long/path/pkg/mod.py:123)` -> `fn (pkg/mod.py)`: one entry per function, whatever the line."""
    name, sep, where = frame.partition(" (")
    if not sep:
        return frame
    path = where.rsplit(":", 1)[0].rstrip(")")
    return f"{name} ({'/'.join(path.split('/')[-2:])})"


LAUNCH = ("click/", "<frozen runpy>", "cli/common.py", "cli/main.py", "cli/__main__.py", "uvloop/__init__.py",
          "asyncio/runners.py")
"""Frames of the process launcher, under every sample: left out of the total-time list."""


def summarise(raw: Path, top: int) -> str:
    """Top frames by own and by total samples from py-spy's raw (collapsed) output."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [short(f) for f in stack.split(";")]
        samples += n
        own[frames[-1]] += n
        for f in set(frames):
            if not any(x in f for x in LAUNCH):
                total[f] += n
    lines = [f"{samples} samples", "", "own time:"]
    lines += [f"  {100 * n / samples:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines += ["", "total time (anywhere on the stack; launcher frames left out):"]
    lines += [f"  {100 * n / samples:5.1f}%  {f}" for f, n in total.most_common(top)]
    return "\n".join(lines)


def spy(raw: Path, pid: int, rate: int) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` without pausing it, until SIGINT."""
    return subprocess.Popen([PY_SPY, "record", "--format", "raw", "--rate", str(rate), "--nonblocking",
                             "-o", str(raw), "--pid", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def profile(a: argparse.Namespace) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    async with Fencepost(a) as fp:
        await fp.redis.set(fp.keys.paused, 1)
        for i in range(0, a.jobs, 1000):
            await fp.client.submit_many([Submit(handler="bench.tiny")] * min(1000, a.jobs - i))
        fp.start(1)
        await fp.settle()
        targets = {"worker": fp.workers[0].pid, "reconciler": fp.procs[0].pid}
        spies = {name: spy(out / f"profile-{name}.raw", pid, a.rate) for name, pid in targets.items()}
        await asyncio.sleep(1.0)  # py-spy attaches
        t0 = asyncio.get_running_loop().time()
        await fp.go(1)
        await wait_queues_empty(fp.redis, [fp.keys])
        await fp.wait_history()
        took = asyncio.get_running_loop().time() - t0
        for p in spies.values():
            p.send_signal(2)  # SIGINT: py-spy writes its file and exits
        for name, p in spies.items():
            _, err = p.communicate(timeout=30)
            if p.returncode not in (0, None) and not (out / f"profile-{name}.raw").exists():
                print(f"py-spy on the {name} failed: {err.decode()[-300:]}", file=sys.stderr)
    print(f"{a.jobs:,} jobs drained and recorded in {took:.1f} s under py-spy ({a.jobs / took:,.0f}/s, not a benchmark)")
    for name in targets:
        raw = out / f"profile-{name}.raw"
        if raw.exists():
            text = summarise(raw, a.top)
            (out / f"profile-{name}.txt").write_text(text + "\n")
            print(f"\n== {name} ({raw}) ==\n{text}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=60_000)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))
    ap.add_argument("--done-url", default=os.environ.get("BENCH_DONE_URL", "redis://127.0.0.1:6379/15"))
    ap.add_argument("--admin-url", default=os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--summarise", nargs="+", metavar="RAW", help="only summarise existing py-spy raw files")
    a = ap.parse_args()
    if a.summarise:
        for raw in a.summarise:
            print(f"== {raw} ==\n{summarise(Path(raw), a.top)}\n")
        return
    a.concurrency, a.noop = None, False
    os.environ["BENCH_DONE_URL"] = a.done_url
    with one_bench_at_a_time():
        asyncio.run(profile(a))


if __name__ == "__main__":
    main()
