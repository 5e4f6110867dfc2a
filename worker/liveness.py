"""The pulse: a worker's liveness, kept apart from its runs' leases.

A lease says how long one run may go unrenewed; it can be long (a long job renews it anyway).
Liveness says whether the worker process is there at all: a thread of its own pulses every queue
the worker serves (lua/pulse_worker.lua) several times per `worker_liveness_ms`, and any reaper
(other workers, the reconciler) reclaims the runs of a worker whose pulse stopped (SIGKILL, OOM,
host lost) within about that time, whatever their lease. The thread has its own event loop and
Redis connection, so a handler that hogs the worker's event loop does not make it look dead.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from fencepost.core.config import Settings
from fencepost.core.hot import PulseArgs
from fencepost.core.stores import Stores

log = logging.getLogger("fencepost.worker")

__all__ = ["Pulse"]


class Pulse:
    def __init__(self, settings: Settings, worker_id: str, queues: list[str]) -> None:
        self.settings, self.worker_id, self.queues = settings, worker_id, list(queues)
        self.liveness_ms = settings.worker_liveness_ms
        self.period_s = self.liveness_ms / 6000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._leaving = True

    def start(self) -> None:
        """Start pulsing. Claims need not wait for the first pulse: a worker that never pulsed is
        not in the set, so its runs fall back on their leases."""
        if self.liveness_ms <= 0:
            return
        self._thread = threading.Thread(target=self._main, name="fencepost-pulse", daemon=True)
        self._thread.start()

    def stop(self, *, leaving: bool = True) -> None:
        """Stop pulsing; `leaving`: say so (graceful stop) instead of letting the pulse run out."""
        self._leaving = leaving
        self._stop.set()
        loop, wake = self._loop_ref, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # its loop already ended
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _main(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        stores = Stores(self.settings)
        alive = PulseArgs(self.worker_id, self.liveness_ms)
        self._wake = wake = asyncio.Event()
        self._loop_ref = asyncio.get_running_loop()
        try:
            while not self._stop.is_set():
                try:
                    for q in self.queues:
                        await stores.scripts.pulse_worker(stores.keys(q), alive)
                except Exception as exc:  # Redis down: reapers cannot reclaim anything either
                    log.debug("pulse failed: %s", exc)
                try:
                    await asyncio.wait_for(wake.wait(), self.period_s)
                except TimeoutError:
                    pass
            if self._leaving:
                for q in self.queues:
                    try:
                        await stores.scripts.pulse_worker(stores.keys(q), PulseArgs(self.worker_id, 0))
                    except Exception as exc:
                        log.debug("leaving pulse failed: %s", exc)
        finally:
            await stores.redis.aclose()
