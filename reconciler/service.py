"""`fencepost reconciler`: the recorder plus the maintenance loops (stamps and rebuilds,
reaper, outbox relay, drift repair, history partitions and run archiving), each a small
component with one job.

Every maintenance step runs once per tick (at most 1 s apart, sooner on an outbox
notification); a step that fails (Redis or PostgreSQL unreachable) is logged and retried
on the next tick, so the service recovers by itself after either store restarts.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any, Awaitable, Callable

from fencepost.core import fairness
from fencepost.core.config import Settings
from fencepost.core.errors import StoreUnavailable
from fencepost.reconciler.retention import Maintenance, parse_archive_after
from fencepost.core.stores import Stores

from fencepost.core.metrics import LEASE_EXPIRIES

from fencepost.reconciler.drift import DriftRepair
from fencepost.reconciler.gauges import Gauges
from fencepost.reconciler.scalehint import ScaleHints
from fencepost.reconciler.outbox import OutboxRelay
from fencepost.reconciler.rebuild import ensure_stamped, untrusted_queues
from fencepost.reconciler.recorder import Recorder

log = logging.getLogger("fencepost.reconciler")


class Reconciler:
    def __init__(self, settings: Settings | None = None, *, tick_s: float = 1.0, drift_grace_s: float = 5.0) -> None:
        self.stores = Stores(settings, db_pool_size=4)
        self.recorder = Recorder(self.stores)
        self.outbox = OutboxRelay(self.stores)
        self.drift = DriftRepair(self.stores, grace_s=drift_grace_s)
        self.gauges = Gauges(self.stores)
        self.scale_hints = ScaleHints(self.stores)
        self.history = Maintenance(self.stores.db,
                                   archive_after=parse_archive_after(self.stores.settings.archive_after))
        self.gauges_every_s = 5.0
        self._observed = 0.0
        self.tick_s = min(tick_s, 1.0)
        self.stop = asyncio.Event()
        self.rebuilt: list[tuple[float, str]] = []
        """(time.time(), queue) of every rebuild this process did."""

    async def _step(self, name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await fn()
        except Exception as exc:  # noqa: BLE001 - the next tick retries
            log.warning("%s failed: %s", name, exc, extra={"event": f"{name}_failed"})
            return None

    async def maintain_once(self) -> None:
        rebuilt = await self._step("rebuild", lambda: ensure_stamped(self.stores))
        self.rebuilt += [(time.time(), q) for q in rebuilt or []]
        queues = await self._step("queues", self.recorder.queues) or []
        now = int(time.time() * 1000)
        for q in queues:
            await self._step("reap", lambda q=q: self._reap(q, now))
        await self._step("outbox", self._relay)
        # A queue another reconciler is rebuilding is left to that rebuild.
        untrusted = await self._step("stamps", lambda: untrusted_queues(self.stores))
        untrusted = set(queues if untrusted is None else untrusted)
        for q in queues:
            if q not in untrusted:
                await self._step("drift", lambda q=q: self.drift.tick(q))
                await self._step("refill", lambda q=q: fairness.refill_held(self.stores, q))
        await self._step("gauges", lambda: self._observe(queues))
        await self._step("scale_hint", lambda: self.scale_hints.observe(queues))
        await self._step("history", self.history.tick)

    async def _reap(self, queue: str, now: int) -> None:
        n = await self.stores.scripts.run("reap_expired", self.stores.keys(queue), [now, 1000])
        if n:
            LEASE_EXPIRIES.labels(queue).inc(n)

    async def _observe(self, queues: list[str]) -> None:
        """Fleet gauges and the stuck-run detector, every `gauges_every_s` (they query PostgreSQL)."""
        if time.monotonic() - self._observed < self.gauges_every_s:
            return
        self._observed = time.monotonic()
        await self.gauges.observe(queues)

    async def _relay(self) -> None:
        if not self.outbox.listening():
            await self.outbox.listen()
        await self.outbox.relay()

    async def _maintain(self) -> None:
        while not self.stop.is_set():
            await self.maintain_once()
            self.outbox.wakeup.clear()
            try:
                await asyncio.wait_for(self.outbox.wakeup.wait(), self.tick_s)
            except TimeoutError:
                pass

    async def _connect(self) -> None:
        """Connect with backoff: a reconciler started while a store is down waits for it."""
        delay = 0.2
        while True:
            try:
                await self.stores.connect()
                return
            except StoreUnavailable as exc:
                if self.stop.is_set():
                    raise
                log.warning("stores unavailable, retrying in %.1fs: %s", delay, exc,
                            extra={"event": "connect_retry"})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        await self._connect()
        await self.stores.check_redis()
        await self._step("outbox_listen", self.outbox.listen)
        log.info("reconciler started", extra={"event": "reconciler_started"})
        try:
            await asyncio.gather(self.recorder.run(self.stop), self._maintain())
        finally:
            await self.outbox.close()
            await self.stores.close()
