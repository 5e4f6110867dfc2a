"""The worker's identity for operators (`fencepost workers`, GET /v1/workers): one pipeline per
heartbeat, sent by the lease keeper before its renewals. The same round trip brings an operator's
stop request, answered by a graceful stop."""

from __future__ import annotations

import logging
import os
import socket
import time

from fencepost.core import workers as fleet
from fencepost.core.stores import Stores
from fencepost.worker.held import Held, SpareClient

log = logging.getLogger("fencepost.worker")

__all__ = ["Identity"]


class Identity:
    def __init__(self, stores: Stores, held: Held, spare: SpareClient, worker_id: str, queues: list[str],
                 concurrency: int) -> None:
        self.stores, self.held, self.spare = stores, held, spare
        self.worker_id, self.queues, self.concurrency = worker_id, queues, concurrency
        self.started_at = time.time()

    async def announce(self, period: float) -> None:
        held = self.held
        running = held.running
        info = fleet.WorkerInfo(
            id=self.worker_id, host=socket.gethostname(), pid=os.getpid(), version=fleet.software_version(),
            queues=list(self.queues), concurrency=self.concurrency, started_at=self.started_at,
            seen_at=time.time(), claimed=held.claimed, last_claim_at=held.last_claim_at,
            running=[fleet.HeldRun(e.job.id, e.job.queue, e.job.handler, e.job.attempt) for e in running.values()])
        try:
            stop = await fleet.heartbeat(self.stores, info, ttl_s=max(5, int(period * 5) + 1),
                                         redis=self.spare.get() if self.stores.settings.redis_cluster else None)
        except Exception as exc:  # the operator's view only: never a reason to stop working
            log.debug("identity heartbeat failed: %s", exc)
            return
        if stop is not None and not held.stopping.is_set():
            log.warning("stop requested by %s (%s): draining", stop.actor, stop.reason or "no reason given",
                        extra={"event": "worker_stop_requested", "worker_id": self.worker_id})
            held.request_stop()
