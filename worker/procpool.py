"""A pool of child processes where one hung or crashed job can be killed without the others.

concurrent.futures.ProcessPoolExecutor cannot kill one task, and one os._exit breaks the
whole pool; here each child is addressed on its own pipe, and a child that times out is
killed and replaced while the rest keep serving.

A child never outlives its worker, on any path including SIGKILL: it asks Linux for SIGKILL at
its parent's death (PR_SET_PDEATHSIG, then checks it still has that parent: the parent may have
died before the request took effect) before it imports anything of ours (core/parentdeath.py), and
a thread of its own watches a lifeline pipe whose other end only the parent holds: the pipe reads
EOF the moment the parent is gone, and the child exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, cast

import msgspec

from fencepost.core import metrics
from fencepost.core.classify import classify
from fencepost.core.errors import InvalidInput, StoreUnavailable
from fencepost.core.models import decode_payload, decode_result, encode_result
from fencepost.core.parentdeath import die_with_parent, guarded
from fencepost.core.registry import load_registry
from fencepost.core.tracing import traceparent_var
from fencepost.worker.context import Context, Interrupt, LeaseLost, RunResult, SyncContext

log = logging.getLogger("fencepost.worker.procpool")
_CTX = mp.get_context("spawn")
_READY_S = 60.0  # the longest a new child may take to import the app before a job's timeout runs anyway


class ChildCrashed(Exception):
    def __init__(self, exitcode: int | None) -> None:
        sig = f" (signal {signal.Signals(-exitcode).name})" if exitcode and exitcode < 0 else ""
        super().__init__(f"worker process exited with code {exitcode}{sig}")
        self.exitcode = exitcode


class RemoteError(Exception):
    """A handler in a child process raised; it was classified there (the child has the registry)."""

    def __init__(self, error_class: str, message: str, kind: str = "transient", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.error_class, self.kind, self.retry_after = error_class, kind, retry_after


class _ChildContext(SyncContext):
    """The handler's context inside a child process: checkpoints, progress and result reads go through
    the parent (which holds the stores), over the child's pipe."""

    __slots__ = ("_conn",)
    _conn: Connection

    def checkpoint(self, state: Any, *, processed: int | None = None) -> int:  # type: ignore[override]
        _flush_progress(self)
        self._conn.send(("ckpt", encode_result(state), processed))
        reply = self._conn.recv()
        if reply[0] == "lost":
            self._stop = True
            raise LeaseLost(reply[1])
        self.checkpoint_version, self._ctl = reply[1], reply[2]
        if self._ctl in ("pause", "stop", "cancel"):
            raise Interrupt(self._ctl)
        return self.checkpoint_version

    def upstream_results(self) -> dict[str, RunResult]:  # type: ignore[override]
        return cast("dict[str, RunResult]", self._ask("upstream"))

    def batch_results(self) -> list[RunResult]:  # type: ignore[override]
        return cast("list[RunResult]", self._ask("batch"))

    def _ask(self, what: str) -> Any:
        """A read the parent answers from PostgreSQL (upstream results, batch results)."""
        _flush_progress(self)
        self._conn.send((what,))
        reply = self._conn.recv()
        if reply[0] == "ok":
            return reply[1]
        error_class, message = reply[1], reply[2]
        if error_class in ("StoreUnavailable", "DatabaseUnavailable", "RedisUnavailable"):
            raise StoreUnavailable(message)  # transient: the attempt is retried, as in an async handler
        raise RuntimeError(f"{what} results: {error_class}: {message}")


