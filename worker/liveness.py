"""The pulse: a worker's liveness, kept apart from its runs' leases.

A lease says how long one run may go unrenewed; it can be long (a long job renews it anyway).
Liveness says whether the worker process is there at all: it pulses every queue the worker serves
(lua/pulse_worker.lua) several times per `worker_liveness_ms`, and any reaper (other workers, the
reconciler) reclaims the runs of a worker whose pulse stopped (SIGKILL, OOM, host lost) within
about that time, whatever their lease.

The pulse comes from a small child process of its own (the pulser), not from a thread of the
worker: a thread needs the worker's GIL, and a CPU-bound thread handler, or a worker starved of CPU
(a cgroup quota, nice 19 beside busy neighbours), made a live worker look dead, so its runs were
reclaimed and run again beside themselves. The pulser pulses while its parent is alive and not
stopped: it dies with its parent (PR_SET_PDEATHSIG, and it checks its parent's pid), and it skips
pulsing while the parent is stopped (SIGSTOP: state T in /proc), which is indistinguishable from
death for as long as it lasts. A handler that hogs the worker's event loop therefore does not make
it look dead either; its leases (and the worker's self-fencing, docs/worker.md) cover that case.

`sent_at(queue)` is when the last pulse Redis answered was *sent* (CLOCK_MONOTONIC, shared by the
pulser and the worker through shared memory): the worker fences its runs off before the liveness
that pulse bought can lapse. Redis URLs served in-process (fencepost.testing's fakeredis://) cannot
be reached from a child: the pulse runs in a thread there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from typing import Any

from fencepost.core.config import Settings
from fencepost.core.hot import PulseArgs
from fencepost.core.parentdeath import die_with_parent, guarded
from fencepost.core.stores import Stores

log = logging.getLogger("fencepost.worker")

__all__ = ["Pulse", "die_with_parent", "parent_stopped"]

_CTX = mp.get_context("spawn")



def parent_stopped(pid: int) -> bool | None:
    """True when `pid` is stopped (SIGSTOP, a tracer), False when it runs or sleeps, None when it is
    gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    state = stat.rsplit(b")", 1)[1].split()[0]
    if state in (b"Z", b"X", b"x"):
        return None
    return state in (b"T", b"t")


class Pulse:
    def __init__(self, settings: Settings, worker_id: str, queues: list[str]) -> None:
        self.settings, self.worker_id, self.queues = settings, worker_id, list(queues)
        self.liveness_ms = settings.worker_liveness_ms
        self.period_s = self.liveness_ms / 6000
        self.in_process = settings.redis_url.partition("://")[0] not in ("redis", "rediss", "unix")
        self._sent: Any = [0.0] * len(self.queues) if self.in_process else _CTX.RawArray("d", len(self.queues))
        self._index = {q: i for i, q in enumerate(self.queues)}
        self._tick: Any = _Tick() if self.in_process else _CTX.RawValue("d", 0.0)
        """CLOCK_MONOTONIC of the worker's last watchdog tick (`tick()`): after the worker was stopped
        (SIGSTOP) the pulse resumes only once the worker ticked again, so the worker sees the lapse
        and fences off what was reclaimed meanwhile before a fresh pulse hides it."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: Any = None
        self._proc_stop: Any = None
        self._proc_leaving: Any = None
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._leaving = True

    def sent_at(self, queue: str) -> float | None:
        """CLOCK_MONOTONIC send time of the last pulse of `queue` that Redis answered (None: none yet)."""
        i = self._index.get(queue)
        if i is None:
            return None
        t = float(self._sent[i])
        return t if t > 0 else None

    def tick(self) -> None:
        """The worker's event loop is running (called by its watchdog, every 50 ms)."""
        self._tick.value = time.monotonic()

    def start(self) -> None:
        """Start pulsing. Claims need not wait for the first pulse: a worker that never pulsed is
        not in the set, so its runs fall back on their leases."""
        if self.liveness_ms <= 0:
            return
        if self.in_process:
            self._thread = threading.Thread(target=self._main, name="fencepost-pulse", daemon=True)
            self._thread.start()
            return
        self._proc_stop = _CTX.Event()
        self._proc_leaving = _CTX.RawValue("b", 1)
        self._proc = _CTX.Process(target=guarded, name="fencepost-pulser", daemon=True,  # dies with us at once
                                  args=(os.getpid(), "fencepost.worker.liveness:_pulser_main", self.settings,
                                        self.worker_id, self.queues, os.getpid(), self._sent, self._proc_stop,
                                        self._proc_leaving, self._tick))
        self._proc.start()

    def stop(self, *, leaving: bool = True) -> None:
        """Stop pulsing; `leaving`: say so (graceful stop) instead of letting the pulse run out."""
        self._leaving = leaving
        if self._proc is not None:
            self._proc_leaving.value = 1 if leaving else 0
            self._proc_stop.set()
            self._proc.join(5)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)
            return
        self._stop.set()
        loop, wake = self._loop_ref, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # its loop already ended
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _main(self) -> None:
        asyncio.run(self._loop())

    async def _loop(self) -> None:
        stores = Stores(self.settings)
        self._wake = wake = asyncio.Event()
        self._loop_ref = asyncio.get_running_loop()
        try:
            last = time.monotonic()
            while not self._stop.is_set():
                now = time.monotonic()
                if now - last > 2 * self.period_s + 0.2:  # this process was stopped (or starved): let the
                    await _ticked_since(self._tick, now, self._stop.is_set)  # worker fence first
                last = time.monotonic()
                await _pulse_all(stores, self.worker_id, self.queues, self.liveness_ms, self._sent)
                try:
                    await asyncio.wait_for(wake.wait(), self.period_s)
                except TimeoutError:
                    pass
            if self._leaving:
                await _leave(stores, self.worker_id, self.queues)
        finally:
            await stores.redis.aclose()


