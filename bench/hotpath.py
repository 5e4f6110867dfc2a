"""Redis CPU per job of each hot-path script, and PostgreSQL CPU per event row, in isolation.

    python bench/hotpath.py                          # Redis: enqueue, claim, finish, read, expire, ack+trim
    python bench/hotpath.py --lua-dir /tmp/old/lua   # the same scripts from another tree (A/B a Lua change)
    python bench/hotpath.py --ref-lua-dir /work/ref/lua --rounds 5   # this tree and another, interleaved
    python bench/hotpath.py --commands               # Redis commands per job inside each phase's scripts
    python bench/hotpath.py --inspect                # also drift repair's repair_inspect, per run it reads
    python bench/hotpath.py --events                 # PostgreSQL: jsonb insert vs binary COPY of event rows
    python bench/hotpath.py --recorder               # the recorder: its own CPU, PostgreSQL's and Redis's per job
    python bench/hotpath.py --rate-keys 100          # every run with one of 100 rate keys (the rate check's cost)

Redis: a private redis-server (no persistence) on a free port, N runs enqueued, claimed and finished
in batches as a worker does (100 per claim, one finish call per claim), then the recorder's side:
XREADGROUP, expire_finished, XACK and the trim (or, with --xdel, XDEL per entry as before). CPU from
the server's `INFO cpu` (user + sys) around each phase, so nothing else on the machine is counted;
medians of --rounds. PostgreSQL: a scratch database `bench_hotpath`, the backend's CPU from /proc.
Recorder: N jobs submitted, claimed and finished through the real scripts on a private redis-server
(no recorder running, so their transitions wait in the stream), then the recorder drains the stream in
batches of --record-batch entries: CPU of this process (only the recorder runs in it then), of the
scratch database's PostgreSQL backends, and of the Redis server, per job. Run it with each build's
interpreter in turn to A/B a recorder change (the harness is this file; the package is the venv's).
These isolate one hop each; bench/throughput.py measures the whole system.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench.app

from fencepost.core import hot
from fencepost.core.config import Settings
from fencepost.core.hot import ClaimArgs, EnqueueItem, Finish, FinishArgs, StampArgs, TtlArgs, Versioned
from fencepost.core.models import encode_payload
from fencepost.core.record import Database, upgrade
from fencepost.core.stores import Stores
from fencepost.reconciler.recorder import _EVENT_COLUMNS  # the row COPY writes, as the recorder writes it


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


async def _cpu(r: object) -> float:
    info = await r.info("cpu")  # type: ignore[attr-defined]
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _commands(r: object) -> dict[str, tuple[int, float]]:
    """INFO commandstats: calls and usec per command (scripts' inner commands included)."""
    info = await r.info("commandstats")  # type: ignore[attr-defined]
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"])) for k, v in info.items()}


def _use_lua(lua: Path | None) -> None:
    """Render the scripts from `lua` (None: this tree's) from now on."""
    hot.resource_dir = (lambda name: lua if name == "lua" else _REAL_RESOURCE_DIR(name)) if lua else _REAL_RESOURCE_DIR  # type: ignore[assignment]
    hot.render.cache_clear()


_REAL_RESOURCE_DIR = hot.resource_dir
_COMMANDS: dict[str, dict[str, tuple[float, float]]] = {}  # phase -> command -> (calls, usec) per job


async def redis_phases(url: str, prefix: str, n: int, batch: int, xdel: bool, rate_keys: int = 0,
                       database_url: str = "", commands: bool = False, inspect: bool = False) -> dict[str, float]:
    # Stores needs both URLs (core/stores rule 3); these phases never connect to the database
    st = Stores(Settings(redis_url=url, database_url=database_url, prefix=prefix))
    r, k = st.redis, st.keys("q")
    await st.scripts.stamp_queue(k, StampArgs(1, 1))
    payload = encode_payload((1,), {})
    now = int(time.time() * 1000)
    t: dict[str, float] = {}
    seen: dict[str, dict[str, tuple[int, float]]] = {}

    async def count(phase: str, before: dict[str, tuple[int, float]]) -> None:
        if not commands:
            return
        after = await _commands(r)
        acc = seen.setdefault(phase, {})
        for cmd, (calls, usec) in after.items():
            c, u = before.get(cmd, (0, 0.0))
            old = acc.get(cmd, (0, 0.0))
            acc[cmd] = (old[0] + calls - c, old[1] + usec - u)

    s0 = await _commands(r) if commands else {}
    c0 = await _cpu(r)
    for i in range(0, n, 1000):
        # --rate-keys K: every run carries one of K rate keys with a rate it never reaches (the cost of the check)
        items = [EnqueueItem(j + 1, "PENDING", now, 0, "bench.tiny", payload, 3, 60_000, 0, 0, "", "", 0, "", "", "",
                             f"k{j % rate_keys}" if rate_keys else "", "1000000/1000" if rate_keys else "")
                 for j in range(i, min(i + 1000, n))]
        await st.scripts._call("enqueue_runs", k, None, items)
    t["enqueue"] = await _cpu(r) - c0
    await count("enqueue", s0)
    if inspect:  # drift repair's read of due runs (reconciler/drift.py: repair_inspect, 1,000 ids a call)
        s0 = await _commands(r) if commands else {}
        c0 = await _cpu(r)
        for i in range(0, n, 1000):
            await st.scripts.repair_inspect(k, range(i + 1, min(i + 1000, n) + 1))
        t["inspect"] = await _cpu(r) - c0
        await count("inspect", s0)
    t["claim"] = t["finish"] = 0.0
    while True:
        s0 = await _commands(r) if commands else {}
        c0 = await _cpu(r)
        jobs = await st.scripts.claim_due(k, ClaimArgs(batch, "w1", 30_000, 100))
        t["claim"] += await _cpu(r) - c0
        await count("claim", s0)
        if not jobs:
            break
        s0 = await _commands(r) if commands else {}
        c0 = await _cpu(r)
        await st.scripts.finish_runs(k, FinishArgs(3),
                                     [Finish(j.id, j.token, "ok", b"\x91\x01", "", 0) for j in jobs])
        t["finish"] += await _cpu(r) - c0
        await count("finish", s0)
    await r.xgroup_create(k.events, "recorder", id="0", mkstream=True)
    t["xreadgroup"] = t["expire"] = t["ack+trim"] = 0.0
    while True:
        c0 = await _cpu(r)
        rep = await r.xreadgroup("recorder", "c", {k.events: ">"}, count=5000)
        t["xreadgroup"] += await _cpu(r) - c0
        if not rep:
            break
        entries = rep[0][1]
        done = [Versioned(int(f[b"run"]), int(f[b"v"])) for _, f in entries if f[b"to"] == b"SUCCEEDED"]
        c0 = await _cpu(r)
        if done:
            await st.scripts.expire_finished(k, TtlArgs(3_600_000), done)
        t["expire"] += await _cpu(r) - c0
        ids = [e for e, _ in entries]
        c0 = await _cpu(r)
        pipe = r.pipeline(transaction=False)
        pipe.xack(k.events, "recorder", *ids)
        if xdel:
            pipe.xdel(k.events, *ids)
        else:
            ms, _, seq = ids[-1].partition(b"-")
            pipe.xtrim(k.events, minid=b"%s-%d" % (ms, int(seq) + 1), approximate=False)
        await pipe.execute()
        t["ack+trim"] += await _cpu(r) - c0
    await r.aclose()
    for phase, cmds in seen.items():  # the info calls themselves are not the scripts' work
        _COMMANDS[phase] = {c: (v[0] / n, v[1] / n) for c, v in cmds.items() if c != "info" and v[0] > 0}
    return {name: v / n * 1e6 for name, v in t.items()}


async def redis_main(a: argparse.Namespace) -> None:
    """Each round on a fresh prefix of one private server; with --ref-lua-dir every round runs this
    tree's scripts and then the other tree's (interleaved, so both see the same machine)."""
    this = Path(a.lua_dir) if a.lua_dir else None
    builds: list[tuple[str, Path | None]] = [("this", this)]
    if a.ref_lua_dir:
        builds.append(("ref", Path(a.ref_lua_dir)))
    port = _free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    runs: dict[str, list[dict[str, float]]] = {b: [] for b, _ in builds}
    commands: dict[str, dict[str, dict[str, tuple[float, float]]]] = {}
    try:
        await asyncio.sleep(0.3)
        for i in range(a.rounds):
            for b, lua in builds:
                _use_lua(lua)
                runs[b].append(await redis_phases(f"redis://127.0.0.1:{port}/0", f"hp{b}{i}", a.jobs, a.batch,
                                                  a.xdel, a.rate_keys, a.admin_url, a.commands, a.inspect))
                commands[b] = dict(_COMMANDS)
    finally:
        server.kill()
        server.wait()
    _use_lua(this)
    print(f"Redis CPU-us per job, {a.jobs:,} jobs, claims of {a.batch}, medians of {a.rounds} "
          f"({'XDEL per entry' if a.xdel else 'XTRIM MINID'}; lua from {a.lua_dir or 'this tree'}"
          f"{'; ref: ' + a.ref_lua_dir + ', interleaved' if a.ref_lua_dir else ''})")

    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    totals = {b: 0.0 for b in runs}
    for name in runs["this"][0]:
        line = f"  {name:11s}"
        for b in runs:
            vals = [r[name] for r in runs[b]]
            totals[b] += med(vals)
            line += f" {med(vals):6.1f}   ({' '.join(f'{v:.1f}' for v in vals)})"
        if "ref" in runs:
            line += f"   x{med([r[name] for r in runs['this']]) / max(med([r[name] for r in runs['ref']]), 1e-9):.2f}"
        print(line)
    print(f"  {'total':11s} " + "   ".join(f"{totals[b]:6.1f}" for b in runs)
          + (f"   x{totals['this'] / totals['ref']:.2f}" if "ref" in runs else ""))
    for b in commands if a.commands else ():
        print(f"commands per job inside the scripts ({b}, last round): calls / usec per job")
        for phase, cmds in commands[b].items():
            top = sorted(cmds.items(), key=lambda kv: -kv[1][1])
            print(f"  {phase:8s} " + "  ".join(f"{c} {v[0]:.2f}/{v[1]:.1f}" for c, v in top if v[0] >= 0.01))


def _backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def events_main(a: argparse.Namespace) -> None:
    admin = await asyncpg.connect(a.admin_url)
    await admin.execute("DROP DATABASE IF EXISTS bench_hotpath WITH (FORCE)")
    await admin.execute("CREATE DATABASE bench_hotpath")
    url = a.admin_url.rsplit("/", 1)[0] + "/bench_hotpath"
    conn = await asyncpg.connect(url)
    await upgrade(conn)
    await conn.close()
    db = Database(url, max_size=1)
    await db.connect()
    enc = msgspec.json.Encoder()
    ts = int(time.time() * 1000)
    at = datetime.fromtimestamp(ts / 1000, UTC)
    sid, n, batch = 1, a.jobs * 3, a.rows
    res: dict[str, list[tuple[float, float]]] = {}
    try:
        for _ in range(a.rounds):
            for mode in ("jsonb insert", "binary COPY"):
                async with db.transaction() as tx:
                    pid = await tx.conn.fetchval("SELECT pg_backend_pid()")
                b0, p0 = _backend_cpu(pid), time.process_time()
                for i in range(0, n, batch):
                    rows = [(i + j, "claimed", "PENDING", "RUNNING", 2, 1, 1099511627777 + j, "host:123:abcdef", None,
                             None, None, ts if mode == "jsonb insert" else at, "fp:{q}:events", sid + j, None, "q")
                            for j in range(batch)]
                    sid += batch
                    async with db.transaction() as tx:
                        if mode == "jsonb insert":
                            await tx.fetch("insert_events_json", enc.encode(rows).decode())
                        else:
                            await tx.copy_in("events", rows, _EVENT_COLUMNS)
                res.setdefault(mode, []).append(((_backend_cpu(pid) - b0) / n * 1e6, (time.process_time() - p0) / n * 1e6))
    finally:
        await db.close()
        await admin.execute("DROP DATABASE IF EXISTS bench_hotpath WITH (FORCE)")
        await admin.close()
    print(f"CPU-us per event row, {n:,} rows in batches of {batch:,}, {a.rounds} interleaved rounds")
    for mode, vals in res.items():
        be = sorted(v[0] for v in vals)[len(vals) // 2]
        cl = sorted(v[1] for v in vals)[len(vals) // 2]
        print(f"  {mode:13s} PostgreSQL backend {be:5.1f}   client {cl:4.1f}")


async def recorder_round(a: argparse.Namespace, redis_url: str, admin: asyncpg.Connection, i: int) -> dict[str, float]:
    from bench.app import registry
    from fencepost.client import Client
    from fencepost.core.models import Submit
    from fencepost.reconciler.recorder import Recorder

    await admin.execute("DROP DATABASE IF EXISTS bench_hotpath WITH (FORCE)")
    await admin.execute("CREATE DATABASE bench_hotpath")
    url = a.admin_url.rsplit("/", 1)[0] + "/bench_hotpath"
    conn = await asyncpg.connect(url)
    await upgrade(conn)
    settings = Settings(redis_url=redis_url, database_url=url, prefix=f"hr{i}")
    client = await Client(settings=settings).connect()
    try:
        await client.register(registry)
        for j in range(0, a.jobs, 1000):
            await client.submit_many([Submit(handler="bench.tiny")] * min(1000, a.jobs - j))
        st, k = client.stores, client.stores.keys("bench")
        while jobs := await st.scripts.claim_due(k, ClaimArgs(a.batch, "w1", 30_000, 100)):
            await st.scripts.finish_runs(k, FinishArgs(3),
                                         [Finish(j.id, j.token, "ok", b"\xc0", "", 0) for j in jobs])
        rec = Recorder(st, batch=a.record_batch, consumer="bench")
        await rec.run_once(block_ms=1)  # the consumer group, the pool and the statements, before the clock starts
        me = await conn.fetchval("SELECT pg_backend_pid()")
        pids = [r[0] for r in await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = 'bench_hotpath' "
                                               "AND pid <> $1", me)]
        pg0, r0, p0, t0 = sum(map(_backend_cpu, pids)), await _cpu(st.redis), time.process_time(), time.perf_counter()
        while await rec.run_once(block_ms=1):
            pass
        wall = time.perf_counter() - t0
        proc, red = time.process_time() - p0, await _cpu(st.redis) - r0
        pg = sum(map(_backend_cpu, pids)) - pg0
        left = await conn.fetchval("SELECT count(*) FROM runs WHERE status <> 'SUCCEEDED'")
        if left:
            raise SystemExit(f"{left} runs not recorded as SUCCEEDED")
    finally:
        await client.close()
        await conn.close()
    n = a.jobs
    return {"recorder": proc / n * 1e6, "postgres": pg / n * 1e6, "redis": red / n * 1e6,
            "total": (proc + pg + red) / n * 1e6, "jobs/s": n / wall}


async def recorder_main(a: argparse.Namespace) -> None:
    port = _free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    admin = await asyncpg.connect(a.admin_url)
    try:
        await asyncio.sleep(0.3)
        runs = [await recorder_round(a, f"redis://127.0.0.1:{port}/0", admin, i) for i in range(a.rounds)]
    finally:
        await admin.execute("DROP DATABASE IF EXISTS bench_hotpath WITH (FORCE)")
        await admin.close()
        server.kill()
        server.wait()
    import fencepost
    print(f"recorder CPU-us per job, {a.jobs:,} jobs (claimed + succeeded), batches of {a.record_batch:,} entries, "
          f"medians of {a.rounds} (fencepost from {Path(fencepost.__file__).parent})")
    for name in runs[0]:
        vals = sorted(r[name] for r in runs)
        print(f"  {name:9s} {vals[len(vals) // 2]:8.1f}   ({' '.join(f'{r[name]:.1f}' for r in runs)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lua-dir", default=None, help="lua/ of another tree (A/B a script change)")
    ap.add_argument("--ref-lua-dir", default=None, help="lua/ of another tree, run interleaved with this one")
    ap.add_argument("--commands", action="store_true", help="INFO commandstats per job of each phase")
    ap.add_argument("--inspect", action="store_true", help="also drift repair's repair_inspect of every due run")
    ap.add_argument("--xdel", action="store_true", help="delete recorded entries one by one (the old way)")
    ap.add_argument("--rate-keys", type=int, default=0, help="every run carries one of this many rate keys")
    ap.add_argument("--events", action="store_true", help="PostgreSQL: event rows by jsonb insert vs COPY")
    ap.add_argument("--recorder", action="store_true", help="the recorder draining a stream of finished jobs")
    ap.add_argument("--record-batch", type=int, default=1000, help="--recorder: entries per recorder batch")
    ap.add_argument("--rows", type=int, default=3000, help="--events: rows per statement (a recorder batch)")
    ap.add_argument("--admin-url", default=os.environ.get("BENCH_DATABASE_URL",
                                                          "postgresql://postgres@127.0.0.1:5432/postgres"))
    a = ap.parse_args()
    asyncio.run(events_main(a) if a.events else recorder_main(a) if a.recorder else redis_main(a))


if __name__ == "__main__":
    main()
