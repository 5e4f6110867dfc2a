"""Escalation: a handler asked to stop (an operator's stop or cancel) that ignores it for its whole
grace period is stopped by force: the escalation is recorded on the run, then its task is cancelled,
which kills a process-model child and gives a thread handler up as a leaked slot. A process job whose
child is still starting has sent the child nothing yet (worker/procpool.py sends a job only to a ready
child): the child stays in the pool, and no handler of the run is left anywhere."""

from __future__ import annotations

import asyncio
import logging

from fencepost.core.hot import EscalateArgs
from fencepost.core.registry import Registry
from fencepost.core.stores import Stores
from fencepost.worker.held import Running

log = logging.getLogger("fencepost.worker")

__all__ = ["Escalation"]


class Escalation:
    def __init__(self, stores: Stores, registry: Registry, worker_id: str, stop_grace_s: float) -> None:
        self.stores, self.registry, self.worker_id = stores, registry, worker_id
        self.stop_grace_s = stop_grace_s
        """How long a stop waits for a handler that does not declare its own grace."""
        self._tasks: set[asyncio.Task[None]] = set()

    def grace(self, handler: str) -> float:
        h = self.registry.handlers.get(handler)
        declared = h.spec.stop_grace_s if h is not None else None
        return self.stop_grace_s if declared is None else declared

    def check(self, entry: Running, now: float) -> None:
        """The watchdog's test for an execution asked to stop: force it once its grace has passed."""
        grace = self.grace(entry.job.handler)
        seen = entry.stop_seen
        if seen is not None and now - seen > grace:
            entry.forced = True
            task = asyncio.ensure_future(self._escalate(entry, grace))
            self._tasks.add(task)  # a task nobody references can be collected mid-run
            task.add_done_callback(self._tasks.discard)

    async def _escalate(self, entry: Running, grace: float) -> None:
        """The handler ignored a stop for its whole grace period: record it, then stop it by
        force (kill the process job; cancel an async one; give a thread up as a leaked slot)."""
        job = entry.job
        log.warning("run %s ignored stop for %.0fs; forcing", job.id, grace,
                    extra={"event": "stop_escalated", "run_id": job.id, "attempt": job.attempt,
                           "worker_id": self.worker_id})
        try:
            args = EscalateArgs(job.id, job.token, self.worker_id, f"{grace:g}")
            await self.stores.scripts.escalate_stop(self.stores.keys(job.queue), args)
        except Exception as exc:
            log.warning("could not record stop escalation of run %s: %s", job.id, exc)
        if entry.task is not None:
            entry.task.cancel()
