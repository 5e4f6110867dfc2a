"""Epoch stamps and the rebuild of a queue's hot state from PostgreSQL.

A queue whose Redis keys carry no stamp (a new empty server, a FLUSHALL, a restart
without persistence), or a stamp written on another server process (a restart with
persistence, a promoted replica), is not trusted: claims refuse it until it was rebuilt
here. The epoch is bumped in PostgreSQL first, so every token issued afterwards is above
every token issued before, whatever counter value the dataset holds.

The rebuild, streamed in keyset pages (bounded memory):
  1. PostgreSQL's active runs: missing hashes are restored (RUNNING ones become interrupted
     attempts and are re-queued), hashes behind PostgreSQL are replaced from it, and runs
     the dataset holds as leased are interrupted (no pre-failover token survives).
  2. Redis's due / delayed / active members: anything PostgreSQL has as terminal (a replica
     that missed the finish) leaves the sets, so a completed run is never claimed again;
     members without a hash or a row are dropped.
  3. The queue-level pause (queues.paused) is restored, then the queue is stamped.
When the dataset holds none of the queue's sorted sets (it forgot everything), nothing in
it can be stale, so the stamp is written after the first page and workers claim while the
remaining pages are restored.

Failover-exact executions: the lost (or untrusted) dataset may have claimed and run any run
PostgreSQL still has waiting, and its claim event may be gone with it. So before such a run
can be claimed again, it gets an attempt with outcome `unknown` (error_class RedisLost, an
`attempt_unknown` event) numbered above PostgreSQL's attempt and the dataset's: attempt
numbers are never reused, the attempts table never undercounts executions (it may count an
execution that never happened, said so), and (run, attempt) names one execution. Hashes an
untrusted non-empty dataset holds for such runs are replaced from PostgreSQL after the mark.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import asyncpg

from fencepost.core import fairness, hotrepair, states
from fencepost.core.errors import FencepostError
from fencepost.core.hot import Inspected, StampArgs, Versioned
from fencepost.core.stores import Stores
from fencepost.reconciler.drift import Drift, DriftRepair
from fencepost.reconciler.metrics import EPOCH, REBUILD_SECONDS, REBUILDS, RESTORED

__all__ = ["EPOCH_CAP", "EpochExhausted", "ensure_stamped", "rebuild_queue", "untrusted_queues"]

log = logging.getLogger("fencepost.reconciler")

PAGE = 2000
EPOCH_CAP = 8191
"""The last epoch (sql/001_core.sql): tokens are epoch * 2^40 + counter and must stay exact
doubles in Lua (< 2^53). Only a rebuild that stamps spends one; FencepostEpochNearCap alerts long
before, and docs/runbooks/FencepostEpochNearCap.md gives the way out."""


class EpochExhausted(FencepostError):
    """The queue used its last epoch: no rebuild can issue tokens above the old ones any more."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue!r} has used its last epoch ({EPOCH_CAP}): it cannot be rebuilt with tokens "
                         "above the old ones; move its producers and workers to a new queue name "
                         "(docs/runbooks/FencepostEpochNearCap.md)")
        self.queue = queue
CLAIMABLE = frozenset(s.value for s in states.RESTORED)
"""States a run may leave for a claim by a command or a due time inside Redis alone."""


async def rebuild_queue(stores: Stores, queue: str, *, page: int = PAGE, force: bool = False) -> dict[str, Any]:
    """Rebuild one queue (one reconciler at a time: a PostgreSQL advisory lock). Returns stats,
    or {"skipped": 1} when another process holds the lock or has just rebuilt the queue."""
    async with stores.db.session() as s:  # a session lock: taken and released on one connection
        if not await s.fetchval("rebuild_try_lock", queue):
            return {"skipped": 1}
        try:
            if not force and queue not in await untrusted_queues(stores):
                return {"skipped": 1}
            return await _rebuild(stores, queue, page)
        finally:
            await s.fetchval("rebuild_unlock", queue)


