"""Progress coalescing and result reads for handlers (ctx.progress, ctx.upstream_results, ctx.batch_results).

`ctx.progress()` only records the latest value in memory and marks the run dirty; one task
writes every dirty run's latest value in a single statement about once a second. A handler
calling progress() a million times costs a million attribute writes, not a million queries.
"""

from __future__ import annotations

import asyncio
import logging

from fencepost.core.errors import StoreUnavailable
from fencepost.core.models import decode_result
from fencepost.core.stores import Stores
from fencepost.worker.context import Context, RunResult

log = logging.getLogger("fencepost.worker")

__all__ = ["RunServicesImpl"]


class RunServicesImpl:
    """The worker's side of RunServices: one per worker, shared by every context it makes."""

    def __init__(self, stores: Stores, flush_s: float = 1.0) -> None:
        self.stores = stores
        self.flush_s = flush_s
        self._dirty: dict[int, Context] = {}
        self.flushes = 0

    def progress_changed(self, ctx: Context) -> None:
        self._dirty[ctx.run_id] = ctx  # a dict store is atomic under the GIL: thread handlers call it too

    async def flush(self) -> int:
        """Write the latest progress of every run that reported since the last flush (one statement)."""
        if not self._dirty:
            return 0
        batch, self._dirty = self._dirty, {}
        rows = [(c, p) for c in batch.values() if (p := c.last_progress) is not None]
        try:
            await self.stores.db.execute(
                "progress_upsert", [c.run_id for c, _ in rows], [c.attempt for c, _ in rows],
                [p.done for _, p in rows], [p.total for _, p in rows], [p.message for _, p in rows])
        except StoreUnavailable as exc:  # progress is advisory: keep the latest for the next try
            for c, _ in rows:
                self._dirty.setdefault(c.run_id, c)
            log.debug("progress flush failed: %s", exc)
            return 0
        except Exception as exc:  # a value PostgreSQL refuses: dropped (advisory), never fatal to the worker
            log.warning("progress flush failed: %s", exc, extra={"event": "progress_flush_failed"})
            return 0
        self.flushes += 1
        return len(rows)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            await self.flush()

    async def upstream_results(self, ctx: Context) -> dict[str, RunResult]:
        rows = await self.stores.db.rows("wf_upstream_results", ctx.run_id)
        return {r.name: RunResult(run_id=r.run_id, status=r.status, result=decode_result(r.result)) for r in rows}

    async def batch_results(self, ctx: Context) -> list[RunResult]:
        rows = await self.stores.db.rows("batch_results_of_callback", ctx.run_id)
        return [RunResult(run_id=r.run_id, status=r.status, result=decode_result(r.result)) for r in rows]
