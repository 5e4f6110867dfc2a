"""A worker: a claimer, executors, a lease keeper, an acknowledger and a reaper.

Graceful stop (SIGTERM) = stop claiming, let running jobs finish within the grace
period, give back (release) what is left, flush every outcome.

What runs is keyed by execution (run, attempt, token), never by run alone: a claim for a run
this worker still executes under an older token fences the old execution off and starts the
new attempt only once the old one has ended. A run whose lease (or whose worker's pulse) this
worker could not renew in time is fenced off before the lease can pass to anyone else
(docs/worker.md, "Self-fencing").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from math import inf
from typing import Any

import msgspec

from fencepost.core import metrics
from fencepost.core import workers as fleet
from fencepost.core.config import Settings
from fencepost.core.errors import NotStamped, StoreUnavailable
from fencepost.core.hot import ClaimArgs, EscalateArgs, Lease, ReapArgs, RenewArgs, claim_wait_s
from fencepost.core.models import Claimed
from fencepost.core.queues import declare_queues
from fencepost.core.record import store_definitions
from fencepost.core.registry import Registry
from fencepost.core.stores import Stores
from fencepost.core.tracing import RunTrace, run_tracer, start_run
from fencepost.worker.acks import Acknowledger
from fencepost.worker.breakers import Breakers
from fencepost.worker.checkpoints import Checkpoints
from fencepost.worker.context import Context, SyncContext
from fencepost.worker.executors import Executors, Outcome
from fencepost.worker.liveness import Pulse
from fencepost.worker.progress import RunServicesImpl

log = logging.getLogger("fencepost.worker")

__all__ = ["UNSTAMPED_RECHECK_S", "Worker", "WorkerOptions"]

UNSTAMPED_RECHECK_S = 0.5
"""How often an unstamped queue is asked again (it is skipped, not waited for, in between)."""
CLAIM_ROUND_S = 0.2
"""How long a claim round waits for its claims before going on without the ones still out."""


@dataclass
class WorkerOptions:
    queues: list[str] = field(default_factory=lambda: ["default"])
    concurrency: int = 100
    processes: int = max(os.cpu_count() or 1, 1)
    grace_s: float = 30.0
    lease_ms: int | None = None
    stop_grace_s: float = 30.0
    """How long a stop waits for a handler that does not declare its own grace."""
    heartbeat_s: float = 1.0
    """Lease renewal period (at most a third of the lease): also how fast control flags arrive."""
    idle_wait_s: float = 0.5
    reap_every_s: float = 2.0
    burst: bool = False
    """Exit once every queue is empty and nothing runs (deterministic tests, one-off drains)."""


async def _cancel_all(tasks: list[asyncio.Task[None]], rounds: int = 100) -> None:
    """Cancel the helper loops and wait until they have ended. A cancellation can be swallowed by
    library code a loop is awaiting (seen with a Redis pipeline cancelled mid-call: the loop went
    on to its next sleep and the worker never exited after SIGTERM), so what is still running is
    cancelled again every 50 ms instead of waited for forever."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(rounds):
        if not pending:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.05)
    for t in tasks:
        if t.done() and not t.cancelled():
            t.exception()  # retrieved: a helper's error is not reported again at exit
    if pending:
        log.warning("%d helper loops did not stop", len(pending), extra={"event": "helpers_not_stopped"})


def _band(attempt: int) -> str:
    return str(attempt) if attempt < 3 else "3+"


FENCE_MARGIN_MAX_S = 1.0
"""The self-fencing margin: a fifth of the window (lease or liveness), at most this."""


def fence_margin_s(window_ms: int) -> float:
    """How long before a lease (or the worker's liveness) could lapse on Redis the worker stops the
    run's handler: a fifth of the window, at most FENCE_MARGIN_MAX_S (docs/worker.md)."""
    return min(FENCE_MARGIN_MAX_S, window_ms / 5000)


class Execution(msgspec.Struct, frozen=True):
    """What one entry of `Worker.running` is: one attempt of one run under one fencing token."""

    run_id: int
    attempt: int
    token: int


class _Running:
    __slots__ = ("_ended_ev", "claimed_ns", "ctx", "deadline", "ended", "fenced", "finishing", "forced", "job", "key",
                 "model", "prior", "renewed_at", "stop_seen", "task", "timed_out", "trace", "tracer", "worker")

    def __init__(self, worker: Worker, job: Claimed, ctx: Context, deadline: float, sent_at: float = 0.0,
                 model: str = "async") -> None:
        self.worker, self.job, self.ctx = worker, job, ctx
        self.key = Execution(job.id, job.attempt, job.token)
        self.model = model
        self.renewed_at = sent_at or time.monotonic()
        """CLOCK_MONOTONIC when the claim, or the last renewal Redis answered 'renewed', was *sent*: the
        lease on Redis runs at least lease_ms from then (the self-fencing clock)."""
        self.fenced: str | None = None
        """Why this worker fenced the execution off (lease | pulse | lost | superseded), else None."""
        self.prior: _Running | None = None
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
        return self.worker._fence_due(self)

    def at(self) -> float:
        return self.worker._fence_deadline(self)

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