async def _rebuild(stores: Stores, queue: str, page: int) -> dict[str, Any]:
    """The rebuild of one queue, under its lock: the steps of the module doc, in `_Rebuild`."""
    return await _Rebuild(stores, queue, page).run()


_RESTORED_KINDS = ("missing", "lost_lease", "stale_hash", "corrupt")
"""Drift a rebuild restores from PostgreSQL: each such run may have run in the lost dataset."""


class _Rebuild:
    """One queue's rebuild (module doc), one method per step: `begin` (a new epoch, claims refused),
    `restore_active` (1. PostgreSQL's active runs, page by page), `check_members` (2. the dataset's
    sorted-set members), `stamp` (3.), then `report`. `apply` repairs one page of drift, marking
    the runs the lost dataset may have run (`mark_unknown`) before they can be claimed again."""

    def __init__(self, stores: Stores, queue: str, page: int) -> None:
        self.stores, self.queue, self.page = stores, queue, page
        self.keys = stores.keys(queue)
        self.drift = DriftRepair(stores, page=page, loop="rebuild")
        self.t0 = time.monotonic()
        self.epoch = 0
        self.paused = False
        self.empty = False
        """The dataset holds none of the queue's sorted sets: nothing in it can be stale, so the stamp
        is written after the first page and workers claim while the rest is restored."""
        self.sets: list[str] = []
        self.stamped_at: float | None = None
        self.stats: dict[str, Any] = {"epoch": 0, "restored": 0, "interrupted": 0, "synced": 0, "dropped": 0,
                                      "unknown": 0, "empty": 0}

    async def run(self) -> dict[str, Any]:
        await self.begin()
        await self.restore_active()
        if not self.empty:
            await self.check_members()
        if self.stamped_at is None:
            await self.stamp()
        return self.report()

    async def begin(self) -> None:
        """A new epoch in PostgreSQL, only if the current one may have been stamped (sql/010_isolation.sql),
        so every token issued from here is above every token issued before; then the dataset's stamp
        is removed (claims refuse the queue until `stamp`), and what the dataset holds is looked at."""
        db, stores, queue = self.stores.db, self.stores, self.queue
        try:
            bumped = await db.row("rebuild_epoch", queue)
            assert bumped is not None  # the queue's row exists: rebuilds run for queues PostgreSQL lists
            self.epoch = self.stats["epoch"] = bumped.epoch
        except asyncpg.CheckViolationError:
            raise EpochExhausted(queue) from None
        EPOCH.labels(queue).set(self.epoch)
        await hotrepair.unstamp(stores, self.keys)
        self.sets = [*await fairness.due_and_held_sets(stores, queue, scan=True), self.keys.delayed, self.keys.active]
        self.empty = not await hotrepair.any_members(stores, self.sets)
        self.stats["empty"] = int(self.empty)
        current = await db.row("queue_epoch", queue)
        assert current is not None  # as above
        self.paused = current.paused

    async def stamp(self) -> None:
        """3. The queue-level pause restored, the queue listed, its weights and limits copied (before claims
        may start), then the stamp: from here tokens may exist under this epoch."""
        stores, queue = self.stores, self.queue
        if self.paused:
            await stores.scripts.set_queue_paused(self.keys, True)
        await hotrepair.list_queue(stores, queue)
        await fairness.apply(stores, queue)
        await stores.db.execute("epoch_stamping", queue, self.epoch)
        await stores.scripts.stamp_queue(self.keys, StampArgs(self.epoch, force=1))
        self.stamped_at = time.monotonic()

    async def restore_active(self) -> None:
        """1. PostgreSQL's active runs in keyset pages. Before the stamp nothing in the dataset is trusted;
        after an early stamp (an empty dataset) the runs are the ones restored here and workers may hold
        them: normal rules."""
        last = 0
        while True:
            ids = [x.id for x in await self.stores.db.rows("drift_active_ids", self.queue, last, self.page)]
            if not ids:
                return
            last = ids[-1]
            await self.apply(await self.drift.examine(self.queue, ids, grace_s=0.0, rebuild=self.stamped_at is None),
                             ids)
            if self.empty and self.stamped_at is None:
                await self.stamp()

    async def check_members(self) -> None:
        """2. Every member of the dataset's sorted sets: one PostgreSQL has as terminal (a replica that missed
        the finish) leaves the sets, so a completed run is never claimed again; one without a hash or
        a row is dropped."""
        for z in self.sets:
            cursor = 0
            while True:
                step = await hotrepair.member_page(self.stores, z, cursor, self.page)
                await self.apply(await self.drift.examine(self.queue, step.ids, grace_s=0.0, rebuild=True))
                cursor = step.cursor
                if cursor == 0:
                    break

    async def mark_unknown(self, seen: dict[int, tuple[int, int]]) -> set[int]:
        """One `unknown` attempt per run the lost dataset may have run (see the module doc); `seen`: run ->
        (the dataset's attempt, its version), lower bounds of the new attempt's number."""
        if not seen:
            return set()
        ids = sorted(seen)
        rows = await self.stores.db.rows("rebuild_mark_unknown", ids, [seen[i][0] for i in ids],
                                         [seen[i][1] for i in ids], self.epoch, self.queue)
        self.stats["unknown"] += len(rows)
        return {r.id for r in rows}

    async def apply(self, found: list[Drift], page_ids: list[int] | None = None) -> None:
        """Repair one page of drift: the runs to restore prepared first (`_prepare`), the leases the
        untrusted dataset holds interrupted, then drift repair's usual repairs (a finish only the dataset
        saw is history: its event is written), counted. `page_ids` (a page of PostgreSQL's active runs,
        in an untrusted non-empty dataset): the waiting runs the dataset keeps are replaced too."""
        queue, drift = self.queue, self.drift
        await self._prepare(found)
        leases = [d for d in found if d.kind == "untrusted_lease"]
        if leases:
            interrupted = await self.stores.scripts.repair_interrupt(
                self.keys, [Versioned(d.run_id, d.seen_version) for d in leases])
            self.stats["interrupted"] += len(interrupted)
        # A run finished in Redis whose stream entry is still there is the recorder's to record (issue 22
        # item 11: recorded here as well, the transition was in the history twice), as in drift's own pass.
        unrec = [d for d in found if d.kind == "unrecorded"]
        if unrec:
            confirmed = {d.run_id for d in await drift.unrecorded_confirmed(queue, unrec)}
            found = [d for d in found if d.kind != "unrecorded" or d.run_id in confirmed]
        done = await drift.repair(queue, [d for d in found if d.kind != "untrusted_lease"], record=False)
        recorded = [d for d in done if d.kind == "unrecorded"]
        if recorded:  # a terminal transition only the dataset saw: its event is history, not repair noise
            await drift._write_events(queue, recorded)
        self._count(done)
        if page_ids is not None and not self.empty and self.stamped_at is None:
            await self._replace_kept(page_ids, {d.run_id for d in found if d.kind != "untrusted_lease"}, leases)

    async def _prepare(self, found: list[Drift]) -> None:
        """Before drift.repair enqueues the runs it restores: rows an older version stored outside the
        bounds quarantined (they would fail these updates for the whole queue, every time: issue 22
        item 8), lost leases interrupted in PostgreSQL, and each run marked with its `unknown` attempt."""
        await self.drift.screen(self.queue, [d.run_id for d in found if d.kind in _RESTORED_KINDS])
        lost = [d.run_id for d in found if d.kind == "lost_lease"]
        if lost:
            await self.drift.interrupt_lost(self.queue, lost)
        await self.mark_unknown({d.run_id: (_int(d.hot.attempt if d.hot else None), _int(d.seen_version))
                                 for d in found if d.kind in _RESTORED_KINDS})

    def _count(self, done: list[Drift]) -> None:
        for d in done:
            if d.kind in _RESTORED_KINDS:
                self.stats["restored"] += 1
                if d.kind == "lost_lease":
                    self.stats["interrupted"] += 1
            elif d.kind == "terminal_in_pg":
                self.stats["synced"] += 1
            elif d.kind in ("orphan_hash", "orphan_member"):
                self.stats["dropped"] += 1

    async def _replace_kept(self, page_ids: list[int], handled: set[int], leases: list[Drift]) -> None:
        """An untrusted non-empty dataset: the hashes it keeps for waiting runs carry its attempt numbers,
        which a lost write may have passed. Mark each such run, then replace its hash from PostgreSQL."""
        queue, drift = self.queue, self.drift
        kept = [i for i in page_ids if i not in handled]
        seen: list[Inspected] = []
        for i in range(0, len(kept), PAGE):
            seen += await self.stores.scripts.repair_inspect(self.keys, kept[i:i + PAGE])
        waiting = {rid: f for rid, f in zip(kept, seen) if f.exists and f.state in CLAIMABLE}
        await drift.screen(queue, sorted(waiting))
        was_leased = [d.run_id for d in leases if d.run_id in waiting]
        if was_leased:  # PostgreSQL may still hold the lease repair_interrupt just ended in Redis
            await drift.interrupt_lost(queue, was_leased)
        marked = await self.mark_unknown({rid: (_int(f.attempt), _int(f.version)) for rid, f in waiting.items()})
        replace = [Drift(queue, "stale_hash", rid, "replaced after an unknown attempt", seen_version=f.version or "")
                   for rid, f in waiting.items() if rid in marked]
        if replace:
            await drift.repair(queue, replace, record=False)

    def report(self) -> dict[str, Any]:
        """The stats (with when claims could start again, and the whole rebuild's time), counted and logged."""
        stats, queue = self.stats, self.queue
        assert self.stamped_at is not None
        stats["claimable_after_s"] = round(self.stamped_at - self.t0, 3)
        stats["seconds"] = round(time.monotonic() - self.t0, 3)
        REBUILDS.labels(queue).inc()
        REBUILD_SECONDS.labels(queue).observe(stats["seconds"])
        for action in ("restored", "interrupted", "synced", "dropped", "unknown"):
            if stats[action]:
                RESTORED.labels(queue, action).inc(stats[action])
        log.warning("rebuilt queue %s from PostgreSQL at epoch %d: %d restored, %d interrupted, %d synced, "
                    "%d dropped, %d unknown attempts in %.2fs (claimable after %.2fs)", queue, self.epoch,
                    stats["restored"], stats["interrupted"], stats["synced"], stats["dropped"], stats["unknown"],
                    stats["seconds"], stats["claimable_after_s"], extra={"event": "queue_rebuilt", "queue": queue})
        return stats


