"""The waker: the claimer's idle wait. It blocks on the queues' wake lists (a submit, a freed slot,
a resume push them), sets a timer of its own for the earliest delayed or retry-wait run (which
pushes the wake list when it is due: Redis times a BLPOP out only at its own tick), and ends on a
stop, on a claim that outlived its round coming back, or after idle_wait_s."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fencepost.core import hotworker
from fencepost.core.config import Settings
from fencepost.core.hotworker import DueAt
from fencepost.core.stores import Stores
from fencepost.worker.held import Backoff

log = logging.getLogger("fencepost.worker")

__all__ = ["Waker", "server_ms"]


def server_ms(stores: Stores) -> int:
    """The Redis server's clock (ms) as this worker estimates it (Scripts.clock): due times and
    rate windows are on it. This host's clock only before the first estimate (docs/clock.md)."""
    ms = stores.scripts.clock.now_ms()
    return int(time.time() * 1000) if ms is None else int(ms)


class Waker:
    def __init__(self, stores: Stores, queues: list[str], idle_wait_s: float, stopping: asyncio.Event,
                 landed: asyncio.Event, claims: dict[str, Any], backoff: Backoff) -> None:
        self.stores = stores
        self.settings: Settings = stores.settings
        self.queues, self.idle_wait_s = queues, idle_wait_s
        self.stopping, self.landed = stopping, landed
        """landed: set when a claim that outlived its round ends (it may have brought work)."""
        self.claims = claims
        """The claimer's claims in flight, per queue: a queue with one out is left to it."""
        self.backoff = backoff
        self.due_seen: dict[str, int] = {}
        """Per queue, the run_at (ms) up to which delayed runs were already offered to a claim: the
        idle wait sets its timer for the first delayed run after it (`next_due`)."""
        self._rings: set[asyncio.Task[int]] = set()  # RPUSH answers the list's length

    async def next_due(self, queues: list[str] | None = None) -> DueAt | None:
        """The earliest delayed or retry-wait run of our queues that no claim was offered yet, or
        the earliest rate window (queue-wide or a key's with held runs) to free up.
        One pipelined read per idle wait, not per job."""
        queues = self.queues if queues is None else queues
        return await hotworker.due_after(self.stores.redis, [self.stores.keys(q) for q in queues],
                                         [self.due_seen.get(q, 0) for q in queues])

    def ring(self, run_at: int, queue: str) -> None:
        """A delayed run is due: push the queue's wake list so an idle worker (this one, blocked
        on it) claims now. Redis times a BLPOP out only at its own tick (up to 100 ms late)."""
        # everything due by now counts as offered: a queue we cannot claim from (paused, unstamped)
        # is rung once, not once per waiting run
        self.due_seen[queue] = max(self.due_seen.get(queue, 0), run_at, server_ms(self.stores))
        task = asyncio.ensure_future(hotworker.ring_wake(self.stores.redis, self.stores.keys(queue)))
        self._rings.add(task)  # referenced until done, like the escalations
        task.add_done_callback(self._rings.discard)

    async def wait(self) -> None:
        """Block until a wake push (a submit, a freed slot...), the earliest delayed or retry-wait
        run of our queues is due (a timer of our own pushes the wake), a stop, or idle_wait_s.
        Queues backing off after a store failure are left out; on Redis Cluster a queue whose node
        fails its wait backs off alone while the wait goes on for the others."""
        mono = time.monotonic()
        blocked = self.backoff.blocked
        # left out: a queue with a claim still out (that claim waits for it) and on Redis Cluster one
        # whose store failed until a claim answers again (its claims probe it on their own client)
        queues = [q for q in self.queues if self.backoff.ready(q, mono)
                  and q not in self.claims and not (self.settings.redis_cluster and q in blocked)]
        if not queues:  # every queue backs off or has a claim out: until the first may be tried again
            until = min((t for t, _ in blocked.values()), default=mono + self.idle_wait_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_or_landed(), min(max(until - mono, 0.01), self.idle_wait_s))
            return
        timer: asyncio.TimerHandle | None = None
        try:
            timer = await self._arm(queues)
            await self._block(queues)
        except Exception as exc:
            log.debug("idle wait failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.idle_wait_s)
        finally:
            if timer is not None:
                timer.cancel()

    async def _arm(self, queues: list[str]) -> asyncio.TimerHandle | None:
        """The timer that rings the queue of the earliest delayed run due within this wait, if any."""
        try:
            nxt = await self.next_due(queues)
        except Exception as exc:  # a timer is an optimisation: the wait still ends in idle_wait_s
            log.debug("next due read failed: %s", exc)
            return None
        if nxt is None:
            return None
        delay = (nxt.at_ms - server_ms(self.stores)) / 1000  # due times are on the server's clock
        if delay >= self.idle_wait_s:
            return None
        return asyncio.get_running_loop().call_later(max(delay, 0.0), self.ring, nxt.at_ms, nxt.queue)

    async def _block(self, queues: list[str]) -> None:
        """The wait itself: the wake lists' BLPOP(s), the stop and a claim landing, whichever ends first.
        Raises what the store raised when every wait failed (a failover: back off instead of spinning)."""
        redis, keys, idle = self.stores.redis, self.stores.keys, self.idle_wait_s
        waiters: dict[asyncio.Future[Any], list[str]]
        if self.settings.redis_cluster:
            # Redis Cluster: the wake keys of different queues live in different hash slots
            # (usually on different nodes), so one multi-key BLPOP fails with CROSSSLOT. Block
            # on each queue's wake key separately (each BLPOP goes to the node owning that
            # queue's slot) and wake up at the first that returns; the others are cancelled.
            waiters = {asyncio.ensure_future(hotworker.wait_wake(redis, [keys(q)], idle)): [q] for q in queues}
        else:
            waiters = {asyncio.ensure_future(hotworker.wait_wake(redis, [keys(q) for q in queues], idle)): queues}
        stop = asyncio.ensure_future(self.stopping.wait())
        landed = asyncio.ensure_future(self.landed.wait())  # a claim still out came back
        pending: set[asyncio.Future[Any]] = {*waiters, stop, landed}
        failed: BaseException | None = None
        woke = False
        try:
            while not woke and not stop.done() and not landed.done() and pending - {stop, landed}:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for waiter in done:
                    if waiter is stop or waiter is landed or waiter.cancelled():
                        continue
                    err = waiter.exception()  # retrieved here, not logged as an unhandled task error
                    if err is None:
                        woke = True
                    else:
                        failed = err
                        if len(waiters) > 1:  # this node failed: its queues back off, the wait goes on
                            for q in waiters[waiter]:
                                self.backoff.failed(q)
        finally:
            for fut in pending:
                fut.cancel()
        if failed is not None and not woke and not landed.done() and not self.stopping.is_set():
            raise failed

    async def _stop_or_landed(self) -> None:
        """Until a stop is requested or a claim still out comes back."""
        stop = asyncio.ensure_future(self.stopping.wait())
        landed = asyncio.ensure_future(self.landed.wait())
        try:
            await asyncio.wait({stop, landed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            landed.cancel()

    async def queues_empty(self) -> bool:
        """Whether every queue is empty (nothing due, delayed or leased): a burst worker's exit test."""
        return await hotworker.queues_empty(self.stores.redis, [self.stores.keys(q) for q in self.queues])
