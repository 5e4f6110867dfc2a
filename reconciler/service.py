"""`fencepost reconciler`: the recorder plus the maintenance loops, each a small component
with one job, run as its own asyncio task (reconciler/loops.py):

    loop        interval                                what
    rebuild     tick (1 s)                              stamps: rebuild every untrusted queue
    reaper      tick (1 s)                              expired leases back to PENDING (reap_expired.lua)
    outbox      tick (1 s), or at once on a NOTIFY      runs committed in a producer's transaction -> Redis
    drift       tick (1 s)                              one incremental drift-repair step per queue of this
                                                        reconciler's share (shares.py; the recorder reads that share too)
    shares      0.5 s                                   says this reconciler is alive, reads who else is (shares.py)
    refill      tick (1 s)                              free concurrency slots -> held runs
    gauges      5 s                                     fleet gauges and the stuck-run detector
    scale_hint  FENCEPOST_SCALE_EVERY_S (30 s)          fencepost_scale_hint_workers
    partitions  1 h                                     history partitions of this month and the next two
    archive     1 h; the next tick while batches are full   old finished runs -> runs_archive
    idempotency 1 h; the next tick while batches are full   idempotency keys past FENCEPOST_IDEMPOTENCY_WINDOW
    rollup      1 h; the next tick while batches are full   chart rollup minutes past FENCEPOST_CHART_RETENTION

A failed pass (Redis or PostgreSQL unreachable, one bad queue) is logged and counted in
`fencepost_maintenance_runs_total{loop,outcome}`, and the loop tries again after its
interval, so the service recovers by itself after either store restarts and a slow pass of
one loop never delays another. The rebuild of an untrusted queue still comes before drift
repair, refill or the reaper touch it (loops.QueueGate).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

from fencepost.core import fairness
from fencepost.core.config import Settings
from fencepost.core.errors import StoreUnavailable
from fencepost.core.hot import ReapArgs
from fencepost.core.metrics import LEASE_EXPIRIES
from fencepost.core.stores import Stores
from fencepost.reconciler.drift import DriftRepair
from fencepost.reconciler.gauges import Gauges
from fencepost.reconciler.loops import Loop, QueueGate, each_queue, run_loops
from fencepost.reconciler.outbox import OutboxRelay
from fencepost.reconciler.rebuild import rebuild_queue, untrusted_queues
from fencepost.reconciler.recorder import Recorder
from fencepost.reconciler.retention import Maintenance, parse_archive_after, parse_chart_retention, parse_duration
from fencepost.reconciler.scalehint import ScaleHints
from fencepost.reconciler.shares import Shares

log = logging.getLogger("fencepost.reconciler")

FIRST_CHECK_WAIT_S = 5.0
"""The reaper's first pass waits this long at most for the first trust check (not for rebuilds)."""
GAUGES_EVERY_S = 5.0
"""The gauges query PostgreSQL."""


