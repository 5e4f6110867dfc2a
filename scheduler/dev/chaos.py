"""`fencepost loadtest chaos`: a fault-injection soak of the whole system.

Real worker, reconciler (recorder + maintenance) and trigger processes run against the
configured stores, Redis reached through a local TCP proxy this process owns (so latency,
dropped connections and a primary switch can be injected). A steady load of jobs each writes
its side effect, with its (attempt, token), through a fenced ledger (a downstream system
that keeps the highest token per run). A seeded random schedule of faults runs for the
duration; after each fault a probe job measures the time to recover. At the end the
invariants are checked and printed; any failure gives a non-zero exit.

Faults: SIGKILL / SIGSTOP+SIGCONT of a worker, the reconciler (the recorder) and the
trigger; PostgreSQL backend termination; proxy latency and dropped connections; FLUSHALL
(only with allow_flushall: it empties the whole Redis server); replica promotion (only with
a replica URL: the replica becomes primary, the proxy switches to it, the old primary
becomes its replica for the next promotion).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import redis.asyncio as aioredis

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import FencepostError
from fencepost.core.models import Submit
from fencepost.core.record import Database
from fencepost.core.registry import Registry

__all__ = ["FAULTS", "ChaosReport", "format_chaos", "registry", "soak"]

registry = Registry()
_ledger: Database | None = None

FAULTS = ("kill_worker", "stop_worker", "kill_reconciler", "stop_reconciler", "kill_trigger", "stop_trigger",
          "pg_terminate", "latency", "drop_connections", "flushall", "promote")
"""Every fault kind; flushall and promote run only when enabled (allow_flushall, replica_url)."""


@registry.job("chaos.effect", queue="chaos", max_retries=50, timeout=30)
async def effect(ctx: Any, soak_id: str, work_ms: int) -> bool:
    """Work a little, then perform the side effect through the fenced ledger."""
    global _ledger
    await asyncio.sleep(work_ms / 1000)
    if _ledger is None:
        _ledger = await Database(os.environ["FENCEPOST_DATABASE_URL"], max_size=2).connect()
    row = await _ledger.fetchrow("chaos_effect", soak_id, ctx.run_id, ctx.attempt, ctx.token, ctx.worker_id)
    return bool(row and row["accepted"])


class Recovery(msgspec.Struct):
    kind: str
    seconds: float | None
    """From the end of the fault to a new job's success in PostgreSQL; None: not within the limit."""


class ChaosReport(msgspec.Struct, kw_only=True):
    seed: int
    duration_s: float
    queue: str
    acked: int
    failed_submits: int
    lost: int
    """Acknowledged submits not SUCCEEDED in PostgreSQL at the end."""
    executions: int
    runs_repeated: int
    """Runs whose effect was performed by more than one execution (at least once)."""
    untraced: int
    reused: int
    beyond: int
    stale_accepted: int
    refused: int
    """Effects the fence refused: superseded executions stopped downstream."""
    token_order: int
    unknown_attempts: int
    incomplete: int
    faults: dict[str, int]
    recovery_s: dict[str, dict[str, float | None]]
    unrecovered: int
    errors: list[str]
    failed: list[str]


