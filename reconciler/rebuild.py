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

import functools
import logging
import time
from typing import Any, cast

import asyncpg

from fencepost.core import fairness, states
from fencepost.core.errors import FencepostError
from fencepost.core.hot import Inspected, StampArgs, Versioned
from fencepost.core.redisconn import read_twice
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
    t0 = time.monotonic()
    db, keys, r = stores.db, stores.keys(queue), stores.redis
    try:  # a new epoch only if the current one may have been stamped (see sql/010_isolation.sql)
        bumped = await db.fetchrow("rebuild_epoch", queue)
        assert bumped is not None  # the queue's row exists: rebuilds run for queues PostgreSQL lists
        epoch = bumped["epoch"]
    except asyncpg.CheckViolationError:
        raise EpochExhausted(queue) from None
    EPOCH.labels(queue).set(epoch)
    await r.delete(keys.token, keys.epoch)  # claims refuse from here until the stamp
    sets = [*await fairness.due_and_held_sets(stores, queue, scan=True), keys.delayed, keys.active]
    pipe = r.pipeline(transaction=False)
    for z in sets:
        pipe.zcard(z)
    empty = not any(await pipe.execute())
    current = await db.fetchrow("queue_epoch", queue)
    assert current is not None  # as above
    paused = current["paused"]
    drift = DriftRepair(stores, page=page, loop="rebuild")
    stats: dict[str, Any] = {"epoch": epoch, "restored": 0, "interrupted": 0, "synced": 0, "dropped": 0,
                             "unknown": 0, "empty": int(empty)}
    stamped_at: float | None = None

    async def stamp() -> None:
        nonlocal stamped_at
        if paused:
            await r.set(keys.paused, 1)
        await r.sadd(stores.queues_key, queue)
        await fairness.apply(stores, queue)  # weights and limits, before claims may start
        await db.execute("epoch_stamping", queue, epoch)  # from here tokens may exist under this epoch
        await stores.scripts.stamp_queue(keys, StampArgs(epoch, force=1))
        stamped_at = time.monotonic()

    async def mark_unknown(seen: dict[int, tuple[int, int]]) -> set[int]:
        """One `unknown` attempt per run the lost dataset may have run (see the module doc)."""
        if not seen:
            return set()
        ids = sorted(seen)
        rows = await db.fetch("rebuild_mark_unknown", ids, [seen[i][0] for i in ids], [seen[i][1] for i in ids],
                              epoch, queue)
        stats["unknown"] += len(rows)
        return {r["id"] for r in rows}

    async def apply(found: list[Any], page_ids: list[int] | None = None) -> None:
        # Runs restored from PostgreSQL (no hash, or a hash dropped as stale or corrupt) are
        # marked before drift.repair enqueues them; lost leases are interrupted first.
        # A row an older version stored outside the bounds would fail these updates for the whole
        # queue, every time: quarantined first (issue 22 item 8).
        await drift.screen(queue, [d.run_id for d in found
                                   if d.kind in ("missing", "lost_lease", "stale_hash", "corrupt")])
        lost = [d.run_id for d in found if d.kind == "lost_lease"]
        if lost:
            await drift.interrupt_lost(queue, lost)
        await mark_unknown({d.run_id: (_int((d.redis or {}).get("attempt")), _int(d.seen_version))
                            for d in found if d.kind in ("missing", "lost_lease", "stale_hash", "corrupt")})
        leases = [d for d in found if d.kind == "untrusted_lease"]
        if leases:
            interrupted = await stores.scripts.repair_interrupt(
                keys, [Versioned(d.run_id, d.seen_version) for d in leases])
            stats["interrupted"] += len(interrupted)
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
        for d in done:
            if d.kind in ("missing", "lost_lease", "stale_hash", "corrupt"):
                stats["restored"] += 1
                if d.kind == "lost_lease":
                    stats["interrupted"] += 1
            elif d.kind == "terminal_in_pg":
                stats["synced"] += 1
            elif d.kind in ("orphan_hash", "orphan_member"):
                stats["dropped"] += 1
        if page_ids is None or empty or stamped_at is not None:
            return
        # An untrusted non-empty dataset: the hashes it keeps for waiting runs carry its attempt
        # numbers, which a lost write may have passed. Mark, then replace them from PostgreSQL.
        handled = {d.run_id for d in found if d.kind != "untrusted_lease"}
        kept = [i for i in page_ids if i not in handled]
        seen: list[Inspected] = []
        for i in range(0, len(kept), PAGE):
            seen += await stores.scripts.repair_inspect(keys, kept[i:i + PAGE])
        waiting = {rid: f for rid, f in zip(kept, seen) if f.exists and f.state in CLAIMABLE}
        await drift.screen(queue, sorted(waiting))
        was_leased = [d.run_id for d in leases if d.run_id in waiting]
        if was_leased:  # PostgreSQL may still hold the lease repair_interrupt just ended in Redis
            await drift.interrupt_lost(queue, was_leased)
        marked = await mark_unknown({rid: (_int(f.attempt), _int(f.version)) for rid, f in waiting.items()})
        replace = [Drift(queue, "stale_hash", rid, "replaced after an unknown attempt", seen_version=f.version or "")
                   for rid, f in waiting.items() if rid in marked]
        if replace:
            await drift.repair(queue, replace, record=False)

    last = 0
    while True:
        ids = [x["id"] for x in await db.fetch("drift_active_ids", queue, last, page)]
        if not ids:
            break
        last = ids[-1]
        # Before the stamp nothing in the dataset is trusted; after an early stamp (empty
        # dataset) the runs are the ones we restored and workers may hold them: normal rules.
        await apply(await drift.examine(queue, ids, grace_s=0.0, rebuild=stamped_at is None), ids)
        if empty and stamped_at is None:
            await stamp()
    if not empty:
        for z in sets:
            cur = 0
            while True:
                # bytes: Stores opens Redis with decode_responses=False (redis-py types members bytes | str | float)
                cur, members = cast("tuple[int, list[tuple[bytes, float]]]", await r.zscan(z, cur, count=page))
                ids = [int(m) for m, _ in members if m.isdigit()]
                await apply(await drift.examine(queue, ids, grace_s=0.0, rebuild=True))
                if cur == 0:
                    break
    if stamped_at is None:
        await stamp()
    assert stamped_at is not None
    stats["claimable_after_s"] = round(stamped_at - t0, 3)
    stats["seconds"] = round(time.monotonic() - t0, 3)
    REBUILDS.labels(queue).inc()
    REBUILD_SECONDS.labels(queue).observe(stats["seconds"])
    for action in ("restored", "interrupted", "synced", "dropped", "unknown"):
        if stats[action]:
            RESTORED.labels(queue, action).inc(stats[action])
    log.warning("rebuilt queue %s from PostgreSQL at epoch %d: %d restored, %d interrupted, %d synced, "
                "%d dropped, %d unknown attempts in %.2fs (claimable after %.2fs)", queue, epoch, stats["restored"],
                stats["interrupted"], stats["synced"], stats["dropped"], stats["unknown"], stats["seconds"],
                stats["claimable_after_s"], extra={"event": "queue_rebuilt", "queue": queue})
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
    queues = await stores.db.fetch("queue_epochs")
    if not queues:
        return []
    for q in queues:
        EPOCH.labels(q["name"]).set(q["epoch"])
    servers: dict[str, str] = {}  # queue -> run_id of the server its stamp must name
    if stores.settings.redis_cluster:
        # Redis Cluster: stamp_queue.lua recorded the run_id of the primary owning the queue's
        # slot, so compare each queue with that node's run_id (a plain INFO reaches one arbitrary
        # node). A promoted replica has its own run_id, so its queues read as untrusted.
        by_node: dict[str, str] = {}
        cluster: Any = stores.redis  # a RedisCluster here (Stores types it as Redis)
        for q in queues:
            node = cluster.get_node_from_key(stores.keys(q["name"]).epoch)
            if node.name not in by_node:
                info = await read_twice(functools.partial(cluster.info, "server", target_nodes=node))
                by_node[node.name] = info["run_id"]
            servers[q["name"]] = by_node[node.name]
    else:
        server = (await read_twice(lambda: stores.redis.info("server")))["run_id"]
        servers = {q["name"]: server for q in queues}

    async def read_stamps() -> list[Any]:
        pipe = stores.redis.pipeline(transaction=False)
        for q in queues:
            pipe.hmget(stores.keys(q["name"]).epoch, "epoch", "server")
        return await pipe.execute()

    stamps = await read_twice(read_stamps)
    out = []
    for q, (epoch, stamped_on) in zip(queues, stamps):
        if (epoch is None or int(epoch) < q["epoch"] or stamped_on is None
                or stamped_on.decode() != servers[q["name"]]):
            out.append(q["name"])
    return out


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
