"""Client CPU per Redis command with redis-py's hiredis reply parser against its pure-Python one (issue 23
item 4: is a lean protocol path worth building?). The shapes Fencepost's own calls have: a lone command
(a submit's enqueue, a handler's HSET), a pipeline of 100 (the recorder's acknowledgements) and an
XREADGROUP of 1,000 stream entries (the recorder's read, the largest reply it parses). CPU is this
process's (time.process_time), so other load on the machine moves it little; the parsers are interleaved.

    python bench/hiredis_cost.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser
from redis.asyncio import Redis

PARSERS = {"hiredis": _AsyncHiredisParser, "python": _AsyncRESP2Parser}


async def _cpu_per(op: Callable[[], Awaitable[Any]], n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        await op()
    return (time.process_time() - t0) / n * 1e6


async def one(url: str, parser: type, n: int) -> dict[str, float]:
    r = Redis.from_url(url, parser_class=parser)
    try:
        await r.delete("hc:h", "hc:s")
        fields = {b"run": b"123456", b"type": b"succeeded", b"from": b"RUNNING", b"to": b"SUCCEEDED",
                  b"v": b"2", b"ts": b"1796155849174", b"attempt": b"1", b"token": b"8796093022209",
                  b"worker": b"host-1:4242:0", b"started": b"1796155849170"}
        for _ in range(1000):
            await r.xadd("hc:s", fields)  # type: ignore[arg-type]

        async def lone() -> None:
            await r.hset("hc:h", "k", "v")

        async def piped() -> None:
            pipe = r.pipeline(transaction=False)
            for i in range(100):
                pipe.hset("hc:h", str(i), "v")
            await pipe.execute()

        async def stream() -> None:
            await r.xrange("hc:s", count=1000)

        return {"lone_us": await _cpu_per(lone, n), "pipeline100_us_per_cmd": await _cpu_per(piped, n // 20) / 100,
                "xrange1000_us_per_entry": await _cpu_per(stream, max(5, n // 200)) / 1000}
    finally:
        await r.delete("hc:h", "hc:s")
        await r.aclose()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="redis://127.0.0.1:6379/13")
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in PARSERS}
    for _ in range(a.rounds):
        for name, parser in PARSERS.items():
            rows[name].append(await one(a.url, parser, a.n))
    print(f"client CPU-us (this process), medians of {a.rounds} interleaved rounds")
    keys = list(rows["hiredis"][0])
    print(f"{'':26}" + "".join(f"{k:>26}" for k in keys))
    med = {name: {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in keys} for name, rs in rows.items()}
    for name in PARSERS:
        print(f"{name:26}" + "".join(f"{med[name][k]:>26.2f}" for k in keys))
    print(f"{'hiredis / python':26}" + "".join(f"{med['hiredis'][k] / med['python'][k]:>25.2f}x" for k in keys))


if __name__ == "__main__":
    asyncio.run(main())
