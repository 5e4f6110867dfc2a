"""The lease keeper: renews the leases of what the worker holds (one batched script call per queue
per heartbeat) and takes the self-fencing decision (docs/worker.md, "Self-fencing").

An execution is fenced off, never finished, once Redis says another attempt owns the run (lost),
once its lease or the worker's liveness pulse could lapse on Redis within the margin (lease, pulse),
or once a newer attempt of its run reached this worker (superseded). Every window is measured from
the *send* time of the last request Redis answered, on CLOCK_MONOTONIC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from fencepost.core import metrics
from fencepost.core.hot import Lease, RenewArgs
from fencepost.core.stores import Stores
from fencepost.worker.held import Held, Running
from fencepost.worker.liveness import Pulse

log = logging.getLogger("fencepost.worker")

__all__ = ["FENCE_MARGIN_MAX_S", "LeaseKeeper", "fence_margin_s"]

FENCE_MARGIN_MAX_S = 1.0
"""The self-fencing margin: a fifth of the window (lease or liveness), at most this."""


def fence_margin_s(window_ms: int) -> float:
    """How long before a lease (or the worker's liveness) could lapse on Redis the worker stops the
    run's handler: a fifth of the window, at most FENCE_MARGIN_MAX_S (docs/worker.md)."""
    return min(FENCE_MARGIN_MAX_S, window_ms / 5000)


class LeaseKeeper:
    def __init__(self, stores: Stores, held: Held, worker_id: str, lease_ms: int, heartbeat_s: float,
                 announce: Callable[[float], Awaitable[None]]) -> None:
        self.stores, self.held, self.worker_id = stores, held, worker_id
        self.lease_ms = lease_ms
        self.period = min(lease_ms / 3000, heartbeat_s)
        self.announce = announce
        """The identity heartbeat (worker/identity.py), sent before each renewal round, bounded."""
        self.pulse: Pulse | None = None
        """The worker's liveness pulse, once started (Worker.run)."""
        self._lease_margin = fence_margin_s(lease_ms)
        self._pulse_margin = fence_margin_s(stores.settings.worker_liveness_ms)
        self.lost = 0
        self.fenced = 0

    # -- the self-fencing decision -------------------------------------------------------------
    def reason(self, entry: Running, now: float) -> str | None:
        """'lease' or 'pulse' once the execution's lease, or this worker's liveness on its queue, could
        lapse on Redis within the margin (both measured from the *send* time of the last request
        Redis answered, on CLOCK_MONOTONIC: Redis started the window no earlier than that)."""
        if now >= entry.renewed_at + self.lease_ms / 1000 - self._lease_margin:
            return "lease"
        pulse = self.pulse
        sent = pulse.sent_at(entry.job.queue) if pulse is not None else None
        if pulse is not None and sent is not None and now >= sent + pulse.liveness_ms / 1000 - self._pulse_margin:
            return "pulse"
        return None

    def deadline(self, entry: Running) -> float:
        """The CLOCK_MONOTONIC instant from which reason() would answer, as things stand (0.0 once
        fenced or finishing): a process-model child checks its clock against it (worker/procpool.py)."""
        if entry.fenced is not None or entry.finishing:
            return 0.0
        at = entry.renewed_at + self.lease_ms / 1000 - self._lease_margin
        pulse = self.pulse
        sent = pulse.sent_at(entry.job.queue) if pulse is not None else None
        if pulse is not None and sent is not None:
            at = min(at, sent + pulse.liveness_ms / 1000 - self._pulse_margin)
        return at

    def due(self, entry: Running) -> bool:
        """Asked by the handler's should_stop() and checkpoints: the watchdog's test, on the spot."""
        return entry.fenced is not None or (not entry.finishing and self.reason(entry, time.monotonic()) is not None)

    def fence(self, entry: Running, reason: str) -> None:
        """Stop an execution and never finish it: `reason` lost (Redis says another attempt owns the
        run), lease or pulse (this worker could not renew in time: the lease may pass any moment),
        superseded (a newer attempt of the run reached this worker). should_stop() turns True and
        checkpoints are refused; an async handler is cancelled; a process child is killed; a thread
        cannot be killed: it is abandoned (counted) and a newer attempt here waits until it returns."""
        if entry.fenced is not None:
            return
        entry.fenced = reason
        job = entry.job
        fields = {"run_id": job.id, "attempt": job.attempt, "worker_id": self.worker_id, "token": job.token,
                  "queue": job.queue, "reason": reason}
        self._log_fence(entry, reason, fields)
        metrics.SELF_FENCED.labels(job.queue, entry.model, reason).inc()
        if entry.model == "thread" and entry.task is not None and not entry.task.done():
            metrics.THREADS_ABANDONED.labels(job.queue).inc()
            log.warning("run %s (token %s) runs in a thread, which cannot be killed: thread handler abandoned "
                        "(should_stop() is True, its checkpoints are refused)", job.id, job.token,
                        extra={"event": "thread_abandoned", **fields})
        entry.ctx._stop = True
        entry.ctx._fenced = True
        running = self.held.running
        if running.get(entry.key) is entry:
            del running[entry.key]
        if entry.task is not None:
            entry.task.cancel()
        self.held.slot_freed.set()

    def _log_fence(self, entry: Running, reason: str, fields: dict[str, object]) -> None:
        job = entry.job
        if reason == "lost":
            self.lost += 1
            log.warning("lost lease on run %s (token %s); abandoning it", job.id, job.token,
                        extra={"event": "lease_lost", **fields})
        elif reason == "superseded":
            executing = self.held.executing
            log.warning("run %s came back to this worker as attempt %d while attempt %d (token %s) still ran "
                        "here; stopping the old execution before the new one starts", job.id,
                        executing[job.id].job.attempt if job.id in executing else job.attempt + 1,
                        job.attempt, job.token, extra={"event": "attempt_superseded", **fields})
        else:
            self.fenced += 1
            since = time.monotonic() - entry.renewed_at
            log.warning("could not renew the %s of run %s (token %s) in time (last renewal sent %.2fs ago); "
                        "stopping its handler before the lease can pass to another worker",
                        "lease" if reason == "lease" else "worker's liveness pulse", job.id, job.token, since,
                        extra={"event": "self_fenced", **fields})

    # -- renewals ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Each period: the identity heartbeat (bounded), then one renewal per queue of what is held."""
        period = self.period
        while True:
            with contextlib.suppress(TimeoutError):  # the operator's view only: never holds the renewals
                await asyncio.wait_for(self.announce(period), max(2 * period, 0.5))
            await asyncio.sleep(period)
            by_queue: dict[str, list[Running]] = {}
            for entry in list(self.held.running.values()):
                if not entry.finishing:
                    by_queue.setdefault(entry.job.queue, []).append(entry)
            for queue, entries in by_queue.items():
                await self._renew(queue, entries)

    async def _renew(self, queue: str, entries: list[Running]) -> None:
        period = self.period
        leases = [Lease(e.job.id, e.job.token) for e in entries]
        t0 = time.monotonic()
        try:
            # bounded: a blackholed link must not hold the keeper (the watchdog fences meanwhile)
            replies = await asyncio.wait_for(self.stores.scripts.renew_leases(
                self.stores.keys(queue), RenewArgs(self.lease_ms), leases), max(2 * period, 0.5))
            metrics.HEARTBEAT.labels(queue).observe(time.monotonic() - t0)
            metrics.RENEWALS.labels(queue).inc(sum(1 for r in replies if not r.lost))
        except Exception as exc:
            log.warning("lease renewal failed: %s", str(exc) or type(exc).__name__,
                        extra={"event": "renew_failed", "queue": queue})
            return
        running = self.held.running
        for e, reply in zip(entries, replies):
            if e.fenced is not None or e.finishing or running.get(e.key) is not e:
                continue  # finished (or fenced) while the renewal was on its way: not a lost lease
            if reply.lost:
                metrics.LEASES_LOST.labels(queue).inc()
                self.fence(e, "lost")
                continue
            e.renewed_at = max(e.renewed_at, t0)
            if reply.ctl is not None:
                e.ctx._ctl = reply.ctl
                if e.ctx._ctl in ("stop", "cancel") and e.stop_seen is None:
                    e.stop_seen = time.monotonic()
