"""`fencepost trigger`: turns schedules into runs.

One leader at a time holds a lease row in PostgreSQL (`trigger_leases`), but correctness
never depends on it: every fire is a run with UNIQUE (schedule_id, fire_time), inserted
with ON CONFLICT DO NOTHING, so two leaders briefly at once create each run once. Due
schedules are read with FOR UPDATE SKIP LOCKED from the partial index on due_at, so a
tick costs work proportional to the fires due; fires are inserted in batches (one
`insert_runs` round trip per batch) with outbox=true, in the same transaction that
advances next_fire_time, and moved to Redis right after commit (the outbox relay of the
reconciler does it if this process dies in between). A new leader simply resumes from
each schedule's next_fire_time.

Missed fires (trigger down, schedule paused): coalesced into one run at the latest
missed fire time by default; with catchup=true every missed fire within
catchup_window_s is backfilled (at most `max_catchup` per schedule per pass; the rest
follow on the next pass). Overlap: unless allow_overlap, a fire whose schedule's
previous run is still active (PENDING, RETRY_WAIT, RUNNING, STOPPING, PAUSED) is skipped
and recorded as a 'fire_skipped' event (run_id NULL, queue set).

Fire times are decided on PostgreSQL's clock (`now()`, read once per batch in its transaction, and
for the leader lease), never on this host's: a trigger whose host clock is minutes off neither fires
early (overlap and catch-up decided minutes ahead) nor late (docs/clock.md). The clock is injectable
(`ManualClock` in tests): nothing here sleeps to decide a fire.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import socket
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import asyncpg
import msgspec
from prometheus_client import Counter, Gauge

from fencepost.core import metrics
from fencepost.core.models import RunRow
from fencepost.core.release import sweep_blocked
from fencepost.core.schedules import fires_between, next_fire_after
from fencepost.core.stores import Stores
from fencepost.core.submit import SubmitPath, fire_row

__all__ = ["LEASE_NAME", "Clock", "ManualClock", "SystemClock", "TickResult", "Trigger"]

log = logging.getLogger("fencepost.trigger")
_UTC = UTC
LEASE_NAME = "trigger"


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    """This host's clock: for display and tests only; a Trigger without a clock uses PostgreSQL's."""

    def now(self) -> datetime:
        return datetime.now(_UTC)


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start: datetime) -> None:
        self._t = start

    def now(self) -> datetime:
        return self._t

    def advance(self, seconds: float) -> datetime:
        self._t += timedelta(seconds=seconds)
        return self._t

    def set(self, t: datetime) -> None:
        self._t = t


@dataclass
class _Batch:
    """What one fire_batch collects over its schedules (index i: the schedule's row in the batch)."""

    runs: list[RunRow] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)
    """The schedule index of each run to insert."""
    skip_ev: list[list[Any]] = field(default_factory=lambda: [[], [], [], []])
    """trigger_skip_events' columns: queue, type, reason, payload (JSON)."""
    skipped: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))
    nexts: list[datetime] = field(default_factory=list)
    last_run: dict[int, int] = field(default_factory=dict)
    last_fire: dict[int, datetime | None] = field(default_factory=dict)
    created_rows: list[int] = field(default_factory=list)
    new_queues: dict[str, int] = field(default_factory=dict)

    def skip(self, queue: str, type_: str, reason: str, payload: dict[str, Any]) -> None:
        for column, v in zip(self.skip_ev, (queue, type_, reason, json.dumps(payload)), strict=True):
            column.append(v)

    def advance(self, rows: list[Any]) -> list[list[Any]]:
        """trigger_advance's columns: id, the next fire time read, the new one, last fire, last run, fired,
        skipped (ROWS: the batch's trigger_due rows)."""
        fired: dict[int, int] = defaultdict(int)
        for k in self.created_rows:
            fired[self.owner[k]] += 1
        adv: list[list[Any]] = [[] for _ in range(7)]
        for i, s in enumerate(rows):
            for c, v in zip(adv, (s.id, s.next_fire_time, self.nexts[i], self.last_fire.get(i),
                                  self.last_run.get(i), fired[i], self.skipped[i]), strict=True):
                c.append(v)
        return adv


@dataclass
class TickResult:
    created: int = 0
    duplicates: int = 0
    skipped: int = 0
    coalesced: int = 0
    schedules: int = 0
    run_ids: list[int] = field(default_factory=list)

    def __iadd__(self, o: TickResult) -> TickResult:
        self.created += o.created
        self.duplicates += o.duplicates
        self.skipped += o.skipped
        self.coalesced += o.coalesced
        self.schedules += o.schedules
        self.run_ids += o.run_ids
        return self