class _ChildProgress:
    """ctx.progress() in a child: the latest report goes to the parent at most every EVERY_S (a handler
    reporting a million times sends a handful of messages), and always before the child's next
    checkpoint or read and before its final reply, so the last report is never lost."""

    EVERY_S = 0.2

    def __init__(self) -> None:
        self.sent_at = 0.0
        self.pending = False

    def progress_changed(self, ctx: Context) -> None:
        self.pending = True
        if time.monotonic() - self.sent_at >= self.EVERY_S:
            _flush_progress(ctx)

    async def upstream_results(self, ctx: Context) -> dict[str, RunResult]:  # _ChildContext asks the parent instead
        raise RuntimeError("upstream_results() goes through the parent")

    async def batch_results(self, ctx: Context) -> list[RunResult]:
        raise RuntimeError("batch_results() goes through the parent")


def _flush_progress(ctx: Context) -> None:
    services = ctx._services
    if isinstance(services, _ChildProgress) and services.pending and isinstance(ctx, _ChildContext):
        p = ctx.last_progress
        if p is not None:
            ctx._conn.send(("progress", p.done, p.total, p.message))
        services.pending, services.sent_at = False, time.monotonic()


def _watch_lifeline(lifeline: Connection) -> None:
    """The parent holds the only other end: EOF (or an error) means it is gone; exit at once."""
    try:
        lifeline.recv()
    except BaseException:
        pass
    os._exit(70)


