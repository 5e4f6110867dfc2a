"""`fencepost reconciler`: the recorder plus the maintenance loops (stamps and rebuilds,
reaper, outbox relay), each a small component with one job."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from scheduler.config import Settings
from scheduler.stores import Stores

from .outbox import OutboxRelay
from .rebuild import ensure_stamped
from .recorder import Recorder

log = logging.getLogger("fencepost.reconciler")


class Reconciler:
    def __init__(self, settings: Settings | None = None, *, tick_s: float = 1.0) -> None:
        self.stores = Stores(settings, db_pool_size=4)
        self.recorder = Recorder(self.stores)
        self.outbox = OutboxRelay(self.stores)
        self.tick_s = tick_s
        self.stop = asyncio.Event()

    async def maintain_once(self) -> None:
        await ensure_stamped(self.stores)
        now = int(time.time() * 1000)
        for q in await self.recorder.queues():
            await self.stores.scripts.run("reap_expired", self.stores.keys(q), [now, 1000])
        await self.outbox.relay()

    async def _maintain(self) -> None:
        while not self.stop.is_set():
            try:
                await self.maintain_once()
            except Exception as exc:  # noqa: BLE001 - the next tick retries
                log.warning("maintenance pass failed: %s", exc, extra={"event": "maintenance_failed"})
            self.outbox.wakeup.clear()
            try:
                await asyncio.wait_for(self.outbox.wakeup.wait(), self.tick_s)
            except TimeoutError:
                pass

    async def run(self) -> None:
        await self.stores.connect()
        await self.stores.check_redis()
        await self.outbox.listen()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        log.info("reconciler started", extra={"event": "reconciler_started"})
        try:
            await asyncio.gather(self.recorder.run(self.stop), self._maintain())
        finally:
            await self.outbox.close()
            await self.stores.close()