class Reconciler:
    def __init__(self, settings: Settings | None = None, *, tick_s: float = 1.0, drift_grace_s: float = 5.0,
                 stop_grace_s: float = 10.0) -> None:
        self.stores = Stores(settings, db_pool_size=4)
        self.shares = Shares(self.stores, enabled=False)
        """This reconciler's share of the queues among the live ones (streams read, drift ticked)."""
        self.recorder = Recorder(self.stores, shares=self.shares)
        self.outbox = OutboxRelay(self.stores)
        self.drift = DriftRepair(self.stores, grace_s=drift_grace_s)
        self.gauges = Gauges(self.stores)
        self.scale_hints = ScaleHints(self.stores)
        self.history = Maintenance(self.stores.db,
                                   archive_after=parse_archive_after(self.stores.settings.archive_after),
                                   chart_retention=parse_chart_retention(self.stores.settings.chart_retention))
        self.idempotency_window = parse_duration(self.stores.settings.idempotency_window,
                                                 what="FENCEPOST_IDEMPOTENCY_WINDOW")
        """Idempotency keys older than this are pruned (the `idempotency` loop, at the archive interval)."""
        self.tick_s = min(tick_s, 1.0)
        self.stop_grace_s = stop_grace_s
        """After stop, passes in flight get this long to finish before they are cancelled."""
        self.stop = asyncio.Event()
        self.gate = QueueGate()
        self.rebuilt: list[tuple[float, str]] = []
        """(time.time(), queue) of every rebuild this process did."""
        loops = [
            Loop("rebuild", self._rebuild, self.tick_s),
            Loop("reaper", self._reap_all, self.tick_s),
            Loop("outbox", self._relay, self.tick_s, wakeup=self.outbox.wakeup),
            Loop("drift", self._drift, self.tick_s),
            Loop("shares", self._shares, self.shares.refresh_s),
            Loop("refill", self._refill, self.tick_s),
            Loop("gauges", self._observe, GAUGES_EVERY_S),
            Loop("scale_hint", self._scale_hint, self.scale_hints.every_s),
            Loop("partitions", self._partitions, self.history.every_s),
            Loop("idempotency", self._prune_keys, self.history.every_s),
            Loop("rollup", self._prune_rollup, self.history.every_s),
        ]
        if self.history.archive_after is not None:
            loops.append(Loop("archive", self._archive, self.history.every_s))
        self.loops = {loop.name: loop for loop in loops}
        """By name, in dependency order (maintain_once runs them in it); intervals may be tuned before run()."""

    async def maintain_once(self) -> None:
        """One pass of every loop, in order (rebuilds first): for tests and one-shot use."""
        for loop in self.loops.values():
            await loop.once()

    # -- the loops' steps ------------------------------------------------------------------------
    async def _rebuild(self) -> None:
        try:
            untrusted = await untrusted_queues(self.stores)
        except Exception:
            self.gate.unknown()  # drift and refill wait for a check that succeeds
            raise
        self.gate.publish(untrusted)
        await each_queue("rebuild", untrusted, self._rebuild_queue)

    async def _rebuild_queue(self, queue: str) -> None:
        async with self.gate.rebuilding(queue):
            stats = await rebuild_queue(self.stores, queue)
            if not stats.get("skipped"):  # skipped: another reconciler holds it, still untrusted
                self.rebuilt.append((time.time(), queue))
                self.gate.trust(queue)

    async def _reap_all(self) -> None:
        if not self.gate.checked.is_set():  # at start-up, after a failover: the rebuild interrupts those leases
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.gate.checked.wait(), FIRST_CHECK_WAIT_S)
        queues = await self.recorder.queues()
        await each_queue("reap", [q for q in queues if not self.gate.suspect(q)], self._reap)

    async def _reap(self, queue: str) -> None:
        # leases expire on the Redis server's clock (reap_expired reads it), never on this host's
        n = await self.stores.scripts.reap_expired(self.stores.keys(queue),
                                                   ReapArgs(1000, self.stores.settings.max_interruptions))
        if n:
            LEASE_EXPIRIES.labels(queue).inc(n)

    async def _relay(self) -> None:
        if not self.outbox.listening():
            await self.outbox.listen()
        await self.outbox.relay()

    async def _shares(self) -> None:
        await self.shares.refresh(force=True)

    async def _drift(self) -> None:
        await self.shares.refresh()
        queues = self.shares.mine(await self.recorder.queues())
        # A fresh check each pass, as before the split: a queue another reconciler is
        # rebuilding (its stamp deleted) is left to that rebuild.
        untrusted = set(await untrusted_queues(self.stores))

        async def one(queue: str) -> None:
            if queue in untrusted:
                return
            async with self.gate.using(queue) as ok:
                if ok:
                    await self.drift.tick(queue)

        await each_queue("drift", queues, one)

    async def _refill(self) -> None:
        async def one(queue: str) -> None:
            async with self.gate.using(queue) as ok:
                if ok:
                    await fairness.refill_held(self.stores, queue)

        await each_queue("refill", await self.recorder.queues(), one)

    async def _observe(self) -> None:
        """Fleet gauges and the stuck-run detector (they query PostgreSQL)."""
        await self.gauges.observe(await self.recorder.queues())

    async def _scale_hint(self) -> None:
        await self.scale_hints.observe(await self.recorder.queues(), force=True)

    async def _partitions(self) -> None:
        await self.history.partitions()

    async def _prune_keys(self, batch: int = 10_000) -> float | None:
        """Forget idempotency keys older than FENCEPOST_IDEMPOTENCY_WINDOW, a bounded batch a pass."""
        status = await self.stores.db.execute("idempotency_prune", self.idempotency_window.total_seconds(), batch)
        return self.tick_s if status.endswith(f" {batch}") else None

    async def _prune_rollup(self) -> float | None:
        pruned = await self.history.prune_rollup()
        return self.tick_s if pruned == self.history.rollup_batch else None  # a backlog: the next batch at the next tick

    async def _archive(self) -> float | None:
        moved = await self.history.archive()
        return self.tick_s if moved == self.history.batch else None  # a backlog: the next batch at the next tick

    # -- the service -----------------------------------------------------------------------------
    async def _connect(self) -> None:
        """Connect with backoff: a reconciler started while a store is down waits for it."""
        delay = 0.2
        while True:
            try:
                await self.stores.connect()
                return
            except StoreUnavailable as exc:
                if self.stop.is_set():
                    raise
                log.warning("stores unavailable, retrying in %.1fs: %s", delay, exc,
                            extra={"event": "connect_retry"})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        await self._connect()
        await self.stores.check_redis()
        try:
            await self.outbox.listen()
        except Exception as exc:
            log.warning("outbox_listen failed: %s", exc, extra={"event": "outbox_listen_failed"})
        self.shares.enabled = True  # the service splits the queues with the other live reconcilers
        await self.shares.refresh(force=True)
        log.info("reconciler started", extra={"event": "reconciler_started"})
        recorder = asyncio.create_task(self.recorder.run(self.stop), name="fencepost-recorder")
        loops = asyncio.create_task(run_loops(self.loops.values(), self.stop, grace_s=self.stop_grace_s),
                                    name="fencepost-maintenance")
        try:
            await asyncio.wait([recorder, loops], return_when=asyncio.FIRST_EXCEPTION)
        finally:
            self.stop.set()  # the recorder finishes its batch; loops get stop_grace_s, then are cancelled
            await asyncio.gather(recorder, loops, return_exceptions=True)
            await self.shares.leave()
            await self.outbox.close()
            await self.stores.close()
        for task in (recorder, loops):
            failure = None if task.cancelled() else task.exception()
            if failure is not None:
                raise failure
