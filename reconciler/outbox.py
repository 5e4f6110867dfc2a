"""Relay for runs submitted inside a producer's transaction: PostgreSQL NOTIFYs on
commit (never before), and this moves those runs to Redis; a periodic pass catches any
notification missed while the relay was down."""

from __future__ import annotations

import asyncio
import logging

from fencepost.core.models import RunRow, run_row
from fencepost.core.record import Listener
from fencepost.core.stores import Stores
from fencepost.reconciler.drift import POISON, DriftRepair, holdable

log = logging.getLogger("fencepost.reconciler")

CHANNEL = "fencepost_outbox"


class OutboxRelay:
    def __init__(self, stores: Stores) -> None:
        self.stores = stores
        self.wakeup = asyncio.Event()
        self.relayed = 0
        self._conn: Listener | None = None
        self._isolation = DriftRepair(stores, loop="outbox")
        """Quarantines a run Redis cannot hold (drift.py), so one such run never blocks the relay."""

    def listening(self) -> bool:
        return self._conn is not None and self._conn.alive()

    async def listen(self) -> None:
        """(Re)open the LISTEN connection; a notification missed while it was down is caught
        by the periodic relay pass."""
        if self._conn is not None:
            self._conn.terminate()
        self._conn = None
        self._conn = await self.stores.db.listen(CHANNEL, self.wakeup.set, timeout=5)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def relay(self) -> int:
        db = self.stores.db
        moved = 0
        for row in await db.rows("outbox_queues"):
            queue = row.queue
            while True:
                rows = await db.rows("outbox_runs", queue, 1000)
                if not rows:
                    break
                batch: list[RunRow] = []
                bad: dict[int, str] = {}
                for r in rows:
                    try:
                        batch.append(holdable(run_row(r, queue=queue)))
                    except POISON as exc:
                        bad[r.id] = f"{type(exc).__name__}: {exc}"
                await self._isolation.enqueue_isolated(queue, batch, bad)
                if bad:
                    await self._isolation.quarantine(queue, bad)
                await db.execute("clear_outbox", [r.id for r in rows])
                moved += len(rows)
        self.relayed += moved
        return moved
