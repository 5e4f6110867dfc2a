"""Maintenance as independent loops, Oban-plugin / River-maintainer style.

Each maintenance step of the reconciler (rebuild, reaper, outbox relay, drift repair, ...)
is a `Loop`: its own asyncio task, its own interval, its own error isolation (a failed pass
is logged and counted, and the loop carries on) and its own metrics
(`fencepost_maintenance_runs_total{loop,outcome}`, `fencepost_maintenance_seconds{loop}`),
so a slow retention or drift pass never delays the reaper.

One ordering survives the split, and `QueueGate` keeps it: a queue whose Redis dataset is
not trusted is rebuilt before drift repair (or the held-run refill, or the reaper) touches it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager

from fencepost.reconciler.metrics import MAINTENANCE_LAST_OK, MAINTENANCE_RUNS, MAINTENANCE_SECONDS

__all__ = ["Loop", "QueueFailures", "QueueGate", "each_queue", "run_loops"]

log = logging.getLogger("fencepost.reconciler")

Step = Callable[[], Awaitable[float | None]]
"""One pass. Returns None (next pass after the loop's interval) or the seconds until the next
pass (a backlog asks to come back sooner)."""


class QueueFailures(Exception):
    """Some queues of a pass failed; each was logged already, the pass counts as an error."""

    def __init__(self, loop: str, queues: list[str]) -> None:
        super().__init__(f"{loop} failed on {len(queues)} queue(s): {', '.join(queues)}")
        self.loop = loop
        self.queues = queues


async def each_queue(loop: str, queues: Iterable[str], fn: Callable[[str], Awaitable[object]]) -> None:
    """Run `fn` on every queue; one queue's failure is logged and does not stop the others
    (raised at the end as QueueFailures, so the pass is counted as an error)."""
    failed = []
    for q in queues:
        try:
            await fn(q)
        except Exception as exc:
            failed.append(q)
            log.warning("%s failed on queue %s: %s", loop, q, exc, extra={"event": f"{loop}_failed", "queue": q})
    if failed:
        raise QueueFailures(loop, failed)


class Loop:
    """One maintenance step run every `interval_s` as its own task. `wakeup` (optional) starts
    the next pass early (the outbox relay on a NOTIFY)."""

    def __init__(self, name: str, step: Step, interval_s: float, *, wakeup: asyncio.Event | None = None) -> None:
        self.name = name
        self.step = step
        self.interval_s = interval_s
        self.wakeup = wakeup

    async def once(self) -> float | None:
        """One pass, timed and counted; a failure is logged, never raised (cancellation is)."""
        if self.wakeup is not None:
            self.wakeup.clear()  # a wakeup during the pass starts another one right after it
        t0 = time.monotonic()
        delay: float | None = None
        try:
            delay = await self.step()
        except QueueFailures:
            outcome = "error"  # each queue's failure was logged by each_queue
        except Exception as exc:
            outcome = "error"
            log.warning("%s failed: %s", self.name, exc, extra={"event": f"{self.name}_failed"})
        else:
            outcome = "ok"
            MAINTENANCE_LAST_OK.labels(self.name).set_to_current_time()
        MAINTENANCE_SECONDS.labels(self.name).observe(time.monotonic() - t0)
        MAINTENANCE_RUNS.labels(self.name, outcome).inc()
        return delay

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            delay = await self.once()
            await self._pause(stop, self.interval_s if delay is None else delay)

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        events = [stop] if self.wakeup is None else [stop, self.wakeup]
        waiters = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waiters, timeout=max(seconds, 0.0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()


async def run_loops(loops: Iterable[Loop], stop: asyncio.Event, *, grace_s: float) -> None:
    """Run every loop as its own task until `stop`; then give the passes in flight `grace_s`
    to finish, cancel the rest, and await them all (also when this coroutine is cancelled)."""
    tasks = {asyncio.create_task(loop.run(stop), name=f"fencepost-{loop.name}"): loop.name for loop in loops}
    try:
        await stop.wait()
        _, busy = await asyncio.wait(tasks, timeout=grace_s)
        if busy:
            log.warning("maintenance loops still busy %.1fs after stop, cancelled: %s", grace_s,
                        ", ".join(sorted(tasks[t] for t in busy)), extra={"event": "maintenance_cancelled"})
    finally:
        for t in tasks:
            t.cancel()  # no-op for the loops that returned
        await asyncio.gather(*tasks, return_exceptions=True)


class QueueGate:
    """What the rebuild loop last learned about trust, shared with the loops that must not touch
    an untrusted queue. Drift repair and refill (`using`) run on a queue only if the last trust
    check succeeded and found it trusted; a rebuild (`rebuilding`) waits for their passes in
    flight on the queue and keeps new ones off until the queue is stamped. The reaper skips
    queues last seen untrusted (`suspect`): the rebuild interrupts their leases, not counted as
    failures."""

    def __init__(self) -> None:
        self.checked = asyncio.Event()
        """Set after the first trust check, whatever its outcome."""
        self._untrusted: frozenset[str] = frozenset()
        self._fresh = False
        """The last check succeeded (False before the first one and after a failed one)."""
        self._rebuilding: set[str] = set()
        self._busy: Counter[str] = Counter()
        self._idle = asyncio.Condition()

    def publish(self, untrusted: Iterable[str]) -> None:
        self._untrusted, self._fresh = frozenset(untrusted), True
        self.checked.set()

    def unknown(self) -> None:
        """The check failed: nothing counts as trusted until the next one succeeds."""
        self._fresh = False
        self.checked.set()

    def trust(self, queue: str) -> None:
        """The queue was rebuilt and stamped."""
        self._untrusted = self._untrusted - {queue}

    def trusted(self, queue: str) -> bool:
        return self._fresh and queue not in self._untrusted and queue not in self._rebuilding

    def suspect(self, queue: str) -> bool:
        return queue in self._untrusted or queue in self._rebuilding

    @asynccontextmanager
    async def using(self, queue: str) -> AsyncIterator[bool]:
        """Yields whether the queue may be touched now; a rebuild of it waits until this exits."""
        if not self.trusted(queue):
            yield False
            return
        self._busy[queue] += 1
        try:
            yield True
        finally:
            self._busy[queue] -= 1
            async with self._idle:
                self._idle.notify_all()

    @asynccontextmanager
    async def rebuilding(self, queue: str) -> AsyncIterator[None]:
        self._rebuilding.add(queue)
        try:
            async with self._idle:
                await self._idle.wait_for(lambda: self._busy[queue] <= 0)
            yield
        finally:
            self._rebuilding.discard(queue)
