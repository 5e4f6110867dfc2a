"""What a handler receives as its first argument, and the two signals it may raise."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import msgspec

from fencepost.core.errors import InvalidInput
from fencepost.core.tracing import trace_id

__all__ = ["Context", "Interrupt", "LeaseLost", "Progress", "RunResult", "RunServices", "SyncContext"]


class Progress(msgspec.Struct, kw_only=True, frozen=True):
    """The latest `ctx.progress()` of a run's attempt (not a checkpoint: nothing resumes from it)."""

    done: float
    total: float | None = None
    message: str | None = None


class RunResult(msgspec.Struct, kw_only=True, frozen=True):
    """Another run's outcome as a handler sees it: an upstream node's, or a batch member's."""

    run_id: int
    status: str
    result: Any = None
    """The decoded return value (None unless status is SUCCEEDED)."""


class RunServices(Protocol):
    """What the worker lends a context beyond checkpoints: progress coalescing and result reads."""

    def progress_changed(self, ctx: Context) -> None: ...
    async def upstream_results(self, ctx: Context) -> dict[str, RunResult]: ...
    async def batch_results(self, ctx: Context) -> list[RunResult]: ...


class Interrupt(BaseException):
    """Raised by `checkpoint()` once the checkpoint is durable, when an operator asked this
    run to pause, stop or cancel. Let it propagate: the worker turns it into PAUSED,
    STOPPED or CANCELLED. (BaseException, so `except Exception` in a handler keeps it.)"""

    def __init__(self, kind: str) -> None:
        super().__init__(f"operator asked to {kind}")
        self.kind = kind


class LeaseLost(BaseException):
    """This attempt no longer owns the run (its lease expired and a newer attempt holds
    it): do no more side effects. Its checkpoint was refused at the store."""


class FenceTest(Protocol):
    """What a context asks about its own lease (the worker's entry for the execution)."""

    def due(self) -> bool:
        """True once the lease or the worker's pulse could have lapsed on Redis (checked on the spot)."""
        ...

    def at(self) -> float:
        """The CLOCK_MONOTONIC instant from which due() turns True unless a renewal or pulse lands first
        (0.0: fenced or finishing): what a process-model child compares its own clock with."""
        ...


