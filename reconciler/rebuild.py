"""Epoch stamps and the rebuild of a queue's hot state from PostgreSQL.

A queue whose Redis keys carry no stamp (a new empty server, a FLUSHALL, a restart
without persistence) is not trusted: claims refuse it until it was rebuilt here.
The epoch is bumped first, so every token issued afterwards is above every token
issued before, whatever counter value the new dataset holds.
"""

from __future__ import annotations

import logging
from typing import Any

from scheduler.client import enqueue_rows
from scheduler.stores import Stores

log = logging.getLogger("fencepost.reconciler")

PAGE = 2000


async def rebuild_queue(stores: Stores, queue: str) -> dict[str, int]:
    """Bump the epoch, restore every run PostgreSQL has as active, then stamp. Streams in pages."""
    db, keys = stores.db, stores.keys(queue)
    row = await db.fetchrow("bump_epoch", queue)
    epoch = row["epoch"]
    await stores.redis.delete(keys.token, keys.epoch)
    stats = {"restored": 0, "interrupted": 0, "epoch": epoch}
    last = 0
    while True:
        page = await db.fetch("active_runs_page", queue, last, PAGE)
        if not page:
            break
        last = page[-1]["id"]
        pipe = stores.redis.pipeline(transaction=False)
        for r in page:
            pipe.exists(keys.run(r["id"]))
        present = await pipe.execute()
        restore: list[dict[str, Any]] = []
        lost_running: list[int] = []
        for r, exists in zip(page, present):
            if exists:
                continue
            if r["status"] in ("RUNNING", "STOPPING"):
                lost_running.append(r["id"])
            else:
                restore.append(dict(r))
        if lost_running:
            bumped = {x["id"]: x["version"] for x in await db.fetch("interrupt_lost_runs", lost_running)}
            for r in page:
                if r["id"] in bumped:
                    restore.append({**dict(r), "status": "PENDING", "version": bumped[r["id"]]})
            stats["interrupted"] += len(bumped)
        stats["restored"] += await enqueue_rows(stores, queue, restore)
    await stores.redis.sadd(stores.queues_key, queue)
    await stores.scripts.run("stamp_queue", keys, [epoch, 1])
    log.warning("rebuilt queue %s from PostgreSQL at epoch %d: %d runs restored, %d interrupted",
                queue, epoch, stats["restored"], stats["interrupted"],
                extra={"event": "queue_rebuilt", "queue": queue, **stats})
    return stats


async def ensure_stamped(stores: Stores) -> list[str]:
    """Rebuild every queue whose stamp is missing, older than PostgreSQL's epoch, or was
    written on another server process (a restart or a promoted replica)."""
    queues = await stores.db.fetch("queue_epochs")
    if not queues:
        return []
    server = (await stores.redis.info("server"))["run_id"]
    pipe = stores.redis.pipeline(transaction=False)
    for q in queues:
        pipe.hmget(stores.keys(q["name"]).epoch, "epoch", "server")
    stamps = await pipe.execute()
    rebuilt = []
    for q, (epoch, stamped_on) in zip(queues, stamps):
        if epoch is None or int(epoch) < q["epoch"] or stamped_on is None or stamped_on.decode() != server:
            await rebuild_queue(stores, q["name"])
            rebuilt.append(q["name"])
    return rebuilt