def _latest_fire(nft: datetime, limit: datetime, cron: str | None, iv: float | None, tz: str) -> tuple[datetime, int | None]:
    """The latest fire time <= limit (nft <= limit), and how many fires nft..limit hold
    (None when it would take too long to count: more than a day of a cron line)."""
    if iv is not None:
        step = timedelta(seconds=iv)
        k = math.floor((limit - nft) / step)
        return nft + k * step, k + 1
    t, count = nft, 1
    if limit - nft > timedelta(days=2):
        t0 = next_fire_after(limit - timedelta(days=1), cron=cron, interval_s=None, tz=tz)
        if t0 <= limit:
            t, count = t0, None  # type: ignore[assignment]
    while True:
        n = next_fire_after(t, cron=cron, interval_s=None, tz=tz)
        if n > limit:
            return t, count
        t = n
        if count is not None:
            count += 1


def plan_fires(s: Any, now: datetime, lookahead: timedelta, max_catchup: int
               ) -> tuple[list[datetime], datetime, int | None]:
    """(fire times to create, the next fire time after them, fires coalesced away) of S, a trigger_due row."""
    cron, iv, tz, nft = s.cron, s.interval_s, s.timezone, s.next_fire_time
    limit = now + lookahead - timedelta(milliseconds=s.offset_ms)
    if nft > limit:
        return [], nft, 0

    def nxt(t: datetime) -> datetime:
        return next_fire_after(t, cron=cron, interval_s=iv, tz=tz, anchor=nft)

    if s.catchup:
        oldest = now - timedelta(seconds=s.catchup_window_s or 86400)
        start = nft
        if start < oldest:  # fires older than the window are not backfilled
            start = nxt(oldest - timedelta(microseconds=1))
            if start > limit:  # nothing inside the window: still run the latest one (never less than coalesce)
                latest, _ = _latest_fire(nft, limit, cron, iv, tz)
                return [latest], nxt(latest), None
        fires = list(fires_between(start, limit, cron=cron, interval_s=iv, tz=tz, limit=max_catchup))
        return fires, nxt(fires[-1]), 0
    latest, count = _latest_fire(nft, limit, cron, iv, tz)
    return [latest], nxt(latest), (None if count is None else count - 1)


POISON = (ValueError, ArithmeticError, TypeError, KeyError, IndexError, msgspec.ValidationError,
          asyncpg.DataError, asyncpg.IntegrityConstraintViolationError)
"""Errors that say a schedule's own data cannot be fired (not a store being down): the schedule
is quarantined and the other schedules fire on."""


def _fire_row(s: Any, queue: str, f: datetime, offset: timedelta) -> RunRow:
    """One fire as a run (core.submit.fire_row: its values checked as run-now's are)."""
    return fire_row(schedule_id=s.id, handler=s.handler, queue=queue, payload=s.payload,
                    priority=s.priority, max_retries=s.max_retries, timeout_s=s.timeout_s, fire_time=f,
                    run_at=f + offset)


FIRES = Counter("fencepost_trigger_fires_total", "Schedule fires handled by the trigger, by outcome", ["outcome"])
LEADER = Gauge("fencepost_trigger_leader", "1 while this trigger process holds the leader lease")


