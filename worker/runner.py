"""The runner: one claimed execution from its start to its acknowledgement. It waits for an older
execution of the same run in this worker to end, asks the service's circuit breaker, loads the
checkpoint of a retried attempt, runs the handler (in its trace spans when a tracer is active),
turns what happened into an outcome and hands it to the acknowledger (worker/acks.py), unless the
execution was fenced off meanwhile: then its lease is not this worker's to finish.

Per job it costs one task and the handler's own awaits: nothing here makes another object or
await on the common path (tests/test_per_job_cost.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from functools import partial
from typing import Any

from fencepost.core import hotworker, metrics
from fencepost.core.metrics import Cached
from fencepost.core.stores import Stores
from fencepost.core.tracing import start_run
from fencepost.worker.acks import Acknowledger
from fencepost.worker.breakers import Breakers
from fencepost.worker.checkpoints import Checkpoints
from fencepost.worker.executors import Executors, Outcome
from fencepost.worker.held import Held, Running
from fencepost.worker.leases import LeaseKeeper

log = logging.getLogger("fencepost.worker")

__all__ = ["Runner"]


def _band(attempt: int) -> str:
    return str(attempt) if attempt < 3 else "3+"


def _timeout(job_timeout_ms: int) -> Outcome:
    return Outcome("timeout", f"exceeded its timeout of {job_timeout_ms / 1000:g}s", "Timeout")


class Runner:
    def __init__(self, stores: Stores, held: Held, keeper: LeaseKeeper, executors: Executors,
                 checkpoints: Checkpoints, breakers: Breakers, acks: Acknowledger, m: Cached) -> None:
        self.stores, self.held, self.keeper = stores, held, keeper
        self.executors, self.checkpoints, self.breakers, self.acks, self.m = executors, checkpoints, breakers, acks, m

    async def execute(self, entry: Running) -> None:
        """The execution's task (started by the claimer). Cancelled by a fence, a timeout or a forced stop."""
        job = entry.job
        spec = self.executors.spec(job.handler)
        service = spec.service if spec is not None else None
        probe = False
        started = time.monotonic()
        try:
            try:
                prior = entry.prior
                if prior is not None and not prior.ended and not await self._prior_ended(entry, prior):
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
                    outcome = _timeout(job.timeout_ms)
                else:
                    raise
            except ValueError as exc:  # an incompatible checkpoint: never retried blindly
                outcome = Outcome("fatal", str(exc), "IncompatibleCheckpoint")
            if outcome.kind == "lost":
                self.keeper.fence(entry, "lost")
                return
            outcome = self._settle(entry, outcome, service, probe)
            self.m.observe(metrics.DURATION, time.monotonic() - started, job.handler, _band(job.attempt))
            await self._finish(entry, outcome, spec.model if spec is not None else "async")
        except asyncio.CancelledError:
            pass
        finally:
            self.held.drop(entry)
            thread = entry.ctx._thread
            if thread is not None and not thread.done():  # a given-up thread handler: ended when it returns
                thread.add_done_callback(partial(self._thread_ended, entry))
            else:
                self._ended(entry)

    async def _prior_ended(self, entry: Running, prior: Running) -> bool:
        """An older execution of this run is still stopping here: start only once it ended. False (and
        the attempt finished as timed out) if it did not within the run's timeout."""
        job = entry.job
        try:
            await asyncio.wait_for(prior.wait_ended(), job.timeout_ms / 1000)
        except TimeoutError:  # a thread handler that ignores should_stop(): never run beside it
            await self._finish(entry, Outcome(
                "timeout", "an older execution of this run in this worker did not end within the "
                f"run's timeout of {job.timeout_ms / 1000:g}s", "Timeout"), None)
            return False
        return True

    def _settle(self, entry: Running, outcome: Outcome, service: str | None, probe: bool) -> Outcome:
        """The outcome as recorded: a forced stop or a swallowed timeout says so; the breaker hears of it."""
        if entry.forced and outcome.kind == "interrupted":
            outcome = Outcome("interrupted", "forced")
        if entry.timed_out and outcome.kind == "ok":  # the handler swallowed the cancellation
            outcome = _timeout(entry.job.timeout_ms)
        if service is not None and (probe or outcome.kind in ("ok", "error", "timeout", "crash")):
            # the dependency answered unless the attempt failed in a way it could cause;
            # a probe always reports, so a half-open breaker never waits out probe_ms
            self.breakers.record(service, outcome.kind not in ("error", "timeout", "crash"), probe)
        return outcome

    def _thread_ended(self, entry: Running, _thread: Any) -> None:
        self._ended(entry)

    def _ended(self, entry: Running) -> None:
        """The execution can have no more effects: a newer attempt of its run may start here."""
        entry.set_ended()
        executing = self.held.executing
        if executing.get(entry.job.id) is entry:
            del executing[entry.job.id]
        if entry.fenced is not None or entry.finishing:
            # the fence test's answer is settled (fenced: ctx._fenced says True; finishing: False), so the
            # context lets go of the entry: entry and context are then no cycle left to the cycle collector
            entry.ctx._fence = None

    async def _run_traced(self, entry: Running) -> Outcome:
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

    async def _finish(self, entry: Running, outcome: Outcome, model: str | None) -> None:
        job = entry.job
        if outcome.error_kind is not None:
            metrics.ERRORS.labels(job.handler, outcome.error_kind).inc()
            if outcome.error_kind == "rate_limited" and outcome.retry_after:
                await self._throttle(job.queue, outcome.retry_after)
        if entry.forced and model is not None:
            metrics.FORCED.labels(job.handler, model).inc()
        if self.held.running.get(entry.key) is not entry:  # fenced off meanwhile: its lease is not ours to finish
            return
        reason = self.keeper.reason(entry, time.monotonic()) if entry.fenced is None else None
        if reason is not None:  # it ended (seeing should_stop()) after its lease could lapse: fenced, not finished
            self.keeper.fence(entry, reason)
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
        in_queue = sum(1 for e in self.held.running.values() if e.job.queue == queue)
        try:
            await hotworker.throttle_queue(self.stores.redis, self.stores.keys(queue), max(1, in_queue // 2),
                                           max(int(retry_after * 1000), 1))
            metrics.THROTTLED.labels(queue).inc()
        except Exception as exc:
            log.debug("could not throttle %s: %s", queue, exc)
