"""Run one claimed job under its execution model and turn whatever happens into an Outcome.

async: on the worker's loop, cancelled at its timeout.
thread: in a thread pool; a thread cannot be killed, so at its timeout the run is given
  up (TIMED_OUT or retried) and the thread's slot is counted as leaked until it returns.
process: in a child process that is killed at its timeout or replaced if it crashes.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from fencepost.core.classify import OUTCOME_OF_KIND, classify
from fencepost.core.errors import InvalidInput
from fencepost.core.models import Claimed, decode_payload, encode_result
from fencepost.core.registry import Registry
from fencepost.core.tracing import traceparent_var
from fencepost.worker.checkpoints import Checkpoints
from fencepost.worker.context import Context, Interrupt, LeaseLost
from fencepost.worker.procpool import ChildCrashed, ProcessPool, RemoteError

__all__ = ["Executors", "Outcome"]


class Outcome(msgspec.Struct, frozen=True):
    kind: str  # finish_runs outcome: ok | error | fatal | timeout | crash | review | policy | deferred | interrupted | lost
    data: bytes | str = b""
    error_class: str = ""
    retry_after: float | None = None
    """Seconds before the retry (rate limited, breaker open) instead of the backoff."""
    error_kind: str | None = None


class Executors:
    no_pool = "process handler but the worker has no --app to spawn from"
    """The outcome's message when a process handler meets no pool (fencepost.testing says how to give it one)."""

    def model(self, handler: str) -> str:
        h = self.registry.handlers.get(handler)
        return h.spec.model if h is not None else "async"

    def spec(self, handler: str) -> Any:
        h = self.registry.handlers.get(handler)
        return h.spec if h is not None else None

    def __init__(self, registry: Registry, app: str | None, *, threads: int, processes: int,
                 checkpoints: Checkpoints | None = None) -> None:
        self.registry = registry
        self.checkpoints = checkpoints
        for h in registry.handlers.values():
            h.prepare()  # signatures read now, not on the first job's time
        self._threads = ThreadPoolExecutor(max_workers=max(threads, 1), thread_name_prefix="fencepost-job")
        self.procs = ProcessPool(app, processes) if app and processes > 0 and any(
            h.spec.model == "process" for h in registry.handlers.values()) else None
        self.leaked_threads = 0
        self.threads_busy = 0
        self._lock = threading.Lock()

    async def start(self) -> None:
        if self.procs is not None:
            await self.procs.start()

    async def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        if self.procs is not None:
            await self.procs.close()

    async def run(self, job: Claimed, ctx: Context) -> Outcome:
        handler = self.registry.handlers.get(job.handler)
        if handler is None:
            return Outcome("fatal", f"this worker has no handler {job.handler!r}", "UnknownHandler")
        timeout = job.timeout_ms / 1000
        model = handler.spec.model
        try:
            if model == "process":
                if self.procs is None:
                    return Outcome("fatal", self.no_pool, "NoProcessPool")
                assert self.checkpoints is not None
                # decoded and bound in the child only (arguments that no longer bind come back as fatal)
                return Outcome("ok", await self.procs.run(job.handler, job.payload, ctx, timeout,
                                                          self.checkpoints.write_encoded))
            # Arguments that no longer bind (a producer on an older version) are invalid input: fatal, not retried.
            args, kwargs = handler.bind(*decode_payload(job.payload), strict=False)
            if ctx.trace:  # runs submitted from this job continue its trace
                traceparent_var.set(ctx.trace)
            if model == "async":  # its timeout is enforced by the worker's watchdog (no timer per job)
                return Outcome("ok", encode_result(await handler.fn(ctx, *args, **kwargs)))
            return await self._run_thread(handler.fn, ctx, args, kwargs, timeout)
        except Interrupt:
            return Outcome("interrupted")
        except LeaseLost as exc:
            return Outcome("lost", str(exc))
        except TimeoutError:
            return Outcome("timeout", f"exceeded its timeout of {timeout:g}s", "Timeout")
        except ChildCrashed as exc:
            return Outcome("crash", str(exc), "WorkerCrash")
        except RemoteError as exc:
            return Outcome(OUTCOME_OF_KIND[exc.kind], str(exc), exc.error_class, exc.retry_after, exc.kind)
        except (InvalidInput, msgspec.DecodeError) as exc:
            return Outcome("fatal", str(exc), type(exc).__name__)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            kind, retry_after = classify(exc, handler.errors)
            return Outcome(OUTCOME_OF_KIND[kind], f"{exc}\n{traceback.format_exc(limit=5)}"[:4000],
                           type(exc).__name__, retry_after, kind)

    async def _run_thread(self, fn: Any, ctx: Context, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float) -> Outcome:
        loop = asyncio.get_running_loop()
        self.threads_busy += 1
        call = contextvars.copy_context().run  # the thread sees the run's trace context too
        fut = loop.run_in_executor(self._threads, lambda: call(fn, ctx, *args, **kwargs))
        fut.add_done_callback(self._thread_done)
        ctx._thread = fut
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except (TimeoutError, asyncio.CancelledError):
            # A thread cannot be killed: give the run up and count the slot as leaked
            # until the thread returns by itself.
            ctx._stop = True
            with self._lock:
                self.leaked_threads += 1
            fut.add_done_callback(self._thread_returned)
            raise
        return Outcome("ok", encode_result(result))

    def _thread_done(self, _fut: Any) -> None:
        self.threads_busy -= 1

    def _thread_returned(self, fut: Any) -> None:
        with self._lock:
            self.leaked_threads -= 1
        if not fut.cancelled():
            fut.exception()  # retrieved: a given-up thread's LeaseLost is not "never retrieved" at exit
