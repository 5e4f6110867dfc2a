"""Load harness (`fencepost loadtest spike | burst`): handlers, setup, measurement, report."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fencepost.client import Client
from fencepost.core import hotreads
from fencepost.core.config import Settings
from fencepost.core.models import Submit, encode_payload
from fencepost.core.record import Database, Session
from fencepost.core.registry import Registry
from fencepost.core.schedules import spread_offset_ms
from fencepost.core.states import TERMINAL

if TYPE_CHECKING:
    from fencepost.worker.context import Context

registry = Registry()


@registry.job("loadtest.noop", queue="loadtest", max_retries=0, timeout=60)
async def noop(ctx: Context) -> None:
    return None


@registry.job("loadtest.fire_time", queue="loadtest", max_retries=0, timeout=60)
async def fire_time(ctx: Context) -> int | None:
    """Returns the logical fire time it was given (ms since the epoch)."""
    return ctx.fire_time


# -- the harness -------------------------------------------------------------------------------
_UTC = UTC
_TABLES = ("runs", "events", "attempts")
_DONE = tuple(sorted(s.value for s in TERMINAL))


class Harness:
    """Drives real processes (trigger, reconciler, N workers) against the configured stores."""

    def __init__(self, settings: Settings, *, workers: int, concurrency: int = 200, timeout_s: float = 900,
                 progress: Callable[[str, bool], None] | None = None, log_dir: str | None = None,
                 keep: bool = False) -> None:
        self.settings = settings
        self.keep = keep
        """Leave the synthetic queue's runs and history in the stores (default: removed after the report)."""
        self.workers = workers
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.queue = f"lt{uuid.uuid4().hex[:8]}"
        self.progress = progress or (lambda line, final: None)
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.log_dir = Path(log_dir) if log_dir else None
        self.samples: list[tuple[float, int, int]] = []  # (t, redis used_memory, pending in redis)

    # -- processes --------------------------------------------------------------------------------
    def spawn(self, name: str, *args: str) -> None:
        root = Path(__file__).resolve().parent.parent
        env = dict(os.environ, FENCEPOST_REDIS_URL=self.settings.redis_url,
                   FENCEPOST_DATABASE_URL=self.settings.database_url, FENCEPOST_PREFIX=self.settings.prefix,
                   FENCEPOST_LOG_FORMAT="json",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
        out: Any = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{name}.log", "ab")
        p = subprocess.Popen([sys.executable, "-m", "fencepost.cli", *args], env=env, stdout=out, stderr=out,
                             start_new_session=True)
        self.procs.append((name, p))

    def start_services(self, *, trigger: bool, trigger_args: tuple[str, ...] = ()) -> None:
        self.spawn("reconciler", "reconciler")
        for i in range(self.workers):
            self.spawn(f"worker{i}", "worker", "--app", "fencepost.dev.loadtest:registry", "--queue", self.queue,
                       "--processes", "1", "--concurrency", str(self.concurrency))
        if trigger:
            self.spawn("trigger", "trigger", *trigger_args)

    def stop_services(self) -> list[str]:
        errors = []
        for name, p in self.procs:
            if p.poll() is not None:
                errors.append(f"{name} exited early with code {p.returncode}")
            else:
                p.send_signal(signal.SIGTERM)
        for _name, p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return errors

    async def cleanup(self, stores: Any) -> int:
        """Remove the test's dedicated queue (its runs, attempts, checkpoints and Redis keys) so it
        never shows up in `fencepost ls`; its events stay in the append-only history until retention
        drops them. Returns the runs removed. Skipped with --keep."""
        if self.keep:
            return 0
        row = await stores.db.row("loadtest_cleanup", self.queue)
        await hotreads.drop_queue(stores.redis, stores.queues_key, stores.keys(self.queue))
        return int(row.runs) if row is not None else 0

    # -- measuring --------------------------------------------------------------------------------
    async def sizes(self, conn: Session) -> int:
        return int(await conn.fetchval("loadtest_relation_size", list(_TABLES)))

    async def redis_memory(self, stores: Any) -> int:
        return await hotreads.used_memory(stores.redis)

    async def pending_in_redis(self, stores: Any) -> int:
        return (await hotreads.queue_depth(stores.redis, stores.keys(self.queue))).total

    async def watch(self, stores: Any, conn: Session, total: int, t0: float, label: str) -> tuple[bool, dict[str, int]]:
        """Until every run is finished (or the timeout): a live progress line, memory samples."""
        counts: dict[str, int] = {}
        last_line = 0.0
        while True:
            counts = {r.status: r.n for r in await conn.rows("loadtest_status_counts", self.queue)}
            created = sum(counts.values())
            done = sum(counts.get(s, 0) for s in _DONE)
            pending = await self.pending_in_redis(stores)
            self.samples.append((time.monotonic(), await self.redis_memory(stores), pending))
            now = time.monotonic()
            finished = done >= total
            if now - last_line >= 0.5 or finished:
                last_line = now
                width = 30
                fill = int(width * done / total) if total else width
                self.progress(f"{label} [{'#' * fill}{'.' * (width - fill)}] created {created}/{total}  "
                              f"done {done}  running {counts.get('RUNNING', 0)}  in redis {pending}  "
                              f"{now - t0:5.1f}s", finished)
            if finished:
                return True, counts
            if now - t0 > self.timeout_s or any(p.poll() is not None for _, p in self.procs):
                self.progress("stopped early: timeout or a process exited", True)
                return False, counts
            await asyncio.sleep(0.25)

    async def report(self, conn: Session, *, total: int, t_start: datetime, base_mem: int, base_pg: int,
                     creation_s: float | None = None) -> dict[str, Any]:
        """The figures; CREATION_S is the creation time the caller measured (a bulk submit: its
        commit timestamps are one transaction's, so their spread says nothing)."""
        q = self.queue
        r = await conn.row("loadtest_report", q)
        assert r is not None  # aggregates: always one row
        span = (r.c1 - r.c0).total_seconds() if r.runs > 1 else 0.0
        if creation_s is not None:
            span = creation_s
        peak = max(self.samples, key=lambda s: s[2]) if self.samples else (0, base_mem, 0)
        pg_after = await self.sizes(conn)
        lag = [round(float(x), 3) for x in (r.lag or [0, 0, 0])]
        lag_due = [round(float(x), 3) for x in (r.lag_due or [0, 0, 0])]
        return {
            "queue": q, "runs": r.runs, "expected": total, "succeeded": r.ok,
            "runs_created_per_s": round(r.runs / span, 1) if span > 0 else None,
            "creation_span_s": round(span, 3),
            "created_in_one_transaction": span <= 0 and r.runs > 1,
            "start_lag_s": {"p50": lag[0], "p95": lag[1], "p99": lag[2], "max": round(float(r.lag_max or 0), 3)},
            "start_lag_after_due_s": {"p50": lag_due[0], "p95": lag_due[1], "p99": lag_due[2],
                                      "max": round(float(r.lag_due_max or 0), 3)},
            "drain_s": round((r.last_done - t_start).total_seconds(), 3) if r.last_done else None,
            "redis_peak_pending": peak[2],
            "redis_bytes_per_pending_run": round((peak[1] - base_mem) / peak[2]) if peak[2] else None,
            "pg_bytes_per_run": round((pg_after - base_pg) / r.runs) if r.runs else None,
            "errors": [],
        }


async def _prepare(settings: Settings) -> Any:
    db = await Database(settings.database_url, max_size=1).connect()
    try:
        await db.upgrade()
    finally:
        await db.close()
    client = await Client(settings=settings, actor="loadtest").connect()
    await client.register(registry)
    return client


async def spike(settings: Settings, *, schedules: int, workers: int, spread_s: float, lead_s: float = 20.0,
                concurrency: int = 200, timeout_s: float = 900, lookahead_s: float = 0.5, batch: int = 2000,
                progress: Callable[[str, bool], None] | None = None, log_dir: str | None = None,
                keep: bool = False) -> dict[str, Any]:
    """`schedules` schedules firing in the same minute (once), with or without spread."""

    h = Harness(settings, workers=workers, concurrency=concurrency, timeout_s=timeout_s, progress=progress,
                log_dir=log_dir, keep=keep)
    client = await _prepare(settings)
    try:
        async with client.stores.db.session() as conn:
            base_pg = await h.sizes(conn)
            now = datetime.now(_UTC)
            fire = (now + timedelta(seconds=lead_s + 60)).replace(second=0, microsecond=0)
            if fire - now > timedelta(seconds=lead_s + 30):
                fire -= timedelta(minutes=1)
            cron = f"{fire.minute} {fire.hour} {fire.day} {fire.month} *"  # this minute only (then next year)

            payload = encode_payload((), {})
            t_setup = time.monotonic()
            made = 0
            while made < schedules:
                n = min(10_000, schedules - made)
                ids = [r.nextval for r in await conn.rows("loadtest_schedule_ids", n)]
                offs = [spread_offset_ms(i, spread_s) for i in ids]
                await conn.execute("loadtest_insert_schedules", ids, h.queue, payload, cron, fire,
                                   float(spread_s), offs)
                made += n
            setup_s = time.monotonic() - t_setup
            h.start_services(trigger=True, trigger_args=("--batch", str(batch), "--lookahead", str(lookahead_s)))
            base_mem = await h.redis_memory(client.stores)
            h.progress(f"{schedules} schedules created in {setup_s:.1f}s; all fire at {fire.isoformat()} "
                       f"(spread {spread_s:g}s); waiting {max(0.0, (fire - datetime.now(_UTC)).total_seconds()):.0f}s",
                       True)
            await asyncio.sleep(max(0.0, (fire - timedelta(seconds=lookahead_s + 1) - datetime.now(_UTC)).total_seconds()))
            ok, counts = await h.watch(client.stores, conn, schedules, time.monotonic(), "spike")
            await asyncio.sleep(1.0)  # let the recorder finish the last batch before sizing
            rep = await h.report(conn, total=schedules, t_start=fire, base_mem=base_mem, base_pg=base_pg)
            rep.update(mode="spike", schedules=schedules, workers=workers, spread_s=spread_s,
                       setup_s=round(setup_s, 2), fire_time=fire.isoformat(), completed=ok)
            await conn.execute("loadtest_delete_schedules", h.queue)
    finally:
        errors = h.stop_services()
        try:
            removed = await h.cleanup(client.stores)
        finally:
            await client.close()
    rep["errors"] = errors + ([] if rep["succeeded"] == schedules else
                              [f"{schedules - rep['succeeded']} runs did not succeed: {counts}"])
    rep.update(kept=keep, removed_runs=removed)
    return rep


async def burst(settings: Settings, *, jobs: int, workers: int, concurrency: int = 200, timeout_s: float = 900,
                progress: Callable[[str, bool], None] | None = None, log_dir: str | None = None,
                keep: bool = False) -> dict[str, Any]:
    """`jobs` one-shot runs submitted at once (bulk) while N workers drain them."""

    h = Harness(settings, workers=workers, concurrency=concurrency, timeout_s=timeout_s, progress=progress,
                log_dir=log_dir, keep=keep)
    client = await _prepare(settings)
    try:
        async with client.stores.db.session() as conn:
            base_pg = await h.sizes(conn)
            h.start_services(trigger=False)
            await asyncio.sleep(4.0)  # workers up before the burst (start-up is not measured)
            base_mem = await h.redis_memory(client.stores)
            t0 = datetime.now(_UTC)
            m0 = time.monotonic()
            reqs = [Submit(handler="loadtest.noop", queue=h.queue) for _ in range(jobs)]

            async def submit() -> float:
                await client.submit_many(reqs)
                return time.monotonic() - m0

            submit_task = asyncio.create_task(submit())
            ok, counts = await h.watch(client.stores, conn, jobs, m0, "burst")
            creation_s = await submit_task
            await asyncio.sleep(1.0)
            rep = await h.report(conn, total=jobs, t_start=t0, base_mem=base_mem, base_pg=base_pg,
                                 creation_s=creation_s)
            rep.update(mode="burst", jobs=jobs, workers=workers, completed=ok)
    finally:
        errors = h.stop_services()
        try:
            removed = await h.cleanup(client.stores)
        finally:
            await client.close()
    rep["errors"] = errors + ([] if rep["succeeded"] == jobs else
                              [f"{jobs - rep['succeeded']} runs did not succeed: {counts}"])
    rep.update(kept=keep, removed_runs=removed)
    return rep


def format_report(rep: dict[str, Any]) -> list[str]:
    lag, due = rep["start_lag_s"], rep["start_lag_after_due_s"]
    what = (f"{rep['schedules']} schedules, spread {rep['spread_s']:g}s" if rep["mode"] == "spike"
            else f"{rep['jobs']} jobs")
    return [
        f"loadtest {rep['mode']}: {what}, {rep['workers']} worker processes",
        f"  runs created      {rep['runs']} " + (
            "(all in one transaction)" if rep.get("created_in_one_transaction") or not rep["runs_created_per_s"]
            else f"({rep['runs_created_per_s']} /s over {rep['creation_span_s']}s)"),
        f"  start lag         p50 {lag['p50']}s  p95 {lag['p95']}s  p99 {lag['p99']}s  max {lag['max']}s"
        + ("  (started_at - fire_time)" if rep["mode"] == "spike" else "  (started_at - submit)"),
        f"  lag after due     p50 {due['p50']}s  p95 {due['p95']}s  p99 {due['p99']}s  max {due['max']}s"
        "  (started_at - run_at: without the spread)",
        f"  drain             {rep['drain_s']}s (last finish - first fire/submit)",
        "  redis             " + (
            f"{rep['redis_bytes_per_pending_run']} bytes per pending run (at peak: {rep['redis_peak_pending']} runs "
            "in Redis)" if rep["redis_bytes_per_pending_run"] is not None
            else "n/a (drained between two samples: no run was seen waiting in Redis)"),
        f"  postgresql        {rep['pg_bytes_per_run']} bytes per run (runs + events + attempts, with indexes)",
        f"  errors            {'; '.join(rep['errors']) if rep['errors'] else 'none'}",
        f"  queue             {rep['queue']}: " + (
            "kept (--keep): its runs stay in `fencepost ls --queue " + rep["queue"] + "`" if rep.get("kept")
            else f"removed with its {rep.get('removed_runs', 0)} runs (their events stay in the history)"),
    ]
