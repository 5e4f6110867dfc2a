"""Issue 23 item 4: a lean protocol path for Fencepost's own Redis calls against redis-py.

The lean path is the least a client can do: one asyncio Protocol on one connection, commands packed
by hiredis.pack_command, replies parsed by hiredis.Reader, a future per command (pipelining is free:
write several, await their futures). No pool, no retry, no health check, no error mapping, no TLS,
Sentinel or Cluster. Against it, redis-py as Fencepost connects it (`fencepost.core.redisconn.connect`:
hiredis packing and parsing, the waiting pool, no re-send). The client's CPU per command (this process,
`time.process_time`: user and system, so the socket syscalls count) and the wall time, for:

- a lone EVALSHA (a script of one HSET), awaited before the next: a lone submit's enqueue_runs;
- a pipeline of 100 such EVALSHAs (redis-py: `pipeline(transaction=False)`), per command.

Variants interleaved per round, medians of --rounds.

    python bench/lean_redis.py --rounds 5 --n 3000 --redis-url redis://127.0.0.1:6379/13

How many of these calls a job makes is what decides (bench/throughput.py prints `evalsha` calls per
job in its Redis commandstats: 0.06 per job across a 20,000-job drain, the worker's claims and finishes
being batched; a lone submit makes one).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import hiredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fencepost.core.redisconn import connect

SCRIPT = "redis.call('HSET', KEYS[1], 'a', ARGV[1]) return 1"
PIPE = 100


class Lean(asyncio.Protocol):
    """One connection, one future per command, replies in order (RESP2)."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's is not a subclass)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            self.waiting.popleft().set_result(reply)

    def call(self, *args: Any) -> asyncio.Future[Any]:
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        assert self.transport is not None
        self.transport.write(hiredis.pack_command(args))
        return fut


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=3000, help="commands per variant per round")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    a = ap.parse_args()
    host_port, _, db = a.redis_url.removeprefix("redis://").partition("/")
    host, _, port = host_port.partition(":")
    loop = asyncio.get_running_loop()
    _, lean = await loop.create_connection(Lean, host, int(port or 6379))
    await lean.call("SELECT", db or "0")
    rp = connect(a.redis_url)
    sha = await rp.script_load(SCRIPT)
    key = "bench:lean"

    async def rp_lone(n: int) -> None:
        for i in range(n):
            await rp.evalsha(sha, 1, key, i)

    async def lean_lone(n: int) -> None:
        for i in range(n):
            await lean.call("EVALSHA", sha, 1, key, i)

    async def rp_pipe(n: int) -> None:
        for i in range(0, n, PIPE):
            pipe = rp.pipeline(transaction=False)
            for j in range(PIPE):
                pipe.evalsha(sha, 1, key, i + j)
            await pipe.execute()

    async def lean_pipe(n: int) -> None:
        for i in range(0, n, PIPE):
            await asyncio.gather(*(lean.call("EVALSHA", sha, 1, key, i + j) for j in range(PIPE)))

    cases = {"lone, redis-py": rp_lone, "lone, lean": lean_lone,
             f"pipeline of {PIPE}, redis-py": rp_pipe, f"pipeline of {PIPE}, lean": lean_pipe}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for go in cases.values():  # warm
        await go(PIPE)
    for _ in range(a.rounds):
        for name, go in cases.items():
            c0, w0 = time.process_time(), time.perf_counter()
            await go(a.n)
            got[name].append(((time.process_time() - c0) / a.n * 1e6, (time.perf_counter() - w0) / a.n * 1e6))
    await rp.delete(key)
    await rp.aclose()
    assert lean.transport is not None
    lean.transport.close()
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"client CPU and wall per command, medians of {a.rounds} interleaved rounds of {a.n:,} (load {load})")
    print(f"{'':32}{'client CPU us':>14}{'wall us':>10}")
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in got.items()}
    for name, (cpu, wall) in med.items():
        print(f"{name:32}{cpu:14.1f}{wall:10.1f}")
    for kind in ("lone", f"pipeline of {PIPE}"):
        r, le = med[f"{kind}, redis-py"], med[f"{kind}, lean"]
        print(f"lean / redis-py, {kind}: client CPU x{le[0] / r[0]:.2f} ({r[0] - le[0]:+.1f} us saved per command), "
              f"wall x{le[1] / r[1]:.2f}")


if __name__ == "__main__":
    try:
        import uvloop
        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