def _int(v: Any) -> int:
    """A hash field as a number (0 when absent or unreadable: a corrupt hash is no lower bound)."""
    try:
        return max(int(v), 0)
    except (TypeError, ValueError):
        return 0


async def untrusted_queues(stores: Stores) -> list[str]:
    """Queues whose stamp is missing, older than PostgreSQL's epoch, or was written on
    another server process (a restart or a promoted replica)."""
    queues = await stores.db.rows("queue_epochs")
    if not queues:
        return []
    for q in queues:
        EPOCH.labels(q.name).set(q.epoch)
    stamps = await hotrepair.queue_stamps(stores, [q.name for q in queues])
    return [q.name for q, st in zip(queues, stamps, strict=True)
            if st.epoch is None or st.epoch < q.epoch or st.stamped_on is None or st.stamped_on != st.server]


async def ensure_stamped(stores: Stores) -> list[str]:
    """Rebuild every untrusted queue; returns the queues rebuilt. One queue's failure is logged and
    does not keep the queues after it (in name order) unstamped."""
    rebuilt = []
    for name in await untrusted_queues(stores):
        try:
            stats = await rebuild_queue(stores, name)
        except Exception as exc:
            log.error("rebuild of queue %s failed: %s; the other queues are rebuilt", name, exc,
                      extra={"event": "rebuild_failed", "queue": name})
            continue
        if not stats.get("skipped"):
            rebuilt.append(name)
    return rebuilt