class _Proxy:
    """A local TCP proxy to Redis: extra latency, dropped connections, switching the target."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.delay = 0.0
        self.server: asyncio.Server | None = None
        self.conns: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.conns.update((writer, uw))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if self.delay:
                        await asyncio.sleep(self.delay)
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, uw), pipe(ur, writer))
        self.conns.difference_update((writer, uw))

    def drop(self) -> int:
        n = len(self.conns)
        for w in list(self.conns):
            w.transport.abort()
        self.conns.clear()
        return n

    async def close(self) -> None:
        self.drop()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def _with_port(url: str, port: int) -> str:
    u = urlsplit(url)
    netloc = u.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(u._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


class _Soak:
    def __init__(self, settings: Settings, *, seed: int, duration_s: float, workers: int, concurrency: int,
                 rate: float, replica_url: str | None, allow_flushall: bool, log_dir: str | None,
                 progress: Callable[[str], None]) -> None:
        self.settings, self.seed, self.duration_s = settings, seed, duration_s
        self.workers, self.concurrency, self.rate = workers, concurrency, rate
        self.replica_url, self.allow_flushall = replica_url, allow_flushall
        self.log_dir = Path(log_dir) if log_dir else None
        self.progress = progress
        self.rng = random.Random(seed)
        """The fault schedule alone draws from it, so a seed gives the same faults in the same order."""
        self.load_rng = random.Random(seed + 1)
        self.soak_id = f"chaos-{seed}-{uuid.uuid4().hex[:6]}"
        self.queue = f"chaos{uuid.uuid4().hex[:8]}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopped: set[str] = set()
        self.acked: list[int] = []
        self.failed_submits = 0
        self.errors: list[str] = []
        self.faults: dict[str, int] = {}
        self.recoveries: list[Recovery] = []
        self.primary_url = settings.redis_url
        self.proxy: _Proxy | None = None
        self.svc_settings = settings

    # -- processes -------------------------------------------------------------------------------
    def _spawn(self, name: str) -> None:
        s = self.svc_settings
        root = Path(__file__).resolve().parent.parent.parent
        env = dict(os.environ, FENCEPOST_REDIS_URL=s.redis_url, FENCEPOST_DATABASE_URL=s.database_url,
                   FENCEPOST_PREFIX=s.prefix, FENCEPOST_LOG_FORMAT="json", FENCEPOST_BACKOFF_BASE_MS="100",
                   FENCEPOST_BACKOFF_CAP_MS="2000",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
        if name.startswith("worker"):
            args = ["worker", "--app", "fencepost.dev.chaos:registry", "--queue", self.queue, "--processes", "1",
                    "--concurrency", str(self.concurrency)]
        else:
            args = [name]
        out: Any = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "fencepost.cli", *args], env=env, stdout=out,
                                            stderr=out, start_new_session=True)

    def _signal(self, name: str, sig: int) -> None:
        p = self.procs[name]
        if p.poll() is None:
            os.kill(p.pid, sig)

    async def _restart(self, name: str) -> None:
        p = self.procs[name]
        self._signal(name, signal.SIGKILL)
        await asyncio.to_thread(p.wait, 30)
        self._spawn(name)

    def _stop_all(self) -> None:
        for name in list(self.stopped):
            self._signal(name, signal.SIGCONT)
        self.stopped.clear()
        for name, p in self.procs.items():
            if p.poll() is not None:
                self.errors.append(f"{name} exited with code {p.returncode}")
            else:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)

    # -- load and probes -------------------------------------------------------------------------
    async def _load(self, client: Client, stop: asyncio.Event) -> None:
        period = 0.1
        per_tick = max(1, round(self.rate * period))
        while not stop.is_set():
            reqs = [Submit(handler="chaos.effect", queue=self.queue, args=(self.soak_id, self.load_rng.randint(5, 300)))
                    for _ in range(per_tick)]
            try:
                self.acked += await asyncio.wait_for(client.submit_many(reqs), 15)
            except (FencepostError, TimeoutError):
                self.failed_submits += len(reqs)  # not acknowledged: a caller would retry
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)

    async def _probe(self, client: Client, db: Database, limit_s: float) -> float | None:
        """Time until a new job submitted now has succeeded in PostgreSQL."""
        t0 = time.monotonic()
        rid: int | None = None
        while time.monotonic() - t0 < limit_s:
            try:
                if rid is None:
                    rid = await asyncio.wait_for(client.submit("chaos.effect", self.soak_id, 1, queue=self.queue), 10)
                    self.acked.append(rid)
                rows = await db.fetch("chaos_run_status", [rid])
                if rows and rows[0]["status"] == "SUCCEEDED":
                    return round(time.monotonic() - t0, 3)
            except (FencepostError, TimeoutError, OSError):
                pass
            await asyncio.sleep(0.05)
        return None

    # -- faults ----------------------------------------------------------------------------------
    def _kinds(self) -> list[str]:
        kinds = [k for k in FAULTS if k not in ("flushall", "promote")]
        if self.allow_flushall:
            kinds.append("flushall")
        if self.replica_url:
            kinds.append("promote")
        return kinds

    async def _fault(self, kind: str, db: Database) -> None:
        rng = self.rng
        workers = [n for n in self.procs if n.startswith("worker")]
        if kind in ("kill_worker", "kill_reconciler", "kill_trigger"):
            name = rng.choice(workers) if kind == "kill_worker" else kind.split("_", 1)[1]
            self.stopped.discard(name)
            await self._restart(name)
        elif kind in ("stop_worker", "stop_reconciler", "stop_trigger"):
            name = rng.choice(workers) if kind == "stop_worker" else kind.split("_", 1)[1]
            self._signal(name, signal.SIGSTOP)
            self.stopped.add(name)
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            self._signal(name, signal.SIGCONT)
            self.stopped.discard(name)
        elif kind == "pg_terminate":
            await db.fetchval("chaos_terminate_backends")
        elif kind == "latency":
            assert self.proxy is not None
            self.proxy.delay = rng.uniform(0.005, 0.05)
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            self.proxy.delay = 0.0
        elif kind == "drop_connections":
            assert self.proxy is not None
            self.proxy.drop()
        elif kind == "flushall":  # straight to the primary: the proxy may just have dropped its connections
            direct = aioredis.Redis.from_url(self.primary_url)
            try:
                await direct.flushall()
            finally:
                await direct.aclose()
        elif kind == "promote":
            await self._promote()

    async def _promote(self) -> None:
        """The replica becomes primary (REPLICAOF NO ONE), the proxy switches to it, and the old
        primary becomes its replica (a full resync: what it had beyond the replica is lost)."""
        assert self.proxy is not None and self.replica_url is not None
        old, new = aioredis.Redis.from_url(self.primary_url), aioredis.Redis.from_url(self.replica_url)
        try:
            await new.execute_command("REPLICAOF", "NO", "ONE")
            nu = urlsplit(self.replica_url)
            self.proxy.target = (nu.hostname or "127.0.0.1", nu.port or 6379)
            self.proxy.drop()
            await old.execute_command("REPLICAOF", nu.hostname or "127.0.0.1", str(nu.port or 6379))
        finally:
            await old.aclose()
            await new.aclose()
        self.primary_url, self.replica_url = self.replica_url, self.primary_url

    # -- the soak --------------------------------------------------------------------------------
    async def run(self) -> ChaosReport:
        s = self.settings
        db = await Database(s.database_url, max_size=4).connect()
        await db.upgrade()
        await db.execute("chaos_create_ledger")
        u = urlsplit(s.redis_url)
        self.proxy = _Proxy(u.hostname or "127.0.0.1", u.port or 6379)
        proxied = _with_port(s.redis_url, await self.proxy.start())
        self.svc_settings = msgspec.structs.replace(s, redis_url=proxied)
        client = await Client(settings=self.svc_settings, actor="chaos").connect()
        await client.register(registry)
        try:
            self._spawn("reconciler")
            self._spawn("trigger")
            for i in range(self.workers):
                self._spawn(f"worker{i}")
            warm = await self._probe(client, db, 60)
            if warm is None:
                self.errors.append("the system did not run a job within 60 s of starting")
            stop = asyncio.Event()
            load = asyncio.create_task(self._load(client, stop))
            t_end = time.monotonic() + self.duration_s
            kinds = self._kinds()
            while time.monotonic() < t_end:
                await asyncio.sleep(self.rng.uniform(0.5, 2.0))
                kind = self.rng.choice(kinds)
                self.faults[kind] = self.faults.get(kind, 0) + 1
                self.progress(f"{time.monotonic() - t_end + self.duration_s:6.1f}s fault {kind} "
                              f"(acked {len(self.acked)})")
                try:
                    await self._fault(kind, db)
                except Exception as exc:  # a fault that could not be injected is reported, not fatal
                    self.errors.append(f"fault {kind} failed: {exc!r}")
                self.recoveries.append(Recovery(kind, await self._probe(client, db, 90)))
            stop.set()
            await load
            self.progress(f"load stopped; {len(self.acked)} acknowledged; draining")
            lost = await self._drain(db, 120)
            report = await self._check(db, lost)
        finally:
            self._stop_all()
            await client.close()
            await self.proxy.close()
            with contextlib.suppress(Exception):
                await db.execute("chaos_forget", self.soak_id)
                await db.execute("chaos_forget_fence", self.soak_id)
            await db.close()
        report.errors = self.errors
        report.failed = _failed(report)
        return report

    async def _drain(self, db: Database, limit_s: float) -> int:
        """Bounded wait until every acknowledged run SUCCEEDED; returns how many did not."""
        deadline = time.monotonic() + limit_s
        ids = sorted(set(self.acked))
        while True:
            done = {r["id"] for r in await db.fetch("chaos_run_status", ids) if r["status"] == "SUCCEEDED"}
            left = len(ids) - len(done)
            if left == 0 or time.monotonic() > deadline:
                return left
            await asyncio.sleep(0.25)

    async def _check(self, db: Database, lost: int) -> ChaosReport:
        """The invariants; the recorder may still be writing history, so wait (bounded) for it."""
        deadline = time.monotonic() + 30
        while True:
            c = await db.fetchrow("chaos_checks", self.soak_id, self.queue)
            assert c is not None
            if (c["untraced"] == 0 and c["incomplete"] == 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        by_kind: dict[str, list[float | None]] = {}
        for r in self.recoveries:
            by_kind.setdefault(r.kind, []).append(r.seconds)
        recovery = {}
        for k, vals in sorted(by_kind.items()):
            ok = [v for v in vals if v is not None]
            recovery[k] = {"n": float(len(vals)), "median": round(statistics.median(ok), 3) if ok else None,
                           "max": max(ok) if ok else None}
        return ChaosReport(
            seed=self.seed, duration_s=self.duration_s, queue=self.queue, acked=len(set(self.acked)),
            failed_submits=self.failed_submits, lost=lost, executions=c["executions"],
            runs_repeated=c["runs_repeated"], untraced=c["untraced"], reused=c["reused"], beyond=c["beyond"],
            stale_accepted=c["stale_accepted"], refused=c["refused"], token_order=c["token_order"],
            unknown_attempts=c["unknown_attempts"], incomplete=c["incomplete"], faults=dict(sorted(self.faults.items())),
            recovery_s=recovery, unrecovered=sum(1 for r in self.recoveries if r.seconds is None), errors=[],
            failed=[])


def _failed(r: ChaosReport) -> list[str]:
    checks = {"acknowledged submits lost": r.lost, "executions without an attempt row": r.untraced,
              "attempt numbers reused": r.reused, "runs with more executions than attempt rows": r.beyond,
              "stale-token effects accepted downstream": r.stale_accepted,
              "attempt tokens out of order": r.token_order, "runs with incomplete history": r.incomplete,
              "faults not recovered from": r.unrecovered, "harness errors": len(r.errors)}
    return [f"{name}: {n}" for name, n in checks.items() if n]


async def soak(settings: Settings, *, seed: int, duration_s: float, workers: int = 2, concurrency: int = 20,
               rate: float = 20.0, replica_url: str | None = None, allow_flushall: bool = False,
               log_dir: str | None = None, progress: Callable[[str], None] | None = None) -> ChaosReport:
    """Run one seeded soak (see the module doc); the report says what failed, if anything."""
    return await _Soak(settings, seed=seed, duration_s=duration_s, workers=workers, concurrency=concurrency,
                       rate=rate, replica_url=replica_url, allow_flushall=allow_flushall, log_dir=log_dir,
                       progress=progress or (lambda line: None)).run()


def format_chaos(r: ChaosReport) -> list[str]:
    lines = [
        f"loadtest chaos: seed {r.seed}, {r.duration_s:g}s, queue {r.queue}",
        f"  faults                        {', '.join(f'{k} {n}' for k, n in r.faults.items()) or 'none'}",
        f"  acknowledged submits          {r.acked} ({r.failed_submits} submits refused, not acknowledged)",
        f"  acknowledged submits lost     {r.lost}",
        f"  executions (effects)          {r.executions} over {r.acked} runs; {r.runs_repeated} runs ran more than once",
        f"  effects beyond attempt rows   {r.beyond} runs",
        f"  executions without attempt    {r.untraced}",
        f"  attempt numbers reused        {r.reused}",
        f"  unknown attempts (redis_lost) {r.unknown_attempts}",
        f"  stale-token effects accepted  {r.stale_accepted} ({r.refused} refused by the fence)",
        f"  attempt tokens out of order   {r.token_order}",
        f"  runs with incomplete history  {r.incomplete}",
        "  time to recover (s)           fault: n, median, max",
    ]
    for k, v in r.recovery_s.items():
        lines.append(f"    {k:<28}{int(v['n'] or 0):>4}  {v['median']}  {v['max']}")
    if r.unrecovered:
        lines.append(f"  faults not recovered from     {r.unrecovered}")
    lines += [f"  error: {e}" for e in r.errors]
    lines.append("  FAILED: " + "; ".join(r.failed) if r.failed else "  all invariants held")
    return lines