class Worker:
    def __init__(self, registry: Registry, options: WorkerOptions | None = None, *,
                 settings: Settings | None = None, app: str | None = None, worker_id: str | None = None) -> None:
        self.registry = registry
        self.opts = options or WorkerOptions()
        self.stores = Stores(settings, db_pool_size=2)
        self.settings = self.stores.settings
        self.lease_ms = self.opts.lease_ms or self.settings.lease_ms
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.checkpoints = Checkpoints(self.stores, registry)
        self.services = RunServicesImpl(self.stores)
        """ctx.progress() coalescing (flushed about once a second) and ctx.upstream_results / batch_results."""
        self.executors = Executors(registry, app, threads=self.opts.concurrency,
                                   processes=min(self.opts.processes, self.opts.concurrency),
                                   checkpoints=self.checkpoints)
        self.acks = Acknowledger(self.stores)
        self.breakers = Breakers(self.stores)
        self.m = metrics.Cached()
        self.running: dict[Execution, _Running] = {}
        """What this worker holds a lease for and executes (or is about to), by execution."""
        self._executing: dict[int, _Running] = {}
        """Per run, its latest execution in this worker until its handler has ended (fenced ones too)."""
        self.fenced = 0
        self._pulse: Pulse | None = None
        self._claim_blocked: dict[str, tuple[float, float]] = {}
        """Queues whose last claim or wait failed on an unreachable store -> (monotonic time to try again,
        backoff used): each queue backs off on its own, so a dead shard delays only its own queues."""
        self._degraded_logged: dict[str, float] = {}
        self._lease_margin = fence_margin_s(self.lease_ms)
        self._pulse_margin = fence_margin_s(self.settings.worker_liveness_ms)
        self._escalations: set[asyncio.Task[None]] = set()
        self.lost = 0
        self.claimed = 0
        self.started_at = time.time()
        self.last_claim_at: float | None = None
        self._stopping = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._due_seen: dict[str, int] = {}
        """Per queue, the run_at (ms) up to which delayed runs were already offered to a claim: the
        idle wait sets its timer for the first delayed run after it (`_next_due`)."""
        self._rings: set[asyncio.Task[int]] = set()  # RPUSH answers the list's length
        self._claims: dict[str, asyncio.Task[int]] = {}
        """Per queue, its claim in flight: each queue's claim is a task of its own, so a claim stuck on a
        dead or failing-over Redis Cluster node (seconds inside redis-py) never holds another queue's."""
        self._reserved = 0
        """Slots the claims in flight may fill (their n): counted as taken, so the concurrency limit holds."""
        self._claim_landed = asyncio.Event()
        """Set when a claim that outlived its round ends: the claim loop's idle wait ends with it (it may
        have brought work)."""
        self._outlived: set[str] = set()
        """Queues whose claim in flight outlived the round that started it (CLAIM_ROUND_S)."""
        self._claim_errors: list[BaseException] = []
        self._spare_redis: Any = None
        """Redis Cluster: a client of its own (Stores.spare_redis) through which queues backing off after a
        store failure are probed, so a dead shard's retries and slot-map refreshes inside redis-py
        (seconds, under the client's one refresh lock) never hold the healthy queues' calls."""
        self._unstamped: dict[str, float] = {}
        """Queues whose last claim found no trusted stamp -> when to ask again (monotonic): skipped
        by the round-robin meanwhile, so they never delay the other queues' claims."""

    # -- lifecycle -----------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stopping.set()
        self._slot_freed.set()

    async def _connect(self) -> None:
        """A worker started while Redis or PostgreSQL is down waits for them (with backoff)."""
        delay = 0.2
        while True:
            try:
                await self.stores.connect(database=bool(self.registry.handlers))
                return
            except StoreUnavailable as exc:
                if self._stopping.is_set():
                    raise
                log.warning("waiting for the stores: %s", exc, extra={"event": "worker_waiting"})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def run(self) -> None:
        await self._connect()
        await self.stores.check_redis()
        if self.registry.handlers:  # declare our handlers so producers can validate submits
            await store_definitions(self.stores.db, self.registry.specs())
            await declare_queues(self.stores, self.opts.queues)  # queues we serve exist (stamped) before any job
        await self.executors.start()
        for h in self.registry.handlers.values():
            metrics.HANDLER_INFO.labels(h.spec.name, h.spec.queue, h.spec.owner or "unowned", h.spec.model).set(1)
        await self._seed_retry_budget()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError):
                pass
        log.info("worker %s serving %s (concurrency %d)", self.id, ",".join(self.opts.queues),
                 self.opts.concurrency, extra={"event": "worker_started", "worker_id": self.id})
        pulse = self._pulse = Pulse(self.settings, self.id, self.opts.queues)
        pulse.start()
        helpers = [asyncio.create_task(self._keep_leases()), asyncio.create_task(self._reap()),
                   asyncio.create_task(self._watchdog()), asyncio.create_task(self.breakers.run()),
                   asyncio.create_task(self._observe()), asyncio.create_task(self.services.run())]
        try:
            await self._claim_loop()
            await self._drain()
        finally:
            await _cancel_all(helpers)
            await self.acks.drain()
            await self.services.flush()
            # leaving with nothing leased; anything still leased is reclaimed once the pulse lapses
            await asyncio.to_thread(pulse.stop, leaving=not self.running)
            with contextlib.suppress(Exception):  # else it ages out with its TTL
                await fleet.forget(self.stores, self.id)
            self.m.flush()
            await self.executors.close()
            if self._spare_redis is not None:
                with contextlib.suppress(Exception):
                    await self._spare_redis.aclose()
            await self.stores.close()
            log.info("worker %s stopped", self.id, extra={"event": "worker_stopped", "worker_id": self.id})

    async def _seed_retry_budget(self) -> None:
        """The retry budget is per queue, shared by its workers: a worker only fills in settings the
        queue does not have yet (HSETNX), so workers started with other environments never
        overwrite each other (the last to start used to win); a differing one says so."""
        s = self.settings
        mine = {"budget_ratio": str(s.retry_budget_ratio), "budget_floor": str(s.retry_budget_floor),
                "budget_window_ms": str(s.retry_budget_window_ms)}
        for q in self.opts.queues:
            key = self.stores.keys(q).config
            pipe = self.stores.redis.pipeline(transaction=False)
            for name, value in mine.items():
                pipe.hsetnx(key, name, value)
            pipe.hmget(key, *mine)
            live = dict(zip(mine, (v.decode() if v is not None else None for v in (await pipe.execute())[-1])))
            if any(v is not None and float(v) != float(mine[n]) for n, v in live.items()):
                log.warning("queue %s keeps its retry budget %s; this worker's settings %s are not applied",
                            q, live, mine, extra={"event": "retry_budget_differs", "queue": q, "worker_id": self.id})

    # -- claimer -------------------------------------------------------------------------------
    def _free(self) -> int:
        return self.opts.concurrency - len(self.running) - self.executors.leaked_threads - self._reserved

    async def _claim_loop(self) -> None:
        """Each round starts a claim task for every queue that has none in flight (nor backs off, nor
        waits for its stamp), each reserving its share of the free slots, and waits up to
        CLAIM_ROUND_S for them: a claim still out after that (its node dead or failing over) goes on
        alone while the next rounds serve the other queues. A queue coming back from a store failure
        is probed with one slot until it answers, so a stuck probe holds at most one slot."""
        queues = self.opts.queues
        turn = 0
        idle_rounds = 0
        try:
            while not self._stopping.is_set():
                if self._claim_errors:
                    raise self._claim_errors[0]
                self._claim_landed.clear()
                if self._free() <= 0:
                    self._slot_freed.clear()
                    await self._slot_freed.wait()
                    continue
                mono = time.monotonic()
                ready = [q for q in (queues[(turn + i) % len(queues)] for i in range(len(queues)))
                         if q not in self._claims and self._unstamped.get(q, 0.0) <= mono
                         and self._claim_blocked.get(q, (0.0, 0.0))[0] <= mono]
                turn += 1
                # on Redis Cluster a queue whose store failed is probed first, and a probe takes no slot
                probes = [q for q in ready if self.settings.redis_cluster and q in self._claim_blocked]
                started = [self._start_claim(q, 0) for q in probes]
                claimers = [q for q in ready if q not in probes]
                for i, queue in enumerate(claimers):
                    free = self._free()
                    if free <= 0:
                        break
                    share = -(-free // (len(claimers) - i))  # what is left, split over the queues still to go
                    started.append(self._start_claim(queue, share))
                got = 0
                if started:
                    done, late = await asyncio.wait(started, timeout=CLAIM_ROUND_S)
                    # marked before any of them can end (no await in between): their end wakes the loop
                    self._outlived.update(q for q, t in self._claims.items() if t in late)
                    got = sum(t.result() for t in done)
                    if self._claim_errors:
                        raise self._claim_errors[0]
                if got:
                    idle_rounds = 0
                    continue
                if self._claims and not started and not self._claim_landed.is_set() and self._free() <= 0:
                    continue  # every free slot is reserved by a claim in flight: the top of the loop waits
                if self.opts.burst and not self.running and not self._claims and await self._queues_empty():
                    idle_rounds += 1
                    if idle_rounds >= 2:
                        return
                if not self._claim_landed.is_set():
                    await self._wait_for_work()
        finally:
            if self._claims:  # each is bounded by its claim deadline; what they claim is run, then drained
                await asyncio.wait(list(self._claims.values()))

    def _start_claim(self, queue: str, n: int) -> asyncio.Task[int]:
        self._reserved += n
        task = asyncio.create_task(self._claim_reserved(queue, n))
        self._claims[queue] = task
        return task

    async def _claim_reserved(self, queue: str, n: int) -> int:
        try:
            return await self._claim(queue, n)
        except Exception as exc:  # not a store failure (those are handled in _claim): the loop raises it
            self._claim_errors.append(exc)
            return 0
        finally:
            # the jobs it claimed are in self.running already (added without an await in between)
            self._reserved -= n
            self._claims.pop(queue, None)
            if queue in self._outlived:
                self._outlived.discard(queue)
                self._claim_landed.set()
            self._slot_freed.set()

    def _store_failed(self, queue: str) -> float:
        """The queue's store failed (a claim or a wait): back off this queue alone (0.25 s doubling to 5 s)."""
        delay = min(max(self._claim_blocked.get(queue, (0.0, 0.125))[1] * 2, 0.25), 5.0)
        self._claim_blocked[queue] = (time.monotonic() + delay, delay)
        metrics.CLAIM_BACKOFF.labels(queue).inc()
        return delay

    async def _probe(self, queue: str) -> bool:
        """Redis Cluster: whether the node owning a failed queue's slot answers again (one EXISTS of its
        due set through the spare client, bounded like a claim). It claims nothing and holds no slot:
        once it answers, the queue claims through the main client again."""
        try:
            await asyncio.wait_for(self._spare().exists(self.stores.keys(queue).due), claim_wait_s(self.lease_ms))
        except Exception as exc:  # any failure of the store (refused, timed out, cluster down, moved...)
            delay = self._store_failed(queue)
            log.warning("claim failed: redis unreachable: %s (queue %s backs off %.2fs; the other queues go on)",
                        str(exc) or type(exc).__name__, queue, delay, extra={"event": "claim_failed", "queue": queue})
            return False
        self._claim_blocked.pop(queue, None)
        self._claim_landed.set()  # the loop claims from it at once instead of waiting
        log.info("queue %s answers claims again", queue, extra={"event": "claim_recovered", "queue": queue})
        return True

    def _spare(self) -> Any:
        """Redis Cluster: the worker's second client (Stores.spare_redis) for what must not share a client
        with the claims and finishes: probes of failing queues and the identity heartbeat, whose one
        pipeline spans several nodes (one of them dead -> redis-py closes every connection of its client)."""
        if self._spare_redis is None:
            self._spare_redis = self.stores.spare_redis()
        return self._spare_redis

    async def _claim(self, queue: str, n: int) -> int:
        now = self._server_ms()
        sent = time.monotonic()  # the lease on Redis runs at least lease_ms from here
        keys = self.stores.keys(queue)
        scripts = self.stores.scripts
        if self.settings.redis_cluster and queue in self._claim_blocked:
            await self._probe(queue)  # the next round claims from it if it answered
            return 0
        try:
            # the claim carries a deadline on the server's clock: sent late or re-sent, it claims nothing
            claim_by = await scripts.claim_deadline(claim_wait_s(self.lease_ms))
            args = ClaimArgs(n, self.id, self.lease_ms, max(n, 100), claim_by)
            if self.settings.claim_replicas > 0:
                jobs = await self._claim_durably(queue, args)
            else:
                jobs = await scripts.claim_due(keys, args)
        except NotStamped:
            if queue not in self._unstamped:  # once per state change, not on every round
                log.warning("queue %s is not stamped with the current epoch; not claiming from it until the "
                            "reconciler rebuilds it", queue, extra={"event": "claim_unstamped", "queue": queue})
            self._unstamped[queue] = time.monotonic() + UNSTAMPED_RECHECK_S
            return 0
        except StoreUnavailable as exc:
            delay = self._store_failed(queue)
            log.warning("claim failed: %s (queue %s backs off %.2fs; the other queues go on)", exc, queue, delay,
                        extra={"event": "claim_failed", "queue": queue})
            return 0
        if self._claim_blocked.pop(queue, None) is not None:
            log.info("queue %s answers claims again", queue, extra={"event": "claim_recovered", "queue": queue})
        self._due_seen[queue] = now
        if self._unstamped.pop(queue, None) is not None:
            log.info("queue %s is stamped again; claiming from it", queue,
                     extra={"event": "claim_stamped", "queue": queue})
        count = len(jobs)
        loop = asyncio.get_running_loop()
        tracer = run_tracer() if jobs else None  # once per batch, not per job
        for job in jobs:
            model = self.executors.model(job.handler)
            if model == "async":
                ctx = Context(job.id, job.attempt, job.token, queue, job.handler, job.fire_time, job.trace, self.id,
                              job.gen)
            else:
                ctx = SyncContext(job.id, job.attempt, job.token, queue, job.handler, job.fire_time, job.trace,
                                  self.id, job.gen, loop=loop)
            ctx._writer = self.checkpoints.write
            ctx._services = self.services
            timeout_at = (time.monotonic() + job.timeout_ms / 1000) if model == "async" else inf
            entry = _Running(self, job, ctx, timeout_at, sent, model)
            entry.tracer = tracer
            ctx._fence = entry
            prior = self._executing.get(job.id)
            self._executing[job.id] = entry
            if prior is not None and not prior.ended:
                # this worker still executes an older attempt of the run (its lease passed while it was
                # cut off, frozen or starved, and the run came back here): never two copies at once
                entry.prior = prior
                self._fence(prior, "superseded")
            self.running[entry.key] = entry
            entry.task = asyncio.create_task(self._execute(entry))
        self.claimed += count
        if count:
            self.last_claim_at = time.time()
            self.m.count(metrics.CLAIMED, queue, n=count)
        return count

    async def _claim_durably(self, queue: str, args: ClaimArgs) -> list[Claimed]:
        """Durable-claim mode: each claim is followed by WAIT on its connection for `claim_replicas`
        replicas, so a promoted replica holds every lease an execution runs under.

        With fewer replicas acknowledging in time the worker keeps working, degraded and loudly
        (docs/worker.md, "Durable claims"): the batch runs anyway (releasing it unrun only bumped
        attempt numbers and piled up released attempts, with zero throughput for as long as no
        replica attached), fencepost_claims_unreplicated_total counts its runs,
        fencepost_durable_claims_degraded{queue} is 1, and one warning per queue per minute says so.
        While degraded the WAIT is shortened to 50 ms (it only watches for the replicas' return)."""
        s = self.settings
        degraded = queue in self._degraded_logged
        wait_ms = min(s.claim_wait_ms, 50) if degraded else s.claim_wait_ms
        batch = await self.stores.scripts.claim_due_replicated(self.stores.keys(queue), args, s.claim_replicas, wait_ms)
        if not batch.claimed:
            return batch.claimed
        if batch.replicas >= s.claim_replicas:
            if self._degraded_logged.pop(queue, None) is not None:
                metrics.DURABLE_DEGRADED.labels(queue).set(0)
                log.warning("durable claims of %s reach %d replicas again", queue, batch.replicas,
                            extra={"event": "durable_claims_restored", "queue": queue, "worker_id": self.id})
            return batch.claimed
        metrics.CLAIMS_UNREPLICATED.labels(queue).inc(len(batch.claimed))
        metrics.DURABLE_DEGRADED.labels(queue).set(1)
        now = time.monotonic()
        if now - self._degraded_logged.get(queue, -inf) >= 60.0:
            self._degraded_logged[queue] = now
            log.warning("DURABLE CLAIMS DEGRADED: claims of %s reach %d of FENCEPOST_CLAIM_REPLICAS=%d replicas "
                        "(in %d ms); running them anyway: a failover now may lose their leases (at most once "
                        "per minute; fencepost_durable_claims_degraded)", queue, batch.replicas, s.claim_replicas,
                        wait_ms, extra={"event": "claim_not_replicated", "queue": queue, "worker_id": self.id})
        return batch.claimed

    async def _next_due(self, queues: list[str] | None = None) -> tuple[int, str] | None:
        """The earliest delayed or retry-wait run of our queues that no claim was offered yet, or
        the earliest rate window (queue-wide or a key's with held runs) to free up: (ms, queue).
        One pipelined read per idle wait, not per job."""
        pipe = self.stores.redis.pipeline(transaction=False)
        queues = self.opts.queues if queues is None else queues
        for q in queues:
            keys = self.stores.keys(q)
            for z in (keys.delayed, keys.rwait):
                pipe.zrangebyscore(z, f"({self._due_seen.get(q, 0)}", "+inf", start=0, num=1, withscores=True)
        best: tuple[int, str] | None = None
        heads = await pipe.execute()
        for i, q in enumerate(queues):
            for head in heads[2 * i:2 * i + 2]:
                if head and (best is None or head[0][1] < best[0]):
                    best = (int(head[0][1]), q)
        return best

    def _server_ms(self) -> int:
        """The Redis server's clock (ms) as this worker estimates it (Scripts.clock): due times and
        rate windows are on it. This host's clock only before the first estimate (docs/clock.md)."""
        ms = self.stores.scripts.clock.now_ms()
        return int(time.time() * 1000) if ms is None else int(ms)

    def _ring(self, run_at: int, queue: str) -> None:
        """A delayed run is due: push the queue's wake list so an idle worker (this one, blocked
        on it) claims now. Redis times a BLPOP out only at its own tick (up to 100 ms late)."""
        # everything due by now counts as offered: a queue we cannot claim from (paused, unstamped)
        # is rung once, not once per waiting run
        self._due_seen[queue] = max(self._due_seen.get(queue, 0), run_at, self._server_ms())
        task = asyncio.ensure_future(self.stores.redis.rpush(self.stores.keys(queue).wake, 1))
        self._rings.add(task)  # referenced until done, like the escalations
        task.add_done_callback(self._rings.discard)

    async def _wait_for_work(self) -> None:
        """Block until a wake push (a submit, a freed slot...), the earliest delayed or retry-wait
        run of our queues is due (a timer of our own pushes the wake), a stop, or idle_wait_s.
        Queues backing off after a store failure are left out; on Redis Cluster a queue whose node
        fails its wait backs off alone while the wait goes on for the others."""
        mono = time.monotonic()
        # left out: a queue with a claim still out (that claim waits for it) and on Redis Cluster one
        # whose store failed until a claim answers again (its claims probe it on their own client)
        queues = [q for q in self.opts.queues if self._claim_blocked.get(q, (0.0, 0.0))[0] <= mono
                  and q not in self._claims and not (self.settings.redis_cluster and q in self._claim_blocked)]
        if not queues:  # every queue backs off or has a claim out: until the first may be tried again
            until = min((t for t, _ in self._claim_blocked.values()), default=mono + self.opts.idle_wait_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_or_landed(), min(max(until - mono, 0.01), self.opts.idle_wait_s))
            return
        timer: asyncio.TimerHandle | None = None
        try:
            try:
                nxt = await self._next_due(queues)
            except Exception as exc:  # a timer is an optimisation: the wait below still ends in idle_wait_s
                log.debug("next due read failed: %s", exc)
                nxt = None
            if nxt is not None:
                delay = (nxt[0] - self._server_ms()) / 1000  # due times are on the server's clock
                if delay < self.opts.idle_wait_s:
                    timer = asyncio.get_running_loop().call_later(max(delay, 0.0), self._ring, *nxt)
            waiters: dict[asyncio.Future[Any], list[str]]
            if self.settings.redis_cluster:
                # Redis Cluster: the wake keys of different queues live in different hash slots
                # (usually on different nodes), so one multi-key BLPOP fails with CROSSSLOT. Block
                # on each queue's wake key separately (each BLPOP goes to the node owning that
                # queue's slot) and wake up at the first that returns; the others are cancelled.
                waiters = {asyncio.ensure_future(self.stores.redis.blpop([self.stores.keys(q).wake],
                                                                         timeout=self.opts.idle_wait_s)): [q]
                           for q in queues}
            else:
                waiters = {asyncio.ensure_future(self.stores.redis.blpop([self.stores.keys(q).wake for q in queues],
                                                                         timeout=self.opts.idle_wait_s)): queues}
            stop = asyncio.ensure_future(self._stopping.wait())
            landed = asyncio.ensure_future(self._claim_landed.wait())  # a claim still out came back
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
                                    self._store_failed(q)
            finally:
                for fut in pending:
                    fut.cancel()
            if failed is not None and not woke and not landed.done() and not self._stopping.is_set():
                raise failed  # Redis unreachable (a failover): back off below instead of spinning
        except Exception as exc:
            log.debug("idle wait failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.opts.idle_wait_s)
        finally:
            if timer is not None:
                timer.cancel()

    async def _stop_or_landed(self) -> None:
        """Until a stop is requested or a claim still out comes back."""
        stop = asyncio.ensure_future(self._stopping.wait())
        landed = asyncio.ensure_future(self._claim_landed.wait())
        try:
            await asyncio.wait({stop, landed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            landed.cancel()

    async def _queues_empty(self) -> bool:
        pipe = self.stores.redis.pipeline(transaction=False)
        for q in self.opts.queues:
            k = self.stores.keys(q)
            pipe.zcard(k.due)
            pipe.zcard(k.delayed)
            pipe.zcard(k.active)
        return not any(await pipe.execute())

    # -- executor ------------------------------------------------------------------------------
    async def _execute(self, entry: _Running) -> None:
        job = entry.job
        spec = self.executors.spec(job.handler)
        service = spec.service if spec is not None else None
        probe = False
        started = time.monotonic()
        try:
            try:
                prior = entry.prior
                if prior is not None and not prior.ended:
                    # an older execution of this run is still stopping here: start only once it ended
                    try:
                        await asyncio.wait_for(prior.wait_ended(), job.timeout_ms / 1000)
                    except TimeoutError:  # a thread handler that ignores should_stop(): never run beside it
                        await self._finish(entry, Outcome(
                            "timeout", "an older execution of this run in this worker did not end within the "
                            f"run's timeout of {job.timeout_ms / 1000:g}s", "Timeout"), None)
                        return
                entry.prior = None
                if service is not None:
                    allowed, wait_s, probe = await self.breakers.check(service)
                    if not allowed:  # the dependency is down: wait in RETRY_WAIT, not a failure
                        metrics.DEFERRED.labels(service).inc()
                        await self._finish(entry, Outcome("deferred", f"circuit breaker for {service} is open",
                                                          "BreakerOpen", wait_s), None)
                        return
                if job.attempt > 1:
                    await self.checkpoints.load(entry.ctx)
                self.m.observe(metrics.DISPATCH_LATENCY, time.monotonic() - started, job.queue)
                started = time.monotonic()
                outcome = await self._run_traced(entry)
            except asyncio.CancelledError:
                if entry.forced:
                    outcome = Outcome("interrupted", "forced")
                elif entry.timed_out:
                    outcome = Outcome("timeout", f"exceeded its timeout of {job.timeout_ms / 1000:g}s", "Timeout")
                else:
                    raise
            except ValueError as exc:  # an incompatible checkpoint: never retried blindly
                outcome = Outcome("fatal", str(exc), "IncompatibleCheckpoint")
            if outcome.kind == "lost":
                self._fence(entry, "lost")
                return
            if entry.forced and outcome.kind == "interrupted":
                outcome = Outcome("interrupted", "forced")
            if entry.timed_out and outcome.kind == "ok":  # the handler swallowed the cancellation
                outcome = Outcome("timeout", f"exceeded its timeout of {job.timeout_ms / 1000:g}s", "Timeout")
            if service is not None and (probe or outcome.kind in ("ok", "error", "timeout", "crash")):
                # the dependency answered unless the attempt failed in a way it could cause;
                # a probe always reports, so a half-open breaker never waits out probe_ms
                self.breakers.record(service, outcome.kind not in ("error", "timeout", "crash"), probe)
            self.m.observe(metrics.DURATION, time.monotonic() - started, job.handler, _band(job.attempt))
            await self._finish(entry, outcome, spec.model if spec is not None else "async")
        except asyncio.CancelledError:
            pass
        finally:
            if self.running.get(entry.key) is entry:
                del self.running[entry.key]
            self._slot_freed.set()
            thread = entry.ctx._thread
            if thread is not None and not thread.done():  # a given-up thread handler: ended when it returns
                thread.add_done_callback(partial(self._thread_ended, entry))
            else:
                self._ended(entry)

    def _thread_ended(self, entry: _Running, _thread: Any) -> None:
        self._ended(entry)

    def _ended(self, entry: _Running) -> None:
        """The execution can have no more effects: a newer attempt of its run may start here."""
        entry.set_ended()
        if self._executing.get(entry.job.id) is entry:
            del self._executing[entry.job.id]
        if entry.fenced is not None or entry.finishing:
            # the fence test's answer is settled (fenced: ctx._fenced says True; finishing: False), so the
            # context lets go of the entry: entry and context are then no cycle left to the cycle collector
            entry.ctx._fence = None

    async def _run_traced(self, entry: _Running) -> Outcome:
        """The handler, inside its claim and execution spans when a tracer is active (else as is)."""
        job = entry.job
        rt = start_run(entry.ctx.trace, job.handler, job.queue, job.id, job.attempt, entry.claimed_ns, entry.tracer)
        if rt is None:
            return await self.executors.run(job, entry.ctx)
        entry.trace = rt
        entry.ctx.trace = rt.traceparent  # runs the handler submits are children of its execution span
        try:
            with rt.executing():
                outcome = await self.executors.run(job, entry.ctx)
        except BaseException as exc:
            rt.ended("cancelled", type(exc).__name__)
            raise
        rt.ended(outcome.kind, outcome.error_class)
        return outcome

    async def _finish(self, entry: _Running, outcome: Outcome, model: str | None) -> None:
        job = entry.job
        if outcome.error_kind is not None:
            metrics.ERRORS.labels(job.handler, outcome.error_kind).inc()
            if outcome.error_kind == "rate_limited" and outcome.retry_after:
                await self._throttle(job.queue, outcome.retry_after)
        if entry.forced and model is not None:
            metrics.FORCED.labels(job.handler, model).inc()
        if self.running.get(entry.key) is not entry:  # fenced off meanwhile: its lease is not ours to finish
            return
        reason = self._fence_reason(entry, time.monotonic()) if entry.fenced is None else None
        if reason is not None:  # it ended (seeing should_stop()) after its lease could lapse: fenced, not finished
            self._fence(entry, reason)
            return
        entry.finishing = True
        with entry.trace.finishing() if entry.trace is not None else contextlib.nullcontext():
            state = await self.acks.add(job.queue, job.id, job.token, job.attempt, outcome.kind, outcome.data,
                                        outcome.error_class, outcome.retry_after)
        if state == "STALE":
            metrics.STALE.labels(job.queue, "finish").inc()
            return
        if state == "REJECTED":  # set aside by the acknowledger (counted there); the reaper decides
            return
        self.m.count(metrics.FINISHED, job.queue, job.handler, state)
        if state == "SUCCEEDED":
            self.m.observe(metrics.ATTEMPTS_PER_SUCCESS, job.attempt, job.handler)

    async def _throttle(self, queue: str, retry_after: float) -> None:
        """A dependency said slow down: cap every worker's claims on this queue while it lasts."""
        in_queue = sum(1 for e in self.running.values() if e.job.queue == queue)
        try:
            await self.stores.redis.set(self.stores.keys(queue).throttle, max(1, in_queue // 2),
                                        px=max(int(retry_after * 1000), 1))
            metrics.THROTTLED.labels(queue).inc()
        except Exception as exc:
            log.debug("could not throttle %s: %s", queue, exc)

    # -- gauges --------------------------------------------------------------------------------
    async def _observe(self, period: float = 1.0) -> None:
        """Gauges and the event-loop lag probe (how long a call_soon callback waits)."""
        loop = asyncio.get_running_loop()
        metrics.CONCURRENCY.set(self.opts.concurrency)
        while True:
            t0 = loop.time()
            fut = loop.create_future()
            loop.call_soon(fut.set_result, None)
            await fut
            metrics.LOOP_LAG.observe(loop.time() - t0)
            self.m.flush()
            per_queue = dict.fromkeys(self.opts.queues, 0)
            for e in self.running.values():
                per_queue[e.job.queue] = per_queue.get(e.job.queue, 0) + 1
            for q, n in per_queue.items():
                metrics.RUNNING.labels(q).set(n)
            busy = len(self.running) + self.executors.leaked_threads
            metrics.UTILIZATION.set(busy / self.opts.concurrency)
            metrics.LEAKED.set(self.executors.leaked_threads)
            metrics.POOL_BUSY.labels("thread").set(self.executors.threads_busy + self.executors.leaked_threads)
            metrics.POOL_SIZE.labels("thread").set(self.opts.concurrency)
            if self.executors.procs is not None:
                metrics.POOL_SIZE.labels("process").set(self.executors.procs.size)
                metrics.POOL_BUSY.labels("process").set(self.executors.procs.size - self.executors.procs.idle())
            now = time.time()
            ages = [now - e.ctx.checkpointed_at for e in self.running.values() if e.ctx.checkpointed_at]
            metrics.CHECKPOINT_AGE.set(max(ages) if ages else 0)
            await asyncio.sleep(period)

    # -- watchdog ------------------------------------------------------------------------------
    def _fence_reason(self, entry: _Running, now: float) -> str | None:
        """'lease' or 'pulse' once the execution's lease, or this worker's liveness on its queue, could
        lapse on Redis within the margin (both measured from the *send* time of the last request
        Redis answered, on CLOCK_MONOTONIC: Redis started the window no earlier than that)."""
        if now >= entry.renewed_at + self.lease_ms / 1000 - self._lease_margin:
            return "lease"
        pulse = self._pulse
        sent = pulse.sent_at(entry.job.queue) if pulse is not None else None
        if pulse is not None and sent is not None and now >= sent + pulse.liveness_ms / 1000 - self._pulse_margin:
            return "pulse"
        return None

    def _fence_deadline(self, entry: _Running) -> float:
        """The CLOCK_MONOTONIC instant from which _fence_reason would answer, as things stand (0.0 once
        fenced or finishing): a process-model child checks its clock against it (worker/procpool.py)."""
        if entry.fenced is not None or entry.finishing:
            return 0.0
        at = entry.renewed_at + self.lease_ms / 1000 - self._lease_margin
        pulse = self._pulse
        sent = pulse.sent_at(entry.job.queue) if pulse is not None else None
        if pulse is not None and sent is not None:
            at = min(at, sent + pulse.liveness_ms / 1000 - self._pulse_margin)
        return at

    def _fence_due(self, entry: _Running) -> bool:
        """Asked by the handler's should_stop() and checkpoints: the watchdog's test, on the spot."""
        return entry.fenced is not None or (not entry.finishing
                                            and self._fence_reason(entry, time.monotonic()) is not None)

    async def _watchdog(self, period: float = 0.05) -> None:
        """Self-fence executions whose lease this worker could not keep, and cancel async jobs past
        their timeout: one scan per period instead of a timer per job."""
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for entry in list(self.running.values()):
                if not entry.finishing and entry.fenced is None:
                    reason = self._fence_reason(entry, now)
                    if reason is not None:
                        self._fence(entry, reason)
                        continue
                if entry.deadline < now and not entry.timed_out and entry.task is not None:
                    entry.timed_out = True
                    entry.ctx._stop = True
                    entry.task.cancel()
                elif entry.stop_seen is not None and not entry.forced and entry.task is not None:
                    grace = self._grace(entry.job.handler)
                    if now - entry.stop_seen > grace:
                        entry.forced = True
                        task = asyncio.ensure_future(self._escalate(entry, grace))
                        self._escalations.add(task)  # a task nobody references can be collected mid-run
                        task.add_done_callback(self._escalations.discard)
            if self._pulse is not None:  # after the fence checks: a thawed worker fences before it pulses again
                self._pulse.tick()

    def _grace(self, handler: str) -> float:
        h = self.registry.handlers.get(handler)
        declared = h.spec.stop_grace_s if h is not None else None
        return self.opts.stop_grace_s if declared is None else declared

    async def _escalate(self, entry: _Running, grace: float) -> None:
        """The handler ignored a stop for its whole grace period: record it, then stop it by
        force (kill the process job; cancel an async one; give a thread up as a leaked slot)."""
        job = entry.job
        log.warning("run %s ignored stop for %.0fs; forcing", job.id, grace,
                    extra={"event": "stop_escalated", "run_id": job.id, "attempt": job.attempt, "worker_id": self.id})
        try:
            args = EscalateArgs(job.id, job.token, self.id, f"{grace:g}")
            await self.stores.scripts.escalate_stop(self.stores.keys(job.queue), args)
        except Exception as exc:
            log.warning("could not record stop escalation of run %s: %s", job.id, exc)
        if entry.task is not None:
            entry.task.cancel()

    # -- lease keeper --------------------------------------------------------------------------
    async def _keep_leases(self) -> None:
        period = min(self.lease_ms / 3000, self.opts.heartbeat_s)
        while True:
            with contextlib.suppress(TimeoutError):  # the operator's view only: never holds the renewals
                await asyncio.wait_for(self._announce(period), max(2 * period, 0.5))
            await asyncio.sleep(period)
            by_queue: dict[str, list[_Running]] = {}
            for entry in list(self.running.values()):
                if not entry.finishing:
                    by_queue.setdefault(entry.job.queue, []).append(entry)
            for queue, entries in by_queue.items():
                leases = [Lease(e.job.id, e.job.token) for e in entries]
                t0 = time.monotonic()
                try:
                    # bounded: a blackholed link must not hold the keeper (the watchdog fences meanwhile)
                    replies = await asyncio.wait_for(self.stores.scripts.renew_leases(
                        self.stores.keys(queue), RenewArgs(self.lease_ms), leases), max(2 * period, 0.5))
                    metrics.HEARTBEAT.labels(queue).observe(time.monotonic() - t0)
                    metrics.RENEWALS.labels(queue).inc(sum(1 for r in replies if not r.lost))
                except Exception as exc:
                    log.warning("lease renewal failed: %s", str(exc) or type(exc).__name__,
                                extra={"event": "renew_failed", "queue": queue})
                    continue
                for e, reply in zip(entries, replies):
                    if e.fenced is not None or e.finishing or self.running.get(e.key) is not e:
                        continue  # finished (or fenced) while the renewal was on its way: not a lost lease
                    if reply.lost:
                        metrics.LEASES_LOST.labels(queue).inc()
                        self._fence(e, "lost")
                        continue
                    e.renewed_at = max(e.renewed_at, t0)
                    if reply.ctl is not None:
                        e.ctx._ctl = reply.ctl
                        if e.ctx._ctl in ("stop", "cancel") and e.stop_seen is None:
                            e.stop_seen = time.monotonic()

    async def _announce(self, period: float) -> None:
        """The identity operators see (`fencepost workers`, GET /v1/workers), one pipeline per heartbeat;
        the same round trip brings an operator's stop request, answered by a graceful stop."""
        info = fleet.WorkerInfo(
            id=self.id, host=socket.gethostname(), pid=os.getpid(), version=fleet.software_version(),
            queues=list(self.opts.queues), concurrency=self.opts.concurrency, started_at=self.started_at,
            seen_at=time.time(), claimed=self.claimed, last_claim_at=self.last_claim_at,
            running=[fleet.HeldRun(e.job.id, e.job.queue, e.job.handler, e.job.attempt) for e in self.running.values()])
        try:
            stop = await fleet.heartbeat(self.stores, info, ttl_s=max(5, int(period * 5) + 1),
                                         redis=self._spare() if self.settings.redis_cluster else None)
        except Exception as exc:  # the operator's view only: never a reason to stop working
            log.debug("identity heartbeat failed: %s", exc)
            return
        if stop is not None and not self._stopping.is_set():
            log.warning("stop requested by %s (%s): draining", stop.actor, stop.reason or "no reason given",
                        extra={"event": "worker_stop_requested", "worker_id": self.id})
            self.request_stop()

    def _fence(self, entry: _Running, reason: str) -> None:
        """Stop an execution and never finish it: `reason` lost (Redis says another attempt owns the
        run), lease or pulse (this worker could not renew in time: the lease may pass any moment),
        superseded (a newer attempt of the run reached this worker). should_stop() turns True and
        checkpoints are refused; an async handler is cancelled; a process child is killed; a thread
        cannot be killed: it is abandoned (counted) and a newer attempt here waits until it returns."""
        if entry.fenced is not None:
            return
        entry.fenced = reason
        job = entry.job
        fields = {"run_id": job.id, "attempt": job.attempt, "worker_id": self.id, "token": job.token,
                  "queue": job.queue, "reason": reason}
        if reason == "lost":
            self.lost += 1
            log.warning("lost lease on run %s (token %s); abandoning it", job.id, job.token,
                        extra={"event": "lease_lost", **fields})
        elif reason == "superseded":
            log.warning("run %s came back to this worker as attempt %d while attempt %d (token %s) still ran "
                        "here; stopping the old execution before the new one starts", job.id,
                        self._executing[job.id].job.attempt if job.id in self._executing else job.attempt + 1,
                        job.attempt, job.token, extra={"event": "attempt_superseded", **fields})
        else:
            self.fenced += 1
            since = time.monotonic() - entry.renewed_at
            log.warning("could not renew the %s of run %s (token %s) in time (last renewal sent %.2fs ago); "
                        "stopping its handler before the lease can pass to another worker",
                        "lease" if reason == "lease" else "worker's liveness pulse", job.id, job.token, since,
                        extra={"event": "self_fenced", **fields})
        metrics.SELF_FENCED.labels(job.queue, entry.model, reason).inc()
        if entry.model == "thread" and entry.task is not None and not entry.task.done():
            metrics.THREADS_ABANDONED.labels(job.queue).inc()
            log.warning("run %s (token %s) runs in a thread, which cannot be killed: thread handler abandoned "
                        "(should_stop() is True, its checkpoints are refused)", job.id, job.token,
                        extra={"event": "thread_abandoned", **fields})
        entry.ctx._stop = True
        entry.ctx._fenced = True
        if self.running.get(entry.key) is entry:
            del self.running[entry.key]
        if entry.task is not None:
            entry.task.cancel()
        self._slot_freed.set()

    # -- reaper --------------------------------------------------------------------------------
    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(self.opts.reap_every_s)
            for q in self.opts.queues:
                if q in self._claim_blocked:  # its store failed: reaped once its claims answer again
                    continue
                try:
                    n = await self.stores.scripts.reap_expired(self.stores.keys(q),
                                                               ReapArgs(500, self.settings.max_interruptions))
                    if n:
                        metrics.LEASE_EXPIRIES.labels(q).inc(n)
                except Exception as exc:
                    log.debug("reap failed: %s", exc)

    # -- shutdown ------------------------------------------------------------------------------
    async def _drain(self) -> None:
        if not self.running:
            return
        tasks = [e.task for e in self.running.values() if e.task is not None]
        log.info("stopping: waiting up to %.0fs for %d running jobs", self.opts.grace_s, len(tasks),
                 extra={"event": "worker_draining", "worker_id": self.id})
        for e in self.running.values():
            e.ctx._stop = True
        await asyncio.wait(tasks, timeout=self.opts.grace_s)
        left = list(self.running.values())
        if not left:
            return
        by_queue: dict[str, list[_Running]] = {}
        for e in left:
            by_queue.setdefault(e.job.queue, []).append(e)
            if e.task is not None:
                e.task.cancel()
        for queue, entries in by_queue.items():
            leases = [Lease(e.job.id, e.job.token) for e in entries]
            try:
                n = await self.stores.scripts.release_runs(self.stores.keys(queue), leases)
                log.info("released %d runs of %s", n, queue, extra={"event": "runs_released", "queue": queue})
            except Exception as exc:
                log.warning("release failed (%s); leases will expire instead", exc)
        self.running.clear()
