"""The watchdog: one scan of the held executions per period instead of a timer per job. It fences
off executions whose lease (or the worker's liveness) could lapse (the lease keeper decides), cancels
async jobs past their timeout, hands executions that ignore a stop to escalation, and then ticks the
liveness pulse: a worker thawed after a freeze fences before it pulses again."""

from __future__ import annotations

import asyncio
import time

from fencepost.worker.escalation import Escalation
from fencepost.worker.held import Held
from fencepost.worker.leases import LeaseKeeper

__all__ = ["Watchdog"]


class Watchdog:
    def __init__(self, held: Held, keeper: LeaseKeeper, escalation: Escalation, period: float = 0.05) -> None:
        self.held, self.keeper, self.escalation = held, keeper, escalation
        self.period = period

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self.scan(time.monotonic())

    def scan(self, now: float) -> None:
        keeper = self.keeper
        for entry in list(self.held.running.values()):
            if not entry.finishing and entry.fenced is None:
                reason = keeper.reason(entry, now)
                if reason is not None:
                    keeper.fence(entry, reason)
                    continue
            if entry.deadline < now and not entry.timed_out and entry.task is not None:
                entry.timed_out = True
                entry.ctx._stop = True
                entry.task.cancel()
            elif entry.stop_seen is not None and not entry.forced and entry.task is not None:
                self.escalation.check(entry, now)
        if keeper.pulse is not None:  # after the fence checks: a thawed worker fences before it pulses again
            keeper.pulse.tick()
