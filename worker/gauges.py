"""The worker's gauges, once a second: what runs per queue, how busy its pools are, the oldest
checkpoint's age, and the event-loop lag probe (how long a call_soon callback waits). It also
flushes the per-job counters and histograms coalesced in metrics.Cached."""

from __future__ import annotations

import asyncio
import time

from fencepost.core import metrics
from fencepost.core.metrics import Cached
from fencepost.worker.executors import Executors
from fencepost.worker.held import Held

__all__ = ["Gauges"]


class Gauges:
    def __init__(self, held: Held, executors: Executors, m: Cached, queues: list[str], concurrency: int) -> None:
        self.held, self.executors, self.m = held, executors, m
        self.queues, self.concurrency = queues, concurrency

    async def run(self, period: float = 1.0) -> None:
        loop = asyncio.get_running_loop()
        metrics.CONCURRENCY.set(self.concurrency)
        while True:
            t0 = loop.time()
            fut = loop.create_future()
            loop.call_soon(fut.set_result, None)
            await fut
            metrics.LOOP_LAG.observe(loop.time() - t0)
            self.m.flush()
            self.observe()
            await asyncio.sleep(period)

    def observe(self) -> None:
        running, ex = self.held.running, self.executors
        per_queue = dict.fromkeys(self.queues, 0)
        for e in running.values():
            per_queue[e.job.queue] = per_queue.get(e.job.queue, 0) + 1
        for q, n in per_queue.items():
            metrics.RUNNING.labels(q).set(n)
        busy = len(running) + ex.leaked_threads
        metrics.UTILIZATION.set(busy / self.concurrency)
        metrics.LEAKED.set(ex.leaked_threads)
        metrics.POOL_BUSY.labels("thread").set(ex.threads_busy + ex.leaked_threads)
        metrics.POOL_SIZE.labels("thread").set(self.concurrency)
        if ex.procs is not None:
            metrics.POOL_SIZE.labels("process").set(ex.procs.size)
            metrics.POOL_BUSY.labels("process").set(ex.procs.size - ex.procs.idle())
        now = time.time()
        ages = [now - e.ctx.checkpointed_at for e in running.values() if e.ctx.checkpointed_at]
        metrics.CHECKPOINT_AGE.set(max(ages) if ages else 0)
