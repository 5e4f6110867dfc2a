"""The claimer: claims due runs into the free slots, one claim task per queue, and hands each claimed
execution to the runner. Idle, it waits with the waker (worker/waker.py).

Each queue's claim is a task of its own, so a claim stuck on a dead or failing-over Redis Cluster node
(seconds inside redis-py) never holds another queue's. A queue whose store failed backs off alone; a
queue Redis has not stamped with the current epoch is skipped until it is (docs/worker.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from math import inf
from typing import Any

from fencepost.core import hotworker, metrics
from fencepost.core.errors import NotStamped, StoreUnavailable
from fencepost.core.hot import ClaimArgs, claim_wait_s
from fencepost.core.metrics import Cached
from fencepost.core.models import Claimed
from fencepost.core.stores import Stores
from fencepost.core.tracing import run_tracer
from fencepost.worker.checkpoints import Checkpoints
from fencepost.worker.context import Context, SyncContext
from fencepost.worker.executors import Executors
from fencepost.worker.held import Backoff, Held, Running, SpareClient
from fencepost.worker.leases import LeaseKeeper
from fencepost.worker.progress import RunServicesImpl
from fencepost.worker.waker import Waker, server_ms

log = logging.getLogger("fencepost.worker")

__all__ = ["CLAIM_ROUND_S", "Claimer"]

CLAIM_ROUND_S = 0.2
"""How long a claim round waits for its claims before going on without the ones still out."""


class Claimer:
    def __init__(self, stores: Stores, held: Held, keeper: LeaseKeeper, executors: Executors,
                 checkpoints: Checkpoints, services: RunServicesImpl,
                 execute: Callable[[Running], Coroutine[Any, Any, None]], m: Cached, spare: SpareClient, *,
                 worker_id: str, queues: list[str], concurrency: int, lease_ms: int, idle_wait_s: float,
                 burst: bool, unstamped_recheck_s: float) -> None:
        self.stores, self.settings, self.held, self.keeper = stores, stores.settings, held, keeper
        self.executors, self.checkpoints, self.services = executors, checkpoints, services
        self.execute = execute
        """The runner's execution of one claimed entry (worker/runner.py), started as its task."""
        self.m, self.spare = m, spare
        self.worker_id, self.queues, self.concurrency, self.lease_ms = worker_id, queues, concurrency, lease_ms
        self.burst, self.unstamped_recheck_s = burst, unstamped_recheck_s
        self.backoff = Backoff()
        self.claims: dict[str, asyncio.Task[int]] = {}
        """Per queue, its claim in flight."""
        self.reserved = 0
        """Slots the claims in flight may fill (their n): counted as taken, so the concurrency limit holds."""
        self.landed = asyncio.Event()
        """Set when a claim that outlived its round ends: the claim loop's idle wait ends with it (it may
        have brought work)."""
        self._outlived: set[str] = set()
        """Queues whose claim in flight outlived the round that started it (CLAIM_ROUND_S)."""
        self._errors: list[BaseException] = []
        self._degraded_logged: dict[str, float] = {}
        self.unstamped: dict[str, float] = {}
        """Queues whose last claim found no trusted stamp -> when to ask again (monotonic): skipped
        by the round-robin meanwhile, so they never delay the other queues' claims."""
        self.waker = Waker(stores, queues, idle_wait_s, held.stopping, self.landed, self.claims, self.backoff)

    def free(self) -> int:
        return self.concurrency - len(self.held.running) - self.executors.leaked_threads - self.reserved

    async def run(self) -> None:
        """Until a stop (or, in burst mode, until every queue is empty and nothing runs). Each round
        starts a claim task for every queue that has none in flight (nor backs off, nor waits for
        its stamp), each reserving its share of the free slots, and waits up to CLAIM_ROUND_S for
        them: a claim still out after that (its node dead or failing over) goes on alone while the
        next rounds serve the other queues."""
        turn = 0
        idle_rounds = 0
        stopping, slot_freed = self.held.stopping, self.held.slot_freed
        try:
            while not stopping.is_set():
                if self._errors:
                    raise self._errors[0]
                self.landed.clear()
                if self.free() <= 0:
                    slot_freed.clear()
                    await slot_freed.wait()
                    continue
                started = self._start_round(turn)
                turn += 1
                got = 0
                if started:
                    done, late = await asyncio.wait(started, timeout=CLAIM_ROUND_S)
                    # marked before any of them can end (no await in between): their end wakes the loop
                    self._outlived.update(q for q, t in self.claims.items() if t in late)
                    got = sum(t.result() for t in done)
                    if self._errors:
                        raise self._errors[0]
                if got:
                    idle_rounds = 0
                    continue
                if self.claims and not started and not self.landed.is_set() and self.free() <= 0:
                    continue  # every free slot is reserved by a claim in flight: the top of the loop waits
                if self.burst and not self.held.running and not self.claims and await self.waker.queues_empty():
                    idle_rounds += 1
                    if idle_rounds >= 2:
                        return
                if not self.landed.is_set():
                    await self.waker.wait()
        finally:
            if self.claims:  # each is bounded by its claim deadline; what they claim is run, then drained
                await asyncio.wait(list(self.claims.values()))

    def _start_round(self, turn: int) -> list[asyncio.Task[int]]:
        """One round's claim tasks, round-robin from `turn`. A queue coming back from a store failure
        is probed with one slot until it answers (on Redis Cluster with none), so a stuck probe holds
        at most one slot."""
        queues = self.queues
        mono = time.monotonic()
        ready = [q for q in (queues[(turn + i) % len(queues)] for i in range(len(queues)))
                 if q not in self.claims and self.unstamped.get(q, 0.0) <= mono and self.backoff.ready(q, mono)]
        # on Redis Cluster a queue whose store failed is probed first, and a probe takes no slot
        probes = [q for q in ready if self.settings.redis_cluster and q in self.backoff.blocked]
        started = [self._start_claim(q, 0) for q in probes]
        claimers = [q for q in ready if q not in probes]
        for i, queue in enumerate(claimers):
            free = self.free()
            if free <= 0:
                break
            share = -(-free // (len(claimers) - i))  # what is left, split over the queues still to go
            started.append(self._start_claim(queue, share))
        return started

    def _start_claim(self, queue: str, n: int) -> asyncio.Task[int]:
        self.reserved += n
        task = asyncio.create_task(self._claim_reserved(queue, n))
        self.claims[queue] = task
        return task

    async def _claim_reserved(self, queue: str, n: int) -> int:
        try:
            return await self._claim(queue, n)
        except Exception as exc:  # not a store failure (those are handled in _claim): the loop raises it
            self._errors.append(exc)
            return 0
        finally:
            # the jobs it claimed are in held.running already (added without an await in between)
            self.reserved -= n
            self.claims.pop(queue, None)
            if queue in self._outlived:
                self._outlived.discard(queue)
                self.landed.set()
            self.held.slot_freed.set()

    async def _probe(self, queue: str) -> bool:
        """Redis Cluster: whether the node owning a failed queue's slot answers again (one EXISTS of its
        due set through the spare client, bounded like a claim). It claims nothing and holds no slot:
        once it answers, the queue claims through the main client again."""
        try:
            await asyncio.wait_for(hotworker.probe_queue(self.spare.get(), self.stores.keys(queue)),
                                   claim_wait_s(self.lease_ms))
        except Exception as exc:  # any failure of the store (refused, timed out, cluster down, moved...)
            delay = self.backoff.failed(queue)
            log.warning("claim failed: redis unreachable: %s (queue %s backs off %.2fs; the other queues go on)",
                        str(exc) or type(exc).__name__, queue, delay, extra={"event": "claim_failed", "queue": queue})
            return False
        self.backoff.blocked.pop(queue, None)
        self.landed.set()  # the loop claims from it at once instead of waiting
        log.info("queue %s answers claims again", queue, extra={"event": "claim_recovered", "queue": queue})
        return True

    async def _claim(self, queue: str, n: int) -> int:
        """One claim of up to n runs of the queue: never waits (tests/test_queues.py finds it by this
        name and checks it sleeps for nothing); a store failure or a missing stamp claims nothing."""
        now = server_ms(self.stores)
        sent = time.monotonic()  # the lease on Redis runs at least lease_ms from here
        if self.settings.redis_cluster and queue in self.backoff.blocked:
            await self._probe(queue)  # the next round claims from it if it answered
            return 0
        try:
            # the claim carries a deadline on the server's clock: sent late or re-sent, it claims nothing
            claim_by = await self.stores.scripts.claim_deadline(claim_wait_s(self.lease_ms))
            args = ClaimArgs(n, self.worker_id, self.lease_ms, max(n, 100), claim_by)
            if self.settings.claim_replicas > 0:
                jobs = await self._claim_durably(queue, args)
            else:
                jobs = await self.stores.scripts.claim_due(self.stores.keys(queue), args)
        except NotStamped:
            if queue not in self.unstamped:  # once per state change, not on every round
                log.warning("queue %s is not stamped with the current epoch; not claiming from it until the "
                            "reconciler rebuilds it", queue, extra={"event": "claim_unstamped", "queue": queue})
            self.unstamped[queue] = time.monotonic() + self.unstamped_recheck_s
            return 0
        except StoreUnavailable as exc:
            delay = self.backoff.failed(queue)
            log.warning("claim failed: %s (queue %s backs off %.2fs; the other queues go on)", exc, queue, delay,
                        extra={"event": "claim_failed", "queue": queue})
            return 0
        if self.backoff.blocked.pop(queue, None) is not None:
            log.info("queue %s answers claims again", queue, extra={"event": "claim_recovered", "queue": queue})
        self.waker.due_seen[queue] = now
        if self.unstamped.pop(queue, None) is not None:
            log.info("queue %s is stamped again; claiming from it", queue,
                     extra={"event": "claim_stamped", "queue": queue})
        count = len(jobs)
        if count:
            self._admit(jobs, queue, sent)
            self.held.claimed += count
            self.held.last_claim_at = time.time()
            self.m.count(metrics.CLAIMED, queue, n=count)
        return count

    def _admit(self, jobs: list[Claimed], queue: str, sent: float) -> None:
        """Each claimed execution into the table and onto its task (no await: a claim's jobs are all in
        held.running before anything else runs)."""
        loop = asyncio.get_running_loop()
        tracer = run_tracer()  # once per batch, not per job
        held, keeper = self.held, self.keeper
        for job in jobs:
            model = self.executors.model(job.handler)
            if model == "async":
                ctx = Context(job.id, job.attempt, job.token, queue, job.handler, job.fire_time, job.trace,
                              self.worker_id, job.gen)
            else:
                ctx = SyncContext(job.id, job.attempt, job.token, queue, job.handler, job.fire_time, job.trace,
                                  self.worker_id, job.gen, loop=loop)
            ctx._writer = self.checkpoints.write
            ctx._services = self.services
            timeout_at = (time.monotonic() + job.timeout_ms / 1000) if model == "async" else inf
            entry = Running(keeper, job, ctx, timeout_at, sent, model)
            entry.tracer = tracer
            ctx._fence = entry
            prior = held.executing.get(job.id)
            held.executing[job.id] = entry
            if prior is not None and not prior.ended:
                # this worker still executes an older attempt of the run (its lease passed while it was
                # cut off, frozen or starved, and the run came back here): never two copies at once
                entry.prior = prior
                keeper.fence(prior, "superseded")
            held.running[entry.key] = entry
            entry.task = asyncio.create_task(self.execute(entry))

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
                            extra={"event": "durable_claims_restored", "queue": queue, "worker_id": self.worker_id})
            return batch.claimed
        metrics.CLAIMS_UNREPLICATED.labels(queue).inc(len(batch.claimed))
        metrics.DURABLE_DEGRADED.labels(queue).set(1)
        now = time.monotonic()
        if now - self._degraded_logged.get(queue, -inf) >= 60.0:
            self._degraded_logged[queue] = now
            log.warning("DURABLE CLAIMS DEGRADED: claims of %s reach %d of FENCEPOST_CLAIM_REPLICAS=%d replicas "
                        "(in %d ms); running them anyway: a failover now may lose their leases (at most once "
                        "per minute; fencepost_durable_claims_degraded)", queue, batch.replicas, s.claim_replicas,
                        wait_ms, extra={"event": "claim_not_replicated", "queue": queue, "worker_id": self.worker_id})
        return batch.claimed
