"""Reconcilers as replicas split the queues instead of each doing all of them (issue 23 item 5).

Two reconcilers reading one queue's stream through its consumer group each got half of every batch:
a job's claim and its finish often went to different recorders (its attempt row written twice, the
second by the slower lookup), every statement was paid per half batch, and both ran every drift tick.
With a reconciler beside each of two workers the drain fell to x0.77 of one reconciler's (issue 23),
x0.55-0.88 here (bench/throughput.py --reconcilers 2).

Each reconciler says it is alive in one Redis set (lua/reconcilers_live.lua, on the server's clock) and
reads the members alive; a queue belongs to the member that ranks first for it by rendezvous hashing
(highest hash of queue and member), so every reconciler computes the same split from the same set, and
a member joining or leaving moves only its own share. A queue's stream is read, and its drift ticked,
by its owner; the other maintenance loops are cheap or locked and run everywhere as before.

Nothing here is needed for correctness: two recorders on one stream record it exactly once (the
consumer group, compare-and-set on versions, transitions locked in one order), so whenever the split is
unknown (Redis unreachable, this member not yet in the set) a reconciler takes every queue, as before.
A reconciler that dies leaves the set after `liveness_s` (3 s) and its queues go to the others (restarted
under its name, FENCEPOST_RECORDER_ID or the host's, it takes its place back at once); entries
it had read and not acknowledged are adopted by the survivors after the recorder's claim_idle_ms, as
before. The service says it is alive from a loop of its own every `refresh_s` (0.5 s), so a long batch
does not drop it from the set; one that drops out anyway (a stalled event loop) only makes two
reconcilers read its queues until it is back, which is what they did before.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import socket
import time
from collections.abc import Iterable

from fencepost.core.hot import ReconcilerArgs
from fencepost.core.keys import RECONCILERS_KEY
from fencepost.core.stores import Stores

__all__ = ["Shares", "owner", "reconciler_id"]

log = logging.getLogger("fencepost.reconciler")


def reconciler_id() -> str:
    """This reconciler's name: its recorder's consumer name in the streams' group and its member name in
    the live set. Stable across restarts of one host or container (FENCEPOST_RECORDER_ID, else the host
    name), so a restarted reconciler re-reads its own pending entries and takes its own place in the set
    at once, instead of waiting for its dead incarnation's liveness to run out. Replicas on one host need
    an id each (the same name is one member: both read every queue, as before the split)."""
    return os.environ.get("FENCEPOST_RECORDER_ID") or socket.gethostname()


def _rank(queue: str, member: str) -> bytes:
    return hashlib.blake2b(f"{queue}\0{member}".encode(), digest_size=8).digest()


def owner(queue: str, live: Iterable[str]) -> str:
    """The live member a queue belongs to (rendezvous hashing: the same answer on every member)."""
    return max(live, key=lambda m: (_rank(queue, m), m))


class Shares:
    """This reconciler's share of the queues. `refresh` (at most every `refresh_s`) says it is alive
    and reads who else is; `mine` keeps the queues it owns (all of them while the split is unknown)."""

    def __init__(self, stores: Stores, *, member: str | None = None, liveness_s: float = 3.0,
                 refresh_s: float = 0.5, enabled: bool = True) -> None:
        self.stores = stores
        self.member = member or reconciler_id()
        self.liveness_s = liveness_s
        self.refresh_s = refresh_s
        self.enabled = enabled
        """False: every queue is this reconciler's (one-shot use: `Reconciler.maintain_once`, tests); the
        service enables the split when it starts."""
        self.live: tuple[str, ...] | None = None
        """The members alive at the last refresh; None: unknown (every queue is this reconciler's)."""
        self._at = -math.inf

    async def refresh(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._at < self.refresh_s):
            return
        self._at = now
        try:
            live = await self.stores.scripts.reconcilers_live(
                RECONCILERS_KEY(self.stores.settings.prefix), ReconcilerArgs(self.member, int(self.liveness_s * 1000)))
        except Exception as exc:  # Redis away: take every queue until the split is known again
            if self.live is not None:
                log.info("reconciler split unknown (%s): taking every queue", exc, extra={"event": "shares_unknown"})
            self.live = None
            return
        self.live = tuple(sorted(live))

    def mine(self, queues: Iterable[str]) -> list[str]:
        live = self.live
        if not self.enabled or not live or self.member not in live or len(live) == 1:
            return list(queues)
        return [q for q in queues if owner(q, live) == self.member]

    async def leave(self) -> None:
        """Leave the set at a graceful stop, so the others take this share at their next refresh."""
        try:
            await self.stores.scripts.reconcilers_live(RECONCILERS_KEY(self.stores.settings.prefix),
                                                       ReconcilerArgs(self.member, 0))
        except Exception as exc:
            log.debug("leaving the reconciler set failed (%s): it expires after %.0f s", exc, self.liveness_s)
        self.live = None
