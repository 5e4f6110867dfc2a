"""What the worker's rooms share: the table of executions it holds, the stop and free-slot events,
each queue's backoff after a store failure, and on Redis Cluster its spare client.

The claimer adds an entry per claimed execution, the runner removes it when the handler ends, the
lease keeper renews what is in it and fences entries off, the watchdog scans it (docs/worker.md,
"Rooms").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Protocol

import msgspec

from fencepost.core import metrics
from fencepost.core.models import Claimed
from fencepost.core.stores import Stores
from fencepost.core.tracing import RunTrace
from fencepost.worker.context import Context

__all__ = ["Backoff", "Execution", "FenceClock", "Held", "Running", "SpareClient"]


class Execution(msgspec.Struct, frozen=True):
    """What one entry of `Worker.running` is: one attempt of one run under one fencing token."""

    run_id: int
    attempt: int
    token: int


class FenceClock(Protocol):
    """The self-fencing decision an entry asks on its context's behalf (worker/leases.LeaseKeeper)."""

    def due(self, entry: Running) -> bool: ...

    def deadline(self, entry: Running) -> float: ...


class Running:
    __slots__ = ("_ended_ev", "claimed_ns", "ctx", "deadline", "ended", "fenced", "fences", "finishing", "forced",
                 "job", "key", "model", "prior", "renewed_at", "stop_seen", "task", "timed_out", "trace", "tracer")

    def __init__(self, fences: FenceClock, job: Claimed, ctx: Context, deadline: float, sent_at: float = 0.0,
                 model: str = "async") -> None:
        self.fences, self.job, self.ctx = fences, job, ctx
        self.key = Execution(job.id, job.attempt, job.token)
        self.model = model
        self.renewed_at = sent_at or time.monotonic()
        """CLOCK_MONOTONIC when the claim, or the last renewal Redis answered 'renewed', was *sent*: the
        lease on Redis runs at least lease_ms from then (the self-fencing clock)."""
        self.fenced: str | None = None
        """Why this worker fenced the execution off (lease | pulse | lost | superseded), else None."""
        self.prior: Running | None = None
        """An older execution of the same run in this worker that must end before this one starts."""
        self.ended = False
        """True once the handler can have no more effects (its task ended; a thread handler's thread returned)."""
        self._ended_ev: asyncio.Event | None = None
        """Made only for a newer attempt of the run that waits for this one to end (wait_ended)."""
        self.claimed_ns = time.time_ns()
        self.trace: RunTrace | None = None
        """Its OpenTelemetry spans, when a tracer is active (fencepost.core.tracing)."""
        self.tracer: Any = None
        """The tracer its claimed batch looked up (run_tracer(), once per batch; None: no spans)."""
        self.task: asyncio.Task[None] | None = None
        self.deadline = deadline
        self.timed_out = False
        self.stop_seen: float | None = None
        self.forced = False
        self.finishing = False
        """Its outcome is on its way to Redis: a renewal racing the finish is not a lost lease."""

    # The context's fence test (Context._fence, a FenceTest): the entry itself, so that a job costs no
    # closures (the objects a running job holds are what the cycle collector traverses, 100 jobs at a time).
    def due(self) -> bool:
        return self.fences.due(self)

    def at(self) -> float:
        return self.fences.deadline(self)

    def set_ended(self) -> None:
        self.ended = True
        if self._ended_ev is not None:
            self._ended_ev.set()

    async def wait_ended(self) -> None:
        if self.ended:
            return
        if self._ended_ev is None:
            self._ended_ev = asyncio.Event()
        await self._ended_ev.wait()


class Held:
    """The executions this worker holds, what it claimed so far, and the two events its loops wait on."""

    def __init__(self) -> None:
        self.running: dict[Execution, Running] = {}
        """What this worker holds a lease for and executes (or is about to), by execution."""
        self.executing: dict[int, Running] = {}
        """Per run, its latest execution in this worker until its handler has ended (fenced ones too)."""
        self.stopping = asyncio.Event()
        self.slot_freed = asyncio.Event()
        self.claimed = 0
        """Executions claimed so far (the claimer counts, the identity heartbeat shows it)."""
        self.last_claim_at: float | None = None

    def request_stop(self) -> None:
        self.stopping.set()
        self.slot_freed.set()

    def drop(self, entry: Running) -> None:
        """The entry no longer holds a slot (ended or fenced off): the claimer may fill it."""
        if self.running.get(entry.key) is entry:
            del self.running[entry.key]
        self.slot_freed.set()


class SpareClient:
    """Redis Cluster: the worker's second client (Stores.spare_redis) for what must not share a client
    with the claims and finishes: probes of failing queues and the identity heartbeat, whose one
    pipeline spans several nodes (one of them dead -> redis-py closes every connection of its client)."""

    def __init__(self, stores: Stores) -> None:
        self.stores = stores
        self._client: Any = None

    def get(self) -> Any:
        if self._client is None:
            self._client = self.stores.spare_redis()
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()


class Backoff:
    """Queues whose last claim or wait failed on an unreachable store: each backs off on its own, so a
    dead shard delays only its own queues (docs/worker.md, "A failing queue backs off alone")."""

    def __init__(self) -> None:
        self.blocked: dict[str, tuple[float, float]] = {}
        """Queue -> (monotonic time to try again, backoff used)."""

    def failed(self, queue: str) -> float:
        """The queue's store failed (a claim or a wait): back off this queue alone (0.25 s doubling to 5 s)."""
        delay = min(max(self.blocked.get(queue, (0.0, 0.125))[1] * 2, 0.25), 5.0)
        self.blocked[queue] = (time.monotonic() + delay, delay)
        metrics.CLAIM_BACKOFF.labels(queue).inc()
        return delay

    def ready(self, queue: str, mono: float) -> bool:
        """Whether the queue may be tried again at `mono` (it never failed, or its backoff is over)."""
        return self.blocked.get(queue, (0.0, 0.0))[0] <= mono
