"""A worker: a small composition of rooms with one job each (docs/worker.md, "Rooms"): the claimer
(and its waker), the runner, the lease keeper (renewals and the self-fencing decision), the watchdog,
escalation, the acknowledger, the reaper, the gauges and the identity heartbeat. This module wires
them, starts them and stops them.

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
import uuid
from dataclasses import dataclass, field

from fencepost.core import hotworker, metrics
from fencepost.core import workers as fleet
from fencepost.core.config import Settings
from fencepost.core.errors import StoreUnavailable
from fencepost.core.hot import Lease
from fencepost.core.queues import declare_queues
from fencepost.core.record import store_definitions
from fencepost.core.registry import Registry
from fencepost.core.stores import Stores
from fencepost.worker.acks import Acknowledger
from fencepost.worker.breakers import Breakers
from fencepost.worker.checkpoints import Checkpoints
from fencepost.worker.claimer import Claimer
from fencepost.worker.escalation import Escalation
from fencepost.worker.executors import Executors
from fencepost.worker.gauges import Gauges
from fencepost.worker.held import Execution, Held, Running, SpareClient
from fencepost.worker.identity import Identity
from fencepost.worker.leases import LeaseKeeper, fence_margin_s
from fencepost.worker.liveness import Pulse
from fencepost.worker.progress import RunServicesImpl
from fencepost.worker.reaper import Reaper
from fencepost.worker.runner import Runner
from fencepost.worker.watchdog import Watchdog

log = logging.getLogger("fencepost.worker")

__all__ = ["UNSTAMPED_RECHECK_S", "Execution", "Worker", "WorkerOptions", "fence_margin_s"]

UNSTAMPED_RECHECK_S = 0.5
"""How often an unstamped queue is asked again (it is skipped, not waited for, in between). Read when
a Worker is made (tests lower it)."""


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


class Worker:
    def __init__(self, registry: Registry, options: WorkerOptions | None = None, *,
                 settings: Settings | None = None, app: str | None = None, worker_id: str | None = None) -> None:
        self.registry = registry
        self.opts = opts = options or WorkerOptions()
        self.stores = stores = Stores(settings, db_pool_size=2)
        self.settings = stores.settings
        self.lease_ms = opts.lease_ms or self.settings.lease_ms
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.checkpoints = Checkpoints(stores, registry)
        self.services = RunServicesImpl(stores)
        """ctx.progress() coalescing (flushed about once a second) and ctx.upstream_results / batch_results."""
        self.executors = Executors(registry, app, threads=opts.concurrency,
                                   processes=min(opts.processes, opts.concurrency), checkpoints=self.checkpoints)
        self.acks = Acknowledger(stores)
        self.m = metrics.Cached()
        self.held = held = Held()
        self.running = held.running
        """What this worker holds a lease for and executes (or is about to), by execution."""
        self._executing = held.executing
        self.spare = SpareClient(stores)
        self.identity = Identity(stores, held, self.spare, self.id, opts.queues, opts.concurrency)
        self.keeper = LeaseKeeper(stores, held, self.id, self.lease_ms, opts.heartbeat_s, self.identity.announce)
        self.escalation = Escalation(stores, registry, self.id, opts.stop_grace_s)
        self.watchdog = Watchdog(held, self.keeper, self.escalation)
        self.runner = Runner(stores, held, self.keeper, self.executors, self.checkpoints, Breakers(stores),
                             self.acks, self.m)
        self.claimer = Claimer(stores, held, self.keeper, self.executors, self.checkpoints, self.services,
                               self.runner.execute, self.m, self.spare, worker_id=self.id, queues=opts.queues,
                               concurrency=opts.concurrency, lease_ms=self.lease_ms, idle_wait_s=opts.idle_wait_s,
                               burst=opts.burst, unstamped_recheck_s=UNSTAMPED_RECHECK_S)
        self.reaper = Reaper(stores, opts.queues, opts.reap_every_s, self.claimer.backoff)
        self.gauges = Gauges(held, self.executors, self.m, opts.queues, opts.concurrency)

    # -- what tests, the CLI and the testing harness read ----------------------------------------
    @property
    def breakers(self) -> Breakers:
        return self.runner.breakers

    @breakers.setter
    def breakers(self, value: Breakers) -> None:  # a test's recording breakers, set before run()
        self.runner.breakers = value

    @property
    def claimed(self) -> int:
        return self.held.claimed

    @property
    def last_claim_at(self) -> float | None:
        return self.held.last_claim_at

    @property
    def started_at(self) -> float:
        return self.identity.started_at

    @property
    def lost(self) -> int:
        """Executions fenced off because Redis said another attempt owns the run."""
        return self.keeper.lost

    @property
    def fenced(self) -> int:
        """Executions this worker fenced off itself (lease or pulse not renewed in time)."""
        return self.keeper.fenced

    @property
    def _due_seen(self) -> dict[str, int]:
        return self.claimer.waker.due_seen

    def _free(self) -> int:
        return self.claimer.free()

    async def _claim(self, queue: str, n: int) -> int:
        """One claim outside the claim loop (tests drive claims one at a time)."""
        return await self.claimer._claim(queue, n)

    # -- lifecycle -----------------------------------------------------------------------------
    def request_stop(self) -> None:
        self.held.request_stop()

    async def _connect(self) -> None:
        """A worker started while Redis or PostgreSQL is down waits for them (with backoff)."""
        delay = 0.2
        while True:
            try:
                await self.stores.connect(database=bool(self.registry.handlers))
                return
            except StoreUnavailable as exc:
                if self.held.stopping.is_set():
                    raise
                log.warning("waiting for the stores: %s", exc, extra={"event": "worker_waiting"})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def run(self) -> None:
        await self._start()
        pulse = self.keeper.pulse = Pulse(self.settings, self.id, self.opts.queues)
        pulse.start()
        helpers = [asyncio.create_task(self.keeper.run()), asyncio.create_task(self.reaper.run()),
                   asyncio.create_task(self.watchdog.run()), asyncio.create_task(self.breakers.run()),
                   asyncio.create_task(self.gauges.run()), asyncio.create_task(self.services.run())]
        try:
            await self.claimer.run()
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
            await self.spare.close()
            await self.stores.close()
            log.info("worker %s stopped", self.id, extra={"event": "worker_stopped", "worker_id": self.id})

    async def _start(self) -> None:
        """Connect, declare our handlers and queues, start the pools, and take SIGTERM / SIGINT as a stop."""
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

    async def _seed_retry_budget(self) -> None:
        """The retry budget is per queue, shared by its workers: a worker only fills in settings the
        queue does not have yet (HSETNX), so workers started with other environments never
        overwrite each other (the last to start used to win); a differing one says so."""
        s = self.settings
        mine = {"budget_ratio": str(s.retry_budget_ratio), "budget_floor": str(s.retry_budget_floor),
                "budget_window_ms": str(s.retry_budget_window_ms)}
        for q in self.opts.queues:
            live = await hotworker.seed_retry_budget(self.stores.redis, self.stores.keys(q), mine)
            kept = {n: getattr(live, n) for n in mine}
            if any(v is not None and v != float(mine[n]) for n, v in kept.items()):
                log.warning("queue %s keeps its retry budget %s; this worker's settings %s are not applied",
                            q, kept, mine, extra={"event": "retry_budget_differs", "queue": q, "worker_id": self.id})

    # -- shutdown ------------------------------------------------------------------------------
    async def _drain(self) -> None:
        """Stop: running jobs get opts.grace_s to finish; what is left is cancelled and released."""
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
        by_queue: dict[str, list[Running]] = {}
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