def _child_main(app: str, conn: Connection, parent_pid: int | None = None, lifeline: Connection | None = None,
                fence_at: Any = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if parent_pid is not None:
        die_with_parent(parent_pid)
    if lifeline is not None:
        threading.Thread(target=_watch_lifeline, args=(lifeline,), name="fencepost-lifeline", daemon=True).start()

    registry = load_registry(app)
    conn.send(("ready",))  # the parent hands out no job (whose timeout would run) before this
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        handler, payload, ctx_fields, checkpoint, checkpoint_version, ctl = msg
        ctx = _ChildContext(*ctx_fields)
        ctx._conn = conn
        ctx._services = _ChildProgress()
        if fence_at is not None:  # the parent's fence test, on this process's clock (CLOCK_MONOTONIC is
            # system-wide): frozen with its parent (SIGSTOP), the deadline it last wrote stays behind, so a
            # thawed child's should_stop() is True before its next effect, not at the parent's next tick
            ctx._fence = _SharedDeadline(fence_at)
        try:
            # Decoded and bound here only (the parent does not decode): annotated parameters are converted as
            # for async and thread handlers; arguments that no longer bind are invalid input, never retried.
            try:
                args, kwargs = registry[handler].bind(*decode_payload(payload), strict=False)
            except (InvalidInput, msgspec.DecodeError) as exc:
                conn.send(("err", type(exc).__name__, str(exc), "invalid_input", None))
                continue
            ctx.checkpoint_data = decode_result(checkpoint) if checkpoint is not None else None
            ctx.checkpoint_version, ctx._ctl = checkpoint_version, ctl
            traceparent_var.set(ctx.trace)  # runs submitted from this job continue its trace
            result = registry[handler].fn(ctx, *args, **kwargs)
            _flush_progress(ctx)
            conn.send(("ok", encode_result(result)))
        except Interrupt as exc:
            _flush_progress(ctx)
            conn.send(("interrupted", exc.kind))
        except LeaseLost as exc:
            conn.send(("lost", str(exc)))
        except BaseException as exc:
            _flush_progress(ctx)
            kind, retry_after = classify(exc, registry[handler].errors if handler in registry else None)
            conn.send(("err", type(exc).__name__, f"{exc}\n{traceback.format_exc(limit=5)}"[:4000], kind, retry_after))


class _SharedDeadline:
    """A child's fence test (Context._fence): the deadline its parent keeps in shared memory."""

    __slots__ = ("fence_at",)

    def __init__(self, fence_at: Any) -> None:
        self.fence_at = fence_at

    def due(self) -> bool:
        return time.monotonic() >= float(self.fence_at.value)

    def at(self) -> float:
        return float(self.fence_at.value)


class _Child:
    __slots__ = ("_starting", "conn", "fence_at", "lifeline", "proc", "started")

    def __init__(self, app: str) -> None:
        parent, child = _CTX.Pipe()
        keep, give = _CTX.Pipe(duplex=False)  # the child reads `keep`; only this process holds `give`
        self.fence_at: Any = _CTX.RawValue("d", math.inf)
        """CLOCK_MONOTONIC instant from which the running job's fence test is True (Context._fence.at()),
        kept current by the parent while the job runs; the child's should_stop() compares its clock."""
        self.proc = _CTX.Process(target=guarded, daemon=True, name="fencepost-job",  # dies with us before its imports
                                 args=(os.getpid(), "fencepost.worker.procpool:_child_main", app, child, os.getpid(),
                                       keep, self.fence_at))
        self.proc.start()
        child.close()
        keep.close()
        self.conn = parent
        self.lifeline = give
        self.started = False
        self._starting = threading.Lock()  # one waiter reads the child's "ready" (a cancelled run's may go on)

    def wait_started(self) -> None:
        """Block until the child has imported the app (at most _READY_S): a job's timeout counts from
        then, as on a loaded machine the import alone can outlast it. A child that died starting up
        (EOF) is found by the job sent to it, as before; one still starting after _READY_S gets its job
        anyway, and run() skips its late "ready". A run cancelled here has sent no job: the child goes
        back to the pool with no handler in it (tests/test_control.py, the stop forced while it starts)."""
        with self._starting:
            if not self.started and self.conn.poll(_READY_S):
                with contextlib.suppress(EOFError, OSError):
                    self.conn.recv()
            self.started = True

    def kill(self) -> None:
        if self.proc.is_alive() and self.proc.pid is not None:  # alive: started, so it has a pid
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(5)
        self.conn.close()
        self.lifeline.close()


async def _keep_fence(child: _Child, ctx: Context, period: float = 0.05) -> None:
    """While a job runs in `child`: publish its fence deadline (the watchdog's period). A parent that is
    frozen or starved stops moving it forward, which only makes the child stop sooner."""
    fence = ctx._fence
    if fence is None:
        return
    while True:
        child.fence_at.value = fence.at()
        await asyncio.sleep(period)


def _progress(ctx: Context, reply: tuple[Any, ...]) -> None:
    try:
        ctx.progress(reply[1], total=reply[2], message=reply[3])  # checked in the child already
    except InvalidInput as exc:
        log.warning("progress from a child refused: %s", exc, extra={"event": "progress_refused"})


async def _results(ctx: Context, what: str) -> tuple[Any, ...]:
    """The parent's answer to a child's ctx.upstream_results() / ctx.batch_results()."""
    if ctx._services is None:
        return ("fail", "RuntimeError", f"{what}_results() is only available inside a worker")
    try:
        if what == "upstream":
            return ("ok", await ctx._services.upstream_results(ctx))
        return ("ok", await ctx._services.batch_results(ctx))
    except Exception as exc:
        return ("fail", type(exc).__name__, str(exc)[:2000])


async def _checkpointed(ctx: Context, reply: tuple[Any, ...],
                        on_checkpoint: Callable[[Context, bytes, int | None], Awaitable[int]]) -> tuple[Any, ...]:
    """The parent's answer to a child's checkpoint: written (fenced, durable) with its version and the
    control verb now pending, refused as interrupted, or refused as lost."""
    try:
        return ("ok", await on_checkpoint(ctx, reply[1], reply[2]), ctx._ctl)
    except Interrupt as exc:
        return ("ok", ctx.checkpoint_version, exc.kind)
    except LeaseLost as exc:
        return ("lost", str(exc))


def _result(reply: tuple[Any, ...]) -> bytes:
    """The child's last reply as the job's result, or the exception it stands for."""
    if reply[0] == "ok":
        result: bytes = reply[1]  # the child's encode_result(...)
        return result
    if reply[0] == "interrupted":
        raise Interrupt(reply[1])
    if reply[0] == "lost":
        raise LeaseLost(reply[1])
    raise RemoteError(reply[1], reply[2], reply[3], reply[4])


class ProcessPool:
    def __init__(self, app: str, size: int) -> None:
        self.app, self.size = app, size
        self._idle: asyncio.Queue[_Child] = asyncio.Queue()
        self._io = ThreadPoolExecutor(max_workers=size + 1, thread_name_prefix="fencepost-proc")
        self._children: set[_Child] = set()
        self._closed = False
        self.rebuilds = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.size):
            child = await loop.run_in_executor(self._io, _Child, self.app)
            self._children.add(child)
            self._idle.put_nowait(child)

    async def run(self, handler: str, payload: bytes, ctx: Context, timeout: float,
                  on_checkpoint: Callable[[Context, bytes, int | None], Awaitable[int]]) -> bytes:
        """Run one job in an idle child; kill it on timeout; replace it if it dies.

        The child's checkpoints come back over its pipe and are written by `on_checkpoint`
        here (fenced, durable) before the child continues.
        """
        loop = asyncio.get_running_loop()
        child = await self._idle.get()
        healthy = False
        if not child.started:
            try:
                await loop.run_in_executor(self._io, child.wait_started)
            except BaseException:  # cancelled while it starts: it is still a fresh child
                self._idle.put_nowait(child)
                raise
        deadline = loop.time() + timeout
        checkpoint = encode_result(ctx.checkpoint_data) if ctx.checkpoint_data is not None else None
        fence = asyncio.ensure_future(_keep_fence(child, ctx))
        try:
            child.conn.send((handler, payload, ctx._fields(), checkpoint, ctx.checkpoint_version, ctx._ctl))
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError
                reply = await asyncio.wait_for(loop.run_in_executor(self._io, child.conn.recv), remaining)
                if reply[0] == "progress":  # one-way: recorded as the handler's, coalesced by the worker
                    _progress(ctx, reply)
                    continue
                if reply[0] == "ready":  # a child that outlasted _READY_S: its job runs only now, and the
                    continue  # reply is still to come (taken as the reply, the busy child went back idle)
                if reply[0] in ("upstream", "batch"):
                    child.conn.send(await _results(ctx, reply[0]))
                    continue
                if reply[0] != "ckpt":
                    break
                child.conn.send(await _checkpointed(ctx, reply, on_checkpoint))
            healthy = True
        except TimeoutError:  # a subclass of OSError: must come first
            raise
        except (EOFError, OSError):
            child.proc.join(1)
            raise ChildCrashed(child.proc.exitcode) from None
        finally:
            fence.cancel()
            child.fence_at.value = math.inf
            if healthy:
                self._idle.put_nowait(child)
            else:  # timed out, cancelled or crashed: this child cannot be trusted again
                await self._replace(child)
        return _result(reply)

    async def _replace(self, child: _Child) -> None:
        """Kill a child that timed out, was cancelled or crashed, and start a fresh one in its place.

        The replacement joins the pool even if the run is cancelled again while it spawns (a fence on
        top of a forced stop): lost with the cancelled await, it left the pool one child short for good."""
        child.kill()
        self._children.discard(child)
        self.rebuilds += 1

        metrics.POOL_REBUILDS.inc()
        spawned = asyncio.get_running_loop().run_in_executor(self._io, _Child, self.app)
        spawned.add_done_callback(self._adopt)
        await asyncio.shield(spawned)

    def _adopt(self, spawned: asyncio.Future[_Child]) -> None:
        if spawned.cancelled() or spawned.exception() is not None:
            return
        child = spawned.result()
        if self._closed:  # spawned while the pool closed: nobody would ever kill it
            child.kill()
            return
        self._children.add(child)
        self._idle.put_nowait(child)

    def idle(self) -> int:
        return self._idle.qsize()

    async def close(self) -> None:
        self._closed = True
        for child in list(self._children):
            child.kill()
        self._children.clear()
        self._io.shutdown(wait=False, cancel_futures=True)