async def _pulse_all(stores: Stores, worker_id: str, queues: list[str], liveness_ms: int, sent: Any) -> None:
    alive = PulseArgs(worker_id, liveness_ms)
    for i, q in enumerate(queues):
        t = time.monotonic()
        try:
            # bounded: a blackholed link must not keep the next pulses (and their send times) back
            await asyncio.wait_for(stores.scripts.pulse_worker(stores.keys(q), alive), max(liveness_ms / 3000, 0.2))
        except Exception as exc:  # Redis away: reapers cannot reclaim anything there either
            log.debug("pulse failed: %s", exc)
            continue
        sent[i] = t


class _Tick:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


async def _ticked_since(tick: Any, since: float, stopping: Any, limit_s: float = 10.0) -> None:
    """Until the worker's watchdog ticked after `since` (bounded: a worker whose loop stays blocked
    is still alive; its leases cover that case)."""
    end = time.monotonic() + limit_s
    while tick.value <= since and not stopping() and time.monotonic() < end:  # noqa: ASYNC110 (shared memory)
        await asyncio.sleep(0.01)


async def _leave(stores: Stores, worker_id: str, queues: list[str]) -> None:
    for q in queues:
        try:
            await asyncio.wait_for(stores.scripts.pulse_worker(stores.keys(q), PulseArgs(worker_id, 0)), 2)
        except Exception as exc:
            log.debug("leaving pulse failed: %s", exc)


def _pulser_main(settings: Settings, worker_id: str, queues: list[str], parent_pid: int, sent: Any, stop: Any,
                 leaving: Any, tick: Any) -> None:
    """The pulser process: pulses while the parent is alive and not stopped; dies with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when the pulse stops (a terminal's ^C)
    die_with_parent(parent_pid)
    asyncio.run(_pulser_loop(settings, worker_id, queues, parent_pid, sent, stop, leaving, tick))


async def _pulser_loop(settings: Settings, worker_id: str, queues: list[str], parent_pid: int, sent: Any, stop: Any,
                       leaving: Any, tick: Any) -> None:
    liveness_ms = settings.worker_liveness_ms
    period = liveness_ms / 6000
    stores = Stores(settings)
    was_stopped = False
    try:
        while not stop.is_set():
            state = parent_stopped(parent_pid)
            if state is None or os.getppid() != parent_pid:
                return  # the worker is gone: its pulse lapses and its runs are reclaimed
            if state:
                was_stopped = True
            else:
                if was_stopped:  # thawed: the worker fences what its lapse let go before we pulse again
                    was_stopped = False
                    await _ticked_since(tick, time.monotonic(), stop.is_set)
                await _pulse_all(stores, worker_id, queues, liveness_ms, sent)
            deadline = time.monotonic() + period
            while not stop.is_set() and time.monotonic() < deadline:  # noqa: ASYNC110 (a process's Event)
                await asyncio.sleep(min(0.05, period))
        if leaving.value:
            await _leave(stores, worker_id, queues)
    finally:
        with contextlib.suppress(Exception):
            await stores.redis.aclose()
