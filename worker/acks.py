"""The acknowledger: completions are batched into one finish_runs call per queue.

While one flush is in flight, new completions accumulate, so batches grow with load and
latency stays at one round trip when idle. Flushes are shielded from cancellation: an
outcome the worker has computed is never dropped by a shutdown.

A store that is away (unreachable, not yet stamped after a failover) is waited for with the
whole batch. A script that refuses the batch is a bad item, not an outage: the batch is split
until the item is alone, the others are acknowledged, and the item is set aside (REJECTED,
counted in fencepost_quarantined_total{loop="acks"}); its lease lapses and the reaper decides.
Retrying it forever would hold every outcome batched with it, and those slots, with it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict

from fencepost.core import metrics
from fencepost.core.errors import FencepostError, NotStamped, RedisUnavailable
from fencepost.core.hot import Finish, FinishArgs
from fencepost.core.states import DEAD
from fencepost.core.stores import Stores

log = logging.getLogger("fencepost.worker")

__all__ = ["Acknowledger"]


def backoff_ms(attempt: int, base_ms: int, cap_ms: int) -> int:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^(attempt-1))]."""
    return int(random.uniform(0, min(cap_ms, base_ms * 2 ** min(attempt - 1, 30))))


class Acknowledger:
    def __init__(self, stores: Stores) -> None:
        self.stores = stores
        s = stores.settings
        self._base, self._cap, self._quarantine = s.backoff_base_ms, s.backoff_cap_ms, s.quarantine_after
        self._pending: dict[str, list[tuple[Finish, asyncio.Future[str]]]] = defaultdict(list)
        self._flushing: asyncio.Task[None] | None = None

    def add(self, queue: str, run_id: int, token: int, attempt: int, kind: str, data: bytes | str,
            error_class: str, retry_after: float | None = None) -> asyncio.Future[str]:
        """Queue one outcome; the future resolves to the run's new state, 'STALE' (not the run's
        current token) or 'REJECTED' (the script refused this item: set aside, see above)."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if retry_after is not None:  # the dependency said when (rate limit, open breaker): a little jitter only
            delay = int(retry_after * 1000 * random.uniform(1.0, 1.2))
        else:
            delay = backoff_ms(attempt, self._base, self._cap) if kind != "ok" else 0
        self._pending[queue].append((Finish(run_id, token, kind, data, error_class, delay), fut))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.ensure_future(self._flush_loop())
        return fut

    async def _flush_loop(self) -> None:
        while self._pending:
            batches, self._pending = self._pending, defaultdict(list)
            await asyncio.gather(*(asyncio.shield(self._flush(q, items)) for q, items in batches.items()),
                                 return_exceptions=True)

    async def _flush(self, queue: str, items: list[tuple[Finish, asyncio.Future[str]]]) -> None:
        args = FinishArgs(self._quarantine)
        finishes = [item for item, _ in items]
        delay = 0.05
        while True:
            try:
                replies = await self.stores.scripts.finish_runs(self.stores.keys(queue), args, finishes)
                break
            except (RedisUnavailable, NotStamped) as exc:  # the store is away: wait for it
                self._retrying(queue, items, exc)
            except FencepostError as exc:  # the script refused the batch: one item is bad
                await self._isolate(queue, items, exc)
                return
            except Exception as exc:  # anything else unexpected: keep the outcome, try again
                self._retrying(queue, items, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        states = [reply.state for reply in replies]
        stale = [i for i, st in enumerate(states) if st == "STALE"]
        if stale:
            await self._settle_stale(queue, [items[i][0] for i in stale], stale, states)
        for (item, fut), state in zip(items, states):
            if state == "STALE":
                log.warning("late finish of run %s discarded: its token %s is stale", item.id, item.token,
                            extra={"event": "stale_finish", "run_id": item.id})
            if not fut.done():
                fut.set_result(state)

    async def _settle_stale(self, queue: str, finishes: list[Finish], where: list[int], states: list[str]) -> None:
        """A STALE reply can be this very finish, applied by an earlier send whose reply was lost (a
        connection dropped after Redis ran the script, a client-side re-send, a batch refused after
        it had applied some items): the run then still carries our token and is in the state our
        outcome leads to (SUCCEEDED, RETRY_WAIT, TIMED_OUT, or FAILED with our error class; a reaper
        never leads there under our token). Those are reported with their state, not as late."""
        try:
            peeks = await self.stores.scripts.peek(self.stores.keys(queue), [f.id for f in finishes])
        except Exception as exc:  # unknown: reported stale as before
            log.debug("could not read back stale finishes: %s", exc)
            return
        for f, i, peek in zip(finishes, where, peeks):
            if peek is None or peek.token != f.token:
                continue
            if f.outcome == "ok":
                applied = peek.state == "SUCCEEDED"
            elif f.outcome == "interrupted":  # PENDING / PAUSED / STOPPED / CANCELLED: a reaper leads there too
                applied = False
            else:
                applied = peek.state == "RETRY_WAIT" or (peek.state in DEAD
                                                         and (peek.error_class or "") == f.error_class)
            if applied:
                log.info("finish of run %s was already applied by an earlier try (%s)", f.id, peek.state,
                         extra={"event": "finish_applied_earlier", "run_id": f.id})
                states[i] = peek.state

    @staticmethod
    def _retrying(queue: str, items: list[tuple[Finish, asyncio.Future[str]]], exc: Exception) -> None:
        log.warning("finish of %d runs failed, retrying: %s", len(items), exc,
                    extra={"event": "finish_retry", "queue": queue})

    async def _isolate(self, queue: str, items: list[tuple[Finish, asyncio.Future[str]]], exc: Exception) -> None:
        """Halve a refused batch until the bad item is alone. Items a refused call had already
        applied (scripts are not rolled back on error) come back STALE on the retry: their
        outcome is in Redis and its events are in the stream."""
        if len(items) > 1:
            half = len(items) // 2
            await asyncio.gather(self._flush(queue, items[:half]), self._flush(queue, items[half:]))
            return
        (item, fut), = items
        log.error("finish of run %s refused by the store, set aside for the reaper: %s", item.id, exc,
                  extra={"event": "finish_rejected", "queue": queue, "run_id": item.id})
        metrics.QUARANTINED.labels("acks", "finish").inc()
        if not fut.done():
            fut.set_result("REJECTED")

    async def drain(self) -> None:
        while self._flushing is not None and not self._flushing.done():
            await asyncio.shield(self._flushing)
