"""The reaper: every reap_every_s, each queue's expired leases go back to their queue (or to FAILED
past max_interruptions), on the Redis server's clock inside the script. Any worker may reap any run
of its queues: a worker that died has nobody else to do it."""

from __future__ import annotations

import asyncio
import logging

from fencepost.core import metrics
from fencepost.core.hot import ReapArgs
from fencepost.core.stores import Stores
from fencepost.worker.held import Backoff

log = logging.getLogger("fencepost.worker")

__all__ = ["Reaper"]


class Reaper:
    def __init__(self, stores: Stores, queues: list[str], every_s: float, backoff: Backoff) -> None:
        self.stores, self.queues, self.every_s, self.backoff = stores, queues, every_s, backoff

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.reap()

    async def reap(self) -> None:
        args = ReapArgs(500, self.stores.settings.max_interruptions)
        for q in self.queues:
            if q in self.backoff.blocked:  # its store failed: reaped once its claims answer again
                continue
            try:
                n = await self.stores.scripts.reap_expired(self.stores.keys(q), args)
                if n:
                    metrics.LEASE_EXPIRIES.labels(q).inc(n)
            except Exception as exc:
                log.debug("reap failed: %s", exc)