class Trigger:
    def __init__(self, stores: Stores, *, clock: Clock | None = None, holder: str | None = None,
                 lease_s: float = 10.0, batch: int = 1000, lookahead_s: float = 0.5, tick_s: float = 0.25,
                 use_lease: bool = True, max_catchup: int = 1000, sweep_every_s: float = 10.0,
                 max_batches_per_tick: int = 50) -> None:
        self.stores = stores
        self.path = SubmitPath(stores, actor="trigger")
        """Fires are inserted and enqueued by the one submit path (core/submit.py)."""
        self.clock: Clock | None = clock
        """None: PostgreSQL's clock decides (a host's clock is for display only, DESIGN invariant 11)."""
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lease_s = lease_s
        self.batch = batch
        self.lookahead = timedelta(seconds=lookahead_s)
        self.tick_s = tick_s
        self.use_lease = use_lease
        self.max_catchup = max_catchup
        self.sweep_every_s = sweep_every_s
        self.max_batches_per_tick = max_batches_per_tick
        self.lease_token: int | None = None
        self.quarantined: list[str] = []
        """Names of the schedules this process quarantined."""
        self._reading: list[int] = []
        self.total = TickResult()
        self.stop = asyncio.Event()

    # -- leadership ------------------------------------------------------------------------------
    async def acquire(self) -> bool:
        """Take or renew the lease; False while another live holder has it."""
        row = await self.stores.db.row("lease_acquire", LEASE_NAME, self.holder,
                                       self.clock.now() if self.clock is not None else None,
                                       float(self.lease_s))
        was = self.lease_token
        self.lease_token = row.token if row is not None else None
        if self.lease_token is not None and was is None:
            log.info("trigger leader (lease token %s)", self.lease_token, extra={"event": "trigger_leader"})
        return self.lease_token is not None

    async def release(self) -> None:
        await self.stores.db.execute("lease_release", LEASE_NAME, self.holder)
        self.lease_token = None

    # -- firing ----------------------------------------------------------------------------------
    async def tick(self) -> TickResult:
        """Fire everything due now, in batches (bounded per call)."""
        out = TickResult()
        for _ in range(self.max_batches_per_tick):
            try:
                r = await self.fire_batch()
            except POISON as exc:  # one schedule's data broke the batch: find it, fire the others
                log.warning("trigger batch failed (%s); firing schedules one at a time", exc,
                            extra={"event": "trigger_batch_isolated"})
                r = await self._isolate()
            out += r
            if r.schedules < self.batch:
                break
        self.total += out
        for kind, n in (("created", out.created), ("duplicate", out.duplicates), ("skipped", out.skipped),
                        ("coalesced", out.coalesced)):
            if n:
                FIRES.labels(kind).inc(n)
        LEADER.set(1 if self.lease_token is not None or not self.use_lease else 0)
        return out

    async def _isolate(self) -> TickResult:
        """Fire the due schedules one per transaction, quarantining each one that fails by its own data."""
        out = TickResult()
        for _ in range(self.batch):
            try:
                r = await self.fire_batch(limit=1)
            except POISON as exc:
                if not self._reading:
                    raise
                await self._quarantine(self._reading[0], None, exc)
                continue
            out += r
            if not r.schedules:
                break
        return out

    async def _quarantine(self, schedule_id: int, queue: str | None, exc: BaseException, conn: Any = None) -> None:
        """Pause a schedule that cannot be fired, with the reason, an event, a metric and a log line."""
        why = f"{type(exc).__name__}: {exc}"[:1000]
        db = conn if conn is not None else self.stores.db
        name = await db.fetchval("quarantine_schedule", schedule_id, why, queue or "default")
        metrics.QUARANTINED.labels("trigger", "schedule").inc()
        self.quarantined.append(name or str(schedule_id))
        log.error("schedule %s quarantined (paused): %s; the other schedules fire on. Fix it and add it again "
                  "(docs/runbooks/FencepostQuarantined.md)", name or schedule_id, why,
                  extra={"event": "schedule_quarantined", "queue": queue})

    async def fire_batch(self, limit: int | None = None) -> TickResult:
        """One batch of due schedules in one transaction: plan each one's fires (a bad schedule is
        quarantined alone), insert the runs, advance the schedules and write the skip events; then
        deliver the runs made to Redis."""
        res = TickResult()
        self._reading = []
        async with self.stores.db.transaction() as tx:
            # the fire times' clock: PostgreSQL's, once per batch (its transaction's now()), unless injected
            now: datetime = self.clock.now() if self.clock is not None else await tx.fetchval("db_now")
            rows = await tx.rows("trigger_due", now + self.lookahead, limit or self.batch)
            res.schedules = len(rows)
            self._reading = [s.id for s in rows]
            if not rows:
                return res
            batch = _Batch()
            for i, s in enumerate(rows):
                await self._plan(batch, i, s, now, res, tx)
            if batch.owner:
                await self._insert(batch, res, tx)
            await tx.execute("trigger_advance", *batch.advance(rows))
            if batch.skip_ev[0]:
                await tx.execute("trigger_skip_events", *batch.skip_ev)
        if batch.created_rows:
            await self._enqueue(batch.runs, res.run_ids, batch.created_rows, batch.new_queues)
        return res

    async def _plan(self, batch: _Batch, i: int, s: Any, now: datetime, res: TickResult, tx: Any) -> None:
        """Schedule S (row I of the batch): its fires up to now + lookahead as runs to insert, or as skip
        events (coalesced, unknown handler, overlapping its last run); a schedule that cannot be planned
        is quarantined and keeps its next fire time."""
        queue = s.queue or "default"
        try:
            fires, nxt, coalesced = plan_fires(s, now, self.lookahead, self.max_catchup)
            if fires and s.max_retries is not None:
                offset = timedelta(milliseconds=s.offset_ms)
                fire_rows = [_fire_row(s, queue, f, offset) for f in fires]
        except POISON as exc:  # this schedule only: paused with the reason, the batch goes on
            await self._quarantine(s.id, queue, exc, tx)
            batch.nexts.append(s.next_fire_time)
            return
        batch.nexts.append(nxt)
        if not fires:
            return
        if coalesced != 0:
            res.coalesced += coalesced or 1
            batch.skip(queue, "fires_coalesced", "missed",
                       {"schedule_id": s.id, "fire_time": fires[-1].isoformat(), "missed": coalesced})
        if s.max_retries is None:  # handler no longer declared anywhere
            batch.skip(queue, "fire_skipped", "unknown_handler",
                       {"schedule_id": s.id, "handler": s.handler, "fire_time": fires[-1].isoformat()})
            res.skipped += len(fires)
            batch.skipped[i] += len(fires)
            return
        if s.busy:
            batch.skip(queue, "fire_skipped", "overlap",
                       {"schedule_id": s.id, "blocking_run": s.last_run_id,
                        "fire_times": [f.isoformat() for f in fires[-10:]], "count": len(fires)})
            res.skipped += len(fires)
            batch.skipped[i] += len(fires)
            return
        batch.runs += fire_rows
        batch.owner += [i] * len(fire_rows)

    async def _insert(self, batch: _Batch, res: TickResult, tx: Any) -> None:
        """The batch's runs through the submit path; a fire another leader made already is not created
        (UNIQUE (schedule_id, fire_time)): its schedule points at that leader's run."""
        runs, owner = batch.runs, batch.owner
        got, batch.created_rows, batch.new_queues = await self.path.insert(None, runs, tx)
        ids: list[int | None] = list(got)
        missing = [k for k, v in enumerate(ids) if v is None]
        if missing:  # another leader made these fires: point at its runs
            found = {(r.schedule_id, r.fire_time): r.id for r in await tx.rows(
                "runs_by_fire", [runs[k].schedule_id for k in missing], [runs[k].fire_time for k in missing])}
            for k in missing:
                ids[k] = found.get((runs[k].schedule_id, runs[k].fire_time))
        for k, sidx in enumerate(owner):
            if ids[k] is not None:
                batch.last_run[sidx] = ids[k]  # type: ignore[assignment]
                batch.last_fire[sidx] = runs[k].fire_time
        res.created = len(batch.created_rows)
        res.duplicates = len(missing)
        res.run_ids = [ids[k] for k in batch.created_rows]  # type: ignore[misc]

    async def _enqueue(self, runs: list[RunRow], ids: list[int], created: list[int],
                       new_queues: dict[str, int]) -> None:
        """Fast path after commit (SubmitPath.deliver); if this fails or the process dies, the outbox
        relay does it."""
        try:
            by_row: list[int | None] = [None] * len(runs)
            for rid, k in zip(ids, created, strict=True):
                by_row[k] = rid
            await self.path.deliver(by_row, created, runs, new_queues)
        except Exception as exc:
            log.warning("enqueue after commit failed; the outbox relay will move the runs: %s", exc,
                        extra={"event": "trigger_enqueue_failed"})

    async def sweep(self) -> int:
        """Safety net for workflows: release or cancel BLOCKED runs whose upstreams settled in a
        way the recorder's hook did not see (e.g. a terminal state written by drift repair)."""

        async with self.stores.db.transaction() as tx:
            return await sweep_blocked(tx)

    # -- service ---------------------------------------------------------------------------------
    async def run(self) -> None:
        last_sweep = 0.0
        while not self.stop.is_set():
            busy = False
            try:
                if not self.use_lease or await self.acquire():
                    r = await self.tick()
                    busy = r.schedules >= self.batch * self.max_batches_per_tick
                    if r.created or r.skipped:
                        log.info("fired %d runs (%d skipped, %d coalesced, %d already made)", r.created,
                                 r.skipped, r.coalesced, r.duplicates, extra={"event": "trigger_fired"})
                    if time.monotonic() - last_sweep > self.sweep_every_s:
                        last_sweep = time.monotonic()
                        await self.sweep()
            except Exception as exc:
                log.warning("trigger tick failed: %s", exc, extra={"event": "trigger_tick_failed"})
                self.lease_token = None
            if not busy:
                try:
                    await asyncio.wait_for(self.stop.wait(), self.tick_s)
                except TimeoutError:
                    pass
        if self.use_lease and self.lease_token is not None:
            try:
                await self.release()
            except Exception:
                pass


async def serve(settings: Any, **opts: Any) -> None:
    """The `fencepost trigger` process."""
    stores = Stores(settings, db_pool_size=3)
    await stores.connect()
    trig = Trigger(stores, **opts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, trig.stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    log.info("trigger started as %s", trig.holder, extra={"event": "trigger_started"})
    try:
        await trig.run()
    finally:
        await stores.close()