class Context:
    """Run identity and cooperative controls for an async handler.

    Pass `token` and `op_key()` to downstream side effects so a zombie attempt cannot
    overwrite a newer attempt's effects.
    """

    __slots__ = (
        "_ctl",
        "_fence",
        "_fenced",
        "_log",
        "_progress",
        "_services",
        "_stop",
        "_thread",
        "_writer",
        "attempt",
        "checkpoint_data",
        "checkpoint_version",
        "checkpointed_at",
        "fire_time",
        "gen",
        "handler",
        "processed",
        "queue",
        "run_id",
        "token",
        "trace",
        "worker_id",
    )

    def __init__(self, run_id: int, attempt: int, token: int, queue: str, handler: str,
                 fire_time: int | None = None, trace: str | None = None, worker_id: str = "", gen: int = 0) -> None:
        self.run_id, self.attempt, self.token = run_id, attempt, token
        self.queue, self.handler, self.fire_time, self.trace = queue, handler, fire_time, trace
        self.worker_id, self.gen = worker_id, gen
        self.checkpoint_data: Any = None
        """The latest committed checkpoint's state when this attempt started (None: start fresh)."""
        self.checkpoint_version = 0
        self.processed: int | None = None
        self.checkpointed_at: float | None = None
        self._log: logging.LoggerAdapter[logging.Logger] | None = None
        self._stop = False
        self._fence: FenceTest | None = None
        """Set by the worker (its entry for this execution; in a process child, the deadline the parent
        shares): asked at the moment should_stop() is called whether the lease or the worker's pulse could
        have lapsed on Redis, so a handler that wakes after a freeze (SIGSTOP, starvation) sees it before
        its next effect, not only after the watchdog's next tick. An object, not a closure per job: a
        job's context costs no extra objects for the cycle collector to track."""
        self._fenced = False
        """The worker fenced this attempt off (lease not renewed in time, or superseded): should_stop() is
        True and checkpoints are refused without touching the stores (docs/worker.md)."""
        self._thread: asyncio.Future[Any] | None = None
        """A thread handler's future while its thread runs (the worker waits for it before starting a
        newer attempt of the same run)."""
        self._ctl: str | None = None
        self._writer: Callable[[Context, Any, int | None], Coroutine[Any, Any, int]] | None = None
        self._services: RunServices | None = None
        self._progress: Progress | None = None

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose lines carry run_id, attempt and worker_id (made on first use: most jobs never log)."""
        if self._log is None:
            self._log = logging.LoggerAdapter(logging.getLogger(f"fencepost.job.{self.handler}"),
                                              {"run_id": self.run_id, "attempt": self.attempt,
                                               "worker_id": self.worker_id, "event": "job_log",
                                               "trace_id": trace_id(self.trace)})
        return self._log

    def op_key(self, item: Any) -> str:
        """A stable idempotency key for one unit of work: the same across attempts of this run."""
        return f"{self.run_id}:{item}"

    def should_stop(self) -> bool:
        """True once a stop or cancel was asked, the worker is shutting down, or the lease is
        gone: checkpoint and return at the next safe boundary."""
        return self._stop or self._ctl in ("stop", "cancel") or self.fenced_off()

    def fenced_off(self) -> bool:
        """The worker fenced this attempt off, or its lease could have lapsed by now (checked on the spot)."""
        return self._fenced or (self._fence is not None and self._fence.due())

    def should_pause(self) -> bool:
        return self._ctl == "pause"

    async def checkpoint(self, state: Any, *, processed: int | None = None) -> int:
        """Persist progress; returns only when it is durable in PostgreSQL (its version).

        Call it after the unit's side effects are durable. Raises Interrupt when an
        operator asked to pause/stop/cancel, LeaseLost when a newer attempt owns the run.
        """
        if self._writer is None:
            raise RuntimeError("checkpoint() is only available inside a worker")
        return await self._writer(self, state, processed)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report how far the run is: cheap (no I/O here; the worker writes the latest value of
        each run about once a second), shown by `fencepost status`, the API and `client.get`.
        Not a checkpoint: a new attempt does not start from it (use checkpoint() for that)."""
        for name, v in (("done", done), ("total", total)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
                                  or v < 0 or v > 1e15):
                raise InvalidInput(f"progress {name} must be a finite number between 0 and 1e15, not {v!r}",
                                   field=name)
        if message is not None and (not isinstance(message, str) or len(message) > 500
                                    or any(ord(c) < 32 for c in message)):
            raise InvalidInput("progress message must be text of at most 500 characters without control "
                               "characters", field="message")
        self._progress = Progress(done=float(done), total=None if total is None else float(total), message=message)
        if self._services is not None:
            self._services.progress_changed(self)

    @property
    def last_progress(self) -> Progress | None:
        """What this attempt last reported with progress() (None: nothing yet)."""
        return self._progress

    async def upstream_results(self) -> dict[str, RunResult]:
        """A workflow node's direct upstreams by node name, with their results (all SUCCEEDED:
        a node starts only then). Read from PostgreSQL, so it survives any crash or failover."""
        if self._services is None:
            raise RuntimeError("upstream_results() is only available inside a worker")
        return await self._services.upstream_results(self)

    async def batch_results(self) -> list[RunResult]:
        """In a batch callback: every member's final status and result, in run id order."""
        if self._services is None:
            raise RuntimeError("batch_results() is only available inside a worker")
        return await self._services.batch_results(self)

    def _fields(self) -> tuple[Any, ...]:
        return (self.run_id, self.attempt, self.token, self.queue, self.handler, self.fire_time, self.trace,
                self.worker_id, self.gen)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(run_id={self.run_id}, attempt={self.attempt}, token={self.token})"


class SyncContext(Context):
    """The same API for thread handlers: `checkpoint()` blocks until durable."""

    __slots__ = ("_loop",)

    def __init__(self, *args: Any, loop: asyncio.AbstractEventLoop | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop = loop

    def checkpoint(self, state: Any, *, processed: int | None = None) -> int:  # type: ignore[override]
        if self._writer is None or self._loop is None:
            raise RuntimeError("checkpoint() is only available inside a worker")
        if self.fenced_off():
            raise LeaseLost(f"run {self.run_id}: token {self.token} was fenced off by its worker")
        fut = asyncio.run_coroutine_threadsafe(self._writer(self, state, processed), self._loop)
        while True:  # a write stuck on an unreachable store must not outlive the fence
            try:
                return fut.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                if self.fenced_off():
                    fut.cancel()
                    raise LeaseLost(f"run {self.run_id}: token {self.token} was fenced off by its worker") from None

    def upstream_results(self) -> dict[str, RunResult]:  # type: ignore[override]
        if self._services is None or self._loop is None:
            raise RuntimeError("upstream_results() is only available inside a worker (thread handlers)")
        return asyncio.run_coroutine_threadsafe(self._services.upstream_results(self), self._loop).result()

    def batch_results(self) -> list[RunResult]:  # type: ignore[override]
        if self._services is None or self._loop is None:
            raise RuntimeError("batch_results() is only available inside a worker (thread handlers)")
        return asyncio.run_coroutine_threadsafe(self._services.batch_results(self), self._loop).result()
