"""Operator commands and checkpoints (issue 3): pause / stop / cancel / resume / restart on
real Redis, PostgreSQL and worker processes; checkpointed jobs that resume where they left
off, fenced checkpoints, races between commands and the hot path, bulk and queue commands."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import BulkNotConfirmed, ConcurrentModification, IllegalTransition, ResumeRefused
from fencepost.core.models import JobSpec, decode_result, encode_payload, encode_result
from fencepost.core.registry import Registry
from fencepost.core.stores import Stores
from fencepost.worker import procpool
from fencepost.worker.checkpoints import Checkpoints
from fencepost.worker.context import Context, LeaseLost
from fencepost.worker.runtime import Worker, WorkerOptions
from tests.apps import registry
from tests.conftest import ROOT, log_tail, record_all, run_state, spawn, wait_state, wait_until, worker_env

pytestmark = pytest.mark.slow

APP = "tests.apps:registry"
WORKER = ("worker", "--app", APP, "--queue", "tq", "--concurrency", "4")
N_ITEMS, EVERY = 10_000, 500

MARKED_APP = "tests.test_control:marked_registry"
marked_registry = Registry()
"""A process handler that says when it runs: its child is spawned from MARKED_APP."""


@marked_registry.job("t.marked", queue="tq", model="process", timeout=300, stop_grace=1, max_retries=0)
def marked(ctx: Any, path: str) -> None:
    """Ignores stop requests like t.stubborn, once it wrote "attempt pid" to `path` (the handler runs)."""
    with open(path, "a") as f:
        f.write(f"{ctx.attempt} {os.getpid()}\n")
    time.sleep(3600)


# -- helpers ---------------------------------------------------------------------------------------
def _kill(*procs: subprocess.Popen[bytes] | None) -> None:
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
    for p in procs:
        if p is not None:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass








async def _val(stores: Stores, sql: str, *args: Any) -> Any:
    return await stores.db.pool.fetchval(sql, *args)  # type: ignore[union-attr]


async def _fetch(stores: Stores, sql: str, *args: Any) -> list[Any]:
    return await stores.db.pool.fetch(sql, *args)  # type: ignore[union-attr]


async def _rows(stores: Stores, run_id: int) -> int:
    return await _val(stores, "SELECT count(*) FROM processed_items WHERE run_id = $1", run_id)


async def _item_counts(stores: Stores, run_id: int) -> dict[int, int]:
    """item index -> how many times its op key was written."""
    rows = await _fetch(stores, "SELECT op_key, count(*) AS n FROM processed_items WHERE run_id = $1 GROUP BY op_key",
                        run_id)
    out = {}
    for r in rows:
        rid, _, item = r["op_key"].partition(":")
        assert int(rid) == run_id, f"op key {r['op_key']!r} does not carry the run id"
        out[int(item)] = r["n"]
    return out


async def _checkpoint(stores: Stores, run_id: int) -> dict[str, Any] | None:
    row = await stores.db.fetchrow("get_checkpoint", run_id)
    if row is None or row["state"] is None:
        return None
    d = dict(row)
    d["state"] = decode_result(row["state"])
    return d


async def _has_checkpoint(stores: Stores, run_id: int, attempt: int | None = None) -> bool:
    c = await _checkpoint(stores, run_id)
    return c is not None and (attempt is None or c["attempt"] == attempt)


def _by_type(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


async def _worker_started(log: Path) -> bool:
    return log.exists() and b"worker_started" in log.read_bytes()


async def _spawn_worker(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    p = spawn(settings, *WORKER, log=log, FENCEPOST_LEASE_MS="1500")

    async def started() -> bool:
        if p.poll() is not None:
            raise AssertionError(f"worker {log.name} exited with {p.returncode}\n{log_tail(log, 12)}")
        return await _worker_started(log)

    try:
        await wait_until(started, timeout=40, what=f"worker {log.name} to start", interval=0.05)
    except AssertionError as exc:
        _kill(p)
        raise AssertionError(f"{exc}\n{log_tail(log)}") from None
    return p


@contextlib.asynccontextmanager
async def _worker(settings: Settings, *, reg: Registry = registry, app: str = APP,
                  **opts: Any) -> AsyncIterator[Worker]:
    """An in-process worker (where a separate OS process is not the point of the test)."""
    o: dict[str, Any] = dict(queues=["tq"], concurrency=4, processes=1, heartbeat_s=0.2, grace_s=2.0,
                             idle_wait_s=0.2, reap_every_s=0.5)
    o.update(opts)
    w = Worker(reg, WorkerOptions(**o), settings=settings, app=app)
    task = asyncio.create_task(w.run())
    try:
        # the worker is up once it registered its handlers and its process pool is ready
        await wait_until(lambda: _ready(w, task), timeout=30, what="in-process worker to start")
        yield w
    finally:
        w.request_stop()
        try:
            await asyncio.wait_for(task, 20)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _hold_first_child(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pool's first child is SIGSTOPped as soon as it is spawned, before it imports anything: it stays
    "still starting" (as on a loaded machine, where its imports take seconds) until the test sends SIGCONT."""
    held: list[int] = []
    born = procpool._Child.__init__

    def hold(self: procpool._Child, app: str) -> None:
        born(self, app)
        if not held and self.proc.pid is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)
            held.append(self.proc.pid)

    monkeypatch.setattr(procpool._Child, "__init__", hold)
    return held


def _marks(path: Path) -> list[str]:
    """What t.marked wrote: one "attempt pid" line per execution that reached the handler."""
    return path.read_text().splitlines() if path.exists() else []


async def _marked(path: Path) -> list[str]:
    return _marks(path)


async def _holds(value: bool) -> bool:
    return value


async def _ready(w: Worker, task: asyncio.Task[None]) -> bool:
    if task.done():
        task.result()  # surface a startup failure
    procs = w.executors.procs
    return procs is None or len(procs._children) >= 1


@pytest.fixture
async def items_table(stores: Stores) -> Stores:
    """processed_items: one row per processed item of t.items, keyed by ctx.op_key(item)."""
    await _val(stores, "CREATE TABLE processed_items (op_key text NOT NULL, run_id bigint NOT NULL, "
                       "attempt int NOT NULL)")
    return stores


async def _at(stores: Stores, now: int) -> None:
    """Hold the scripts' one clock at `now` (ms) for queue tq: the test clock (tests/conftest.py)."""
    await stores.redis.set(stores.keys("tq").testclock, now)


async def _claim(stores: Stores, n: int = 1, now: int | None = None, worker: str = "test-worker") -> list[Any]:
    if now is not None:
        await _at(stores, now)
    return await stores.scripts.run("claim_due", stores.keys("tq"), [n, worker, 30_000, 100])


# -- 1. pause, then resume on another worker process: exactly once ------------------------------
async def test_pause_then_resume_on_another_worker_process_processes_every_item_exactly_once(
        client: Client, settings: Settings, items_table: Stores, tmp_path: Path) -> None:
    stores = items_table
    keys = stores.keys("tq")
    la, lb = tmp_path / "a.log", tmp_path / "b.log"
    a = b = None
    try:
        a = await _spawn_worker(settings, la)
        rid = await client.submit("t.items", N_ITEMS, EVERY, settings.database_url, 0.0001)
        await wait_state(stores, rid, {"RUNNING"}, 30, "worker A to claim the run", la)
        worker_a = (await stores.redis.hget(keys.run(rid), "worker")).decode()
        assert f":{a.pid}:" in worker_a
        await wait_until(lambda: _rows(stores, rid), timeout=30, what="first items")

        async def midway() -> bool:
            return await _rows(stores, rid) >= 1200

        await wait_until(midway, timeout=60, what="1200 items processed")
        assert await client.pause(rid, reason="maintenance window") == "REQUESTED"
        await wait_state(stores, rid, {"PAUSED"}, 30, "the run to pause at its next checkpoint", la)

        # the slot is free, the worker lives on, nothing will dispatch the run
        assert await stores.redis.zcard(keys.active) == 0
        assert await stores.redis.zcard(keys.due) == 0 and await stores.redis.zcard(keys.delayed) == 0
        assert a.poll() is None, "worker A exited"
        done_at_pause = await _rows(stores, rid)
        ckpt = await _checkpoint(stores, rid)
        assert ckpt is not None and ckpt["attempt"] == 1
        assert 0 < done_at_pause < N_ITEMS and done_at_pause % EVERY == 0
        assert ckpt["state"] == {"next": done_at_pause} and ckpt["processed"] == done_at_pause, \
            "the run paused with items processed after its last checkpoint"
        with pytest.raises(IllegalTransition) as ei:
            await client.pause(rid)
        assert ei.value.current == "PAUSED"

        a.kill()
        a.wait(10)
        b = await _spawn_worker(settings, lb)
        assert await client.resume(rid, reason="window over") == "PENDING"
        out = await client.wait(rid, timeout=90)
        assert (out.status, out.result) == ("SUCCEEDED", N_ITEMS), log_tail(lb)
    finally:
        _kill(a, b)

    counts = await _item_counts(stores, rid)
    assert await _rows(stores, rid) == N_ITEMS, "an item was processed twice (or never)"
    assert set(counts) == set(range(N_ITEMS)) and set(counts.values()) == {1}
    by_attempt = {r["attempt"]: (r["n"], r["lo"]) for r in await _fetch(
        stores, "SELECT attempt, count(*) AS n, min(split_part(op_key, ':', 2)::int) AS lo FROM processed_items "
                "WHERE run_id = $1 GROUP BY attempt", rid)}
    assert by_attempt == {1: (done_at_pause, 0), 2: (N_ITEMS - done_at_pause, done_at_pause)}

    await record_all(stores)
    attempts = await client.attempts(rid)
    assert [(x["attempt"], x["outcome"]) for x in attempts] == [(1, "paused"), (2, "succeeded")]
    assert attempts[0]["worker_id"] == worker_a
    assert attempts[1]["worker_id"] != worker_a and f":{b.pid}:" in attempts[1]["worker_id"]
    assert attempts[0]["token"] < attempts[1]["token"]
    run = await client.get(rid)
    assert run["status"] == "SUCCEEDED" and run["attempt"] == 2
    events = await client.events(rid)
    req = _by_type(events, "pause_requested")
    assert len(req) == 1 and (req[0]["actor"], req[0]["reason"]) == (client.actor, "maintenance window")
    paused = _by_type(events, "paused")
    assert len(paused) == 1 and paused[0]["to_status"] == "PAUSED" and paused[0]["attempt"] == 1
    resumed = _by_type(events, "resumed")
    assert len(resumed) == 1 and (resumed[0]["from_status"], resumed[0]["to_status"]) == ("PAUSED", "PENDING")
    assert (resumed[0]["actor"], resumed[0]["reason"]) == (client.actor, "window over")
    claims = _by_type(events, "claimed")
    assert [c["attempt"] for c in claims] == [1, 2] and claims[0]["worker_id"] != claims[1]["worker_id"]
    types = [e["type"] for e in events if e["type"] != "checkpointed"]
    assert types.index("pause_requested") < types.index("paused") < types.index("resumed") < types.index("succeeded")


# -- 2. kill -9 mid-way: resume from the last checkpoint, redo at most the tail once ---------------
async def test_sigkilled_worker_resumes_from_the_last_checkpoint_on_another_process(
        client: Client, settings: Settings, items_table: Stores, tmp_path: Path) -> None:
    stores = items_table
    la, lb = tmp_path / "a.log", tmp_path / "b.log"
    a = b = None
    try:
        a = await _spawn_worker(settings, la)
        rid = await client.submit("t.items", N_ITEMS, EVERY, settings.database_url, 0.0003)
        await wait_state(stores, rid, {"RUNNING"}, 30, "worker A to claim the run", la)

        async def past_a_checkpoint() -> bool:
            # well past a checkpoint, and in the middle of the next chunk
            n = await _rows(stores, rid)
            return n >= 1700 and 100 <= n % EVERY <= 300 and await _has_checkpoint(stores, rid)

        await wait_until(past_a_checkpoint, timeout=60, what="attempt 1 to be mid-chunk after a checkpoint")
        os.kill(a.pid, 9)
        a.wait(10)
        b = await _spawn_worker(settings, lb)
        out = await client.wait(rid, timeout=90)
        assert (out.status, out.result) == ("SUCCEEDED", N_ITEMS), log_tail(lb)
    finally:
        _kill(a, b)

    # what attempt 1 got done before the kill (its last in-flight insert may have committed late)
    done_by_a = 1 + await _val(stores, "SELECT max(split_part(op_key, ':', 2)::int) FROM processed_items "
                                       "WHERE run_id = $1 AND attempt = 1", rid)
    assert await _val(stores, "SELECT count(*) FROM processed_items WHERE run_id = $1 AND attempt = 1",
                      rid) == done_by_a
    last_ckpt = await _val(stores, "SELECT max((data->>'processed')::int) FROM events WHERE run_id = $1 AND "
                                   "type = 'checkpointed' AND attempt = 1", rid)
    assert last_ckpt is not None and last_ckpt % EVERY == 0 and 0 < last_ckpt < done_by_a
    counts = await _item_counts(stores, rid)
    assert set(counts) == set(range(N_ITEMS)), "an item was never processed"
    assert max(counts.values()) <= 2, "an item was processed more than twice"
    dups = sorted(i for i, n in counts.items() if n == 2)
    assert dups, "kill -9 mid-chunk should leave items to redo"
    assert min(dups) >= last_ckpt, f"item {min(dups)} before the last checkpoint {last_ckpt} was redone"
    # exactly the items attempt 1 did after its last checkpoint were redone, from that checkpoint on
    assert dups == list(range(last_ckpt, done_by_a))
    lo2 = await _val(stores, "SELECT min(split_part(op_key, ':', 2)::int) FROM processed_items "
                             "WHERE run_id = $1 AND attempt = 2", rid)
    assert lo2 == last_ckpt, "attempt 2 did not start from attempt 1's last checkpoint"

    await record_all(stores)
    attempts = await client.attempts(rid)
    assert [(x["attempt"], x["outcome"]) for x in attempts] == [(1, "interrupted"), (2, "succeeded")]
    assert f":{a.pid}:" in attempts[0]["worker_id"] and f":{b.pid}:" in attempts[1]["worker_id"]
    assert _by_type(await client.events(rid), "lease_expired")


# -- 3. stop on a process job that ignores it: escalation, kill, STOPPED forced --------------------
async def test_stop_of_a_non_cooperative_process_job_escalates_kills_it_and_is_forced(
        client: Client, settings: Settings, stores: Stores, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    await client.register(marked_registry)
    async with _worker(settings, reg=marked_registry, app=MARKED_APP) as w:
        procs = w.executors.procs
        assert procs is not None
        rid = await client.submit("t.marked", str(marks))
        await wait_state(stores, rid, {"RUNNING"}, 20)
        (child,) = list(procs._children)
        # RUNNING is the claim: on a loaded machine the child may still be importing the app then, and a stop
        # forced before the job reached it has no handler to kill (the next test). Stop the handler once it runs.
        await wait_until(lambda: _marked(marks), 30, "the handler to run in the child")
        assert _marks(marks) == [f"1 {child.proc.pid}"] and child.proc.is_alive()
        t0 = time.monotonic()
        assert await client.stop(rid, reason="taking too long") == "STOPPING"
        assert await run_state(stores, rid) == "STOPPING"
        await wait_state(stores, rid, {"STOPPED"}, 15, "the forced stop")
        took = time.monotonic() - t0
        assert not child.proc.is_alive() and child.proc.exitcode == -9, "the job's process was not killed"
        assert procs.rebuilds == 1
        assert await stores.redis.zcard(stores.keys("tq").active) == 0
        assert took >= 1.0, f"stopped after {took:.2f}s, before the 1s grace period"
    await record_all(stores)
    run = await client.get(rid)
    assert run["status"] == "STOPPED" and run["forced"] is True
    events = await client.events(rid)
    (req,) = _by_type(events, "stop_requested")
    (esc,) = _by_type(events, "stop_escalated")
    (stopped,) = _by_type(events, "stopped")
    assert (req["actor"], req["reason"], req["to_status"]) == (client.actor, "taking too long", "STOPPING")
    assert esc["actor"] == "worker" and "grace" in esc["reason"] and esc["to_status"] == "STOPPING"
    assert stopped["to_status"] == "STOPPED"
    assert req["at"] < esc["at"] < stopped["at"]
    assert (esc["at"] - req["at"]).total_seconds() >= 1.0, "escalated before the grace period"
    assert [(x["attempt"], x["outcome"]) for x in await client.attempts(rid)] == [(1, "stopped")]


async def test_a_stop_forced_while_the_process_child_still_starts_stops_a_run_whose_handler_never_ran(
        client: Client, settings: Settings, stores: Stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window the test above raced on a loaded machine: the run is claimed while its child still imports
    the app, and the stop is forced past its grace before the child is ready. The job is sent to a child only
    once it is ready, so none was: the run is STOPPED with its handler nowhere, the child (never handed the
    job) serves the next execution, and after resume the handler runs once, as attempt 2."""
    marks = tmp_path / "marks"
    held = _hold_first_child(monkeypatch)
    await client.register(marked_registry)
    async with _worker(settings, reg=marked_registry, app=MARKED_APP) as w:
        procs = w.executors.procs
        assert procs is not None
        (child,) = list(procs._children)
        assert held == [child.proc.pid]
        rid = await client.submit("t.marked", str(marks))
        await wait_state(stores, rid, {"RUNNING"}, 20)
        await wait_until(lambda: _holds(procs.idle() == 0), 10, "the run to take the pool's child")
        assert not child.started
        assert await client.stop(rid, reason="taking too long") == "STOPPING"
        await wait_state(stores, rid, {"STOPPED"}, 15, "the forced stop")
        assert procs.rebuilds == 0 and procs.idle() == 1 and child.proc.is_alive()
        os.kill(held[0], signal.SIGCONT)
        await wait_until(lambda: _holds(child.started), 60, "the child to finish starting")
        assert await client.resume(rid, reason="again") == "PENDING"
        await wait_until(lambda: _marked(marks), 30, "attempt 2's handler to run")
        assert _marks(marks) == [f"2 {held[0]}"], "attempt 1's handler reached the child after its run stopped"
        assert await client.stop(rid, reason="still too long") == "STOPPING"
        await wait_state(stores, rid, {"STOPPED"}, 15, "the second forced stop")
        assert not child.proc.is_alive() and child.proc.exitcode == -9, "the job's process was not killed"
        assert procs.rebuilds == 1 and _marks(marks) == [f"2 {held[0]}"]
    await record_all(stores)
    assert [(x["attempt"], x["outcome"]) for x in await client.attempts(rid)] == [(1, "stopped"), (2, "stopped")]
    assert (await client.get(rid))["forced"] is True


async def test_a_process_child_slower_to_start_than_its_wait_is_not_taken_back_while_its_handler_runs(
        client: Client, settings: Settings, stores: Stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that has not imported the app after _READY_S gets its job anyway (its timeout runs from then).
    Its late "ready" is not the job's reply: taken as one, the run failed (IndexError on the reply) and the
    child went back to the idle pool while it ran the handler, unkillable by any stop of the run."""
    monkeypatch.setattr(procpool, "_READY_S", 0.5)
    marks = tmp_path / "marks"
    held = _hold_first_child(monkeypatch)
    await client.register(marked_registry)
    async with _worker(settings, reg=marked_registry, app=MARKED_APP) as w:
        procs = w.executors.procs
        assert procs is not None
        (child,) = list(procs._children)
        rid = await client.submit("t.marked", str(marks))
        await wait_state(stores, rid, {"RUNNING"}, 20)
        await wait_until(lambda: _holds(child.started), 20, "the pool to stop waiting for the child's start")
        os.kill(held[0], signal.SIGCONT)
        await wait_until(lambda: _marked(marks), 60, "the handler to run in the child")
        assert _marks(marks) == [f"1 {held[0]}"]
        assert procs.idle() == 0, "the child went back to the pool while its handler runs"
        assert await run_state(stores, rid) == "RUNNING"
        assert await client.stop(rid, reason="taking too long") == "STOPPING"
        await wait_state(stores, rid, {"STOPPED"}, 15, "the forced stop")
        assert not child.proc.is_alive() and child.proc.exitcode == -9, "the job's process was not killed"
        assert procs.rebuilds == 1
    await record_all(stores)
    assert [(x["attempt"], x["outcome"]) for x in await client.attempts(rid)] == [(1, "stopped")]


async def test_a_run_cancelled_again_while_its_killed_child_is_replaced_leaves_the_pool_full(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose child is killed (a forced stop, a timeout, a fence) can be cancelled again while the pool
    spawns the child's replacement (a fence on top of a forced stop). The replacement joins the pool anyway:
    lost with the cancelled await, it left a pool of one with no child, and every later process job of the
    worker waiting for an idle one, RUNNING for good."""
    marks = tmp_path / "marks"
    spawning, release = threading.Event(), threading.Event()
    pool = procpool.ProcessPool(MARKED_APP, 1)
    await pool.start()
    try:
        (child,) = list(pool._children)

        async def no_checkpoint(ctx: Context, state: bytes, processed: int | None) -> int:
            raise AssertionError("t.marked does not checkpoint")

        run = asyncio.ensure_future(pool.run("t.marked", encode_payload((str(marks),), {}),
                                             Context(1, 1, 1, "tq", "t.marked"), 300, no_checkpoint))
        await wait_until(lambda: _marked(marks), 60, "the handler to run in the child")
        born = procpool._Child.__init__

        def slow_spawn(self: procpool._Child, app: str) -> None:
            spawning.set()
            release.wait(30)
            born(self, app)

        monkeypatch.setattr(procpool._Child, "__init__", slow_spawn)
        run.cancel()  # a forced stop: its child is killed, a replacement spawns
        await wait_until(lambda: _holds(spawning.is_set()), 30, "the replacement to spawn")
        assert not child.proc.is_alive() and child.proc.exitcode == -9
        run.cancel()  # a fence on top: cancelled again while the replacement spawns
        release.set()
        (ended,) = await asyncio.gather(run, return_exceptions=True)
        assert isinstance(ended, asyncio.CancelledError)
        await wait_until(lambda: _holds(pool.idle() == 1), 20, "the replacement to join the pool")
        assert len(pool._children) == 1 and pool.rebuilds == 1
    finally:
        release.set()
        await pool.close()


async def test_cooperative_stop_checkpoints_then_resume_continues_exactly_once(
        client: Client, settings: Settings, items_table: Stores) -> None:
    stores = items_table
    n, every = 2000, 100
    async with _worker(settings):
        rid = await client.submit("t.items", n, every, settings.database_url, 0.0002)
        await wait_state(stores, rid, {"RUNNING"}, 20)
        await wait_until(lambda: _has_checkpoint(stores, rid), timeout=20, what="a checkpoint")
        assert await client.stop(rid, reason="deploy") == "STOPPING"
        await wait_state(stores, rid, {"STOPPED"}, 20)
        ck = await _checkpoint(stores, rid)
        assert await _rows(stores, rid) == ck["state"]["next"] == ck["processed"]
        assert await client.resume(rid, reason="deployed") == "PENDING"
        out = await client.wait(rid, timeout=30)
        assert (out.status, out.result) == ("SUCCEEDED", n)
    counts = await _item_counts(stores, rid)
    assert set(counts) == set(range(n)) and set(counts.values()) == {1}
    await record_all(stores)
    assert [(x["attempt"], x["outcome"]) for x in await client.attempts(rid)] == [(1, "stopped"), (2, "succeeded")]
    events = await client.events(rid)
    (st,) = _by_type(events, "stopped")
    assert st["to_status"] == "STOPPED"
    (rs,) = _by_type(events, "resumed")
    assert (rs["from_status"], rs["actor"], rs["reason"]) == ("STOPPED", client.actor, "deployed")
    assert (await client.get(rid))["forced"] is False


# -- 4. cancel: PENDING, PAUSED, RUNNING; compensation only where declared and started -------------
async def test_cancel_pending_paused_and_running_runs_with_compensation_where_declared(
        client: Client, settings: Settings, items_table: Stores) -> None:
    stores = items_table
    pending = await client.submit("t.items", 10, 5, settings.database_url)
    pending_fx = await client.submit("t.effects", 5)  # side effects, but never started
    paused = await client.submit("t.items", 10, 5, settings.database_url)
    assert await client.pause(paused, reason="hold") == "PAUSED"
    assert await client.cancel(pending, reason="not needed") == "CANCELLED"
    assert await client.cancel(pending_fx, reason="not needed") == "CANCELLED"
    assert await client.cancel(paused, reason="not needed") == "CANCELLED"
    assert await stores.redis.zcard(stores.keys("tq").due) == 0
    with pytest.raises(IllegalTransition) as ei:
        await client.cancel(pending)
    assert ei.value.current == "CANCELLED"

    async with _worker(settings):
        fx = await client.submit("t.effects", 60)
        items = await client.submit("t.items", 1_000_000, 50, settings.database_url, 0.001)
        for rid in (fx, items):
            await wait_state(stores, rid, {"RUNNING"}, 20)
            await wait_until(lambda rid=rid: _has_checkpoint(stores, rid), timeout=20, what="a checkpoint")
        assert await client.cancel(fx, reason="wrong customer") == "STOPPING"
        assert await client.cancel(items, reason="wrong customer") == "STOPPING"
        for rid in (fx, items):
            await wait_state(stores, rid, {"CANCELLED"}, 15)
        assert await stores.redis.zcard(stores.keys("tq").active) == 0

        await record_all(stores)
        comp = await _fetch(stores, "SELECT id, idempotency_key, status FROM runs WHERE handler = 't.compensate'")
        assert [r["idempotency_key"] for r in comp] == [f"compensate:{fx}"], \
            "compensation only for the t.effects run that had started"
        (cid,) = [r["id"] for r in comp]
        assert await run_state(stores, cid) is None, "the compensation goes through the outbox relay"
        from fencepost.reconciler.outbox import OutboxRelay

        assert await OutboxRelay(stores).relay() == 1
        out = await client.wait(cid, timeout=20)
        assert (out.status, out.result) == ("SUCCEEDED", fx), "the compensation runs with the cancelled run's id"
    await record_all(stores)

    runs = {r["id"]: r for r in await _fetch(stores, "SELECT id, status, needs_compensation, forced FROM runs "
                                                     "WHERE handler <> 't.compensate'")}
    assert {rid: r["status"] for rid, r in runs.items()} == {rid: "CANCELLED" for rid in
                                                              (pending, pending_fx, paused, fx, items)}
    assert [rid for rid, r in runs.items() if r["needs_compensation"]] == [fx]
    assert not any(r["forced"] for r in runs.values()), "cooperative cancels are not forced"
    for rid in (fx, items):
        events = await client.events(rid)
        (req,) = _by_type(events, "stop_requested")
        assert (req["actor"], req["reason"]) == (client.actor, "wrong customer")
        (c,) = _by_type(events, "cancelled")
        assert (c["from_status"], c["to_status"]) == ("STOPPING", "CANCELLED")
        assert [(x["attempt"], x["outcome"]) for x in await client.attempts(rid)] == [(1, "cancelled")]
    for rid in (pending, pending_fx, paused):
        (c,) = _by_type(await client.events(rid), "cancelled")
        assert (c["actor"], c["reason"], c["to_status"]) == (client.actor, "not needed", "CANCELLED")
        assert await client.attempts(rid) == []
    assert await _rows(stores, pending) == 0 and await _rows(stores, paused) == 0


# -- 5. races: one winner each time, no illegal state ----------------------------------------------
async def test_two_concurrent_resumes_exactly_one_wins(client: Client, settings: Settings, stores: Stores) -> None:
    other = await Client(settings=settings, actor="ops:bob").connect()
    try:
        rid = await client.submit("t.noop")
        for _ in range(10):
            assert await client.pause(rid) == "PAUSED"
            res = await asyncio.gather(client.resume(rid), other.resume(rid), return_exceptions=True)
            wins = [r for r in res if r == "PENDING"]
            losses = [r for r in res if isinstance(r, IllegalTransition)]
            assert len(wins) == 1 and len(losses) == 1, res
            assert losses[0].current == "PENDING" and "already PENDING" in str(losses[0])
            assert await run_state(stores, rid) == "PENDING"
            assert await stores.redis.zcard(stores.keys("tq").due) == 1, "the run is enqueued once"
    finally:
        await other.close()
    await record_all(stores)
    assert len(_by_type(await client.events(rid), "resumed")) == 10


async def test_pause_racing_completion_the_completion_stands(client: Client, settings: Settings,
                                                             stores: Stores) -> None:
    keys = stores.keys("tq")
    # against the Lua directly: whichever lands first, the run ends SUCCEEDED
    requested = refused = 0
    for _ in range(30):
        rid = await client.submit("t.noop")
        raw = await _claim(stores)
        assert int(raw[0]) == rid
        token = raw[1].decode()

        async def finish(rid: int = rid, token: str = token) -> Any:
            await asyncio.sleep(random.random() * 0.004)  # land on either side of the pause
            return await stores.scripts.run("finish_runs", keys, [3, rid, token, "ok",
                                                                  encode_result(None), "", 0])

        res = await asyncio.gather(client.pause(rid), finish(), return_exceptions=True)
        assert res[1] == [b"SUCCEEDED"], res
        if res[0] == "REQUESTED":
            requested += 1
        else:
            assert isinstance(res[0], IllegalTransition) and res[0].current == "SUCCEEDED", res
            assert "already SUCCEEDED" in str(res[0])
            refused += 1
        assert await run_state(stores, rid) == "SUCCEEDED"
        assert await stores.redis.hget(keys.run(rid), "ctl") is None
    assert requested + refused == 30
    # a real worker: a pause request on a job that never checkpoints does not undo its completion
    async with _worker(settings):
        rid = await client.submit("t.sleep", 0.6)
        await wait_state(stores, rid, {"RUNNING"}, 20)
        assert await client.pause(rid, reason="too late") == "REQUESTED"
        out = await client.wait(rid, timeout=20)
        assert (out.status, out.result) == ("SUCCEEDED", 1)
    with pytest.raises(IllegalTransition) as ei:
        await client.pause(rid)
    assert ei.value.current == "SUCCEEDED" and "already SUCCEEDED" in str(ei.value)
    await record_all(stores)
    assert (await client.get(rid))["status"] == "SUCCEEDED"


async def test_cancel_racing_a_claim_never_both_claims_and_cancels(client: Client, stores: Stores) -> None:
    keys = stores.keys("tq")
    outcomes: dict[str, int] = {}
    for i in range(50):
        rid = await client.submit("t.noop")

        async def claim(i: int = i) -> list[Any]:
            await asyncio.sleep(random.random() * 0.004)  # land on either side of the cancel
            return await _claim(stores, 5, worker=f"w{i}")

        cancel_res, raw = await asyncio.gather(client.cancel(rid, reason="race"), claim())
        claimed = [int(raw[j]) for j in range(0, len(raw), 10)]
        assert claimed in ([], [rid]), claimed
        state = await run_state(stores, rid)
        if claimed:
            assert cancel_res == "STOPPING", "a claimed run was reported CANCELLED at once"
            assert state == "STOPPING" and (await stores.redis.hget(keys.run(rid), "ctl")) == b"cancel"
            # the worker lets go at its next boundary: the run ends CANCELLED
            fin = await stores.scripts.run("finish_runs", keys, [3, rid, raw[1].decode(),
                                                                 "interrupted", "", "", 0])
            assert fin == [b"CANCELLED"]
            outcomes["claim first"] = outcomes.get("claim first", 0) + 1
        else:
            assert cancel_res == "CANCELLED" and state == "CANCELLED"
            outcomes["cancel first"] = outcomes.get("cancel first", 0) + 1
        assert await run_state(stores, rid) == "CANCELLED"
        assert await stores.redis.zcard(keys.due) == 0 and await stores.redis.zcard(keys.active) == 0
    assert sum(outcomes.values()) == 50, outcomes
    await record_all(stores)
    status = {r["status"] for r in await _fetch(stores, "SELECT status FROM runs")}
    assert status == {"CANCELLED"}


async def test_commands_compare_and_set_on_the_expected_version(client: Client, stores: Stores) -> None:
    keys = stores.keys("tq")
    rid = await client.submit("t.noop")
    v0 = int(await stores.redis.hget(keys.run(rid), "version"))
    assert await client.pause(rid, expected_version=v0) == "PAUSED"
    v1 = int(await stores.redis.hget(keys.run(rid), "version"))
    assert v1 > v0
    assert await client.resume(rid, expected_version=v1) == "PENDING"
    with pytest.raises(ConcurrentModification) as ei:
        await client.pause(rid, expected_version=v0)
    assert isinstance(ei.value, IllegalTransition)
    assert ei.value.current == "PENDING" and ei.value.version == v1 + 1
    assert await run_state(stores, rid) == "PENDING", "a refused command changed the run"
    assert int(await stores.redis.hget(keys.run(rid), "version")) == v1 + 1
    with pytest.raises(IllegalTransition) as ei2:
        await client.resume(rid)
    assert ei2.value.current == "PENDING" and not isinstance(ei2.value, ConcurrentModification)
    with pytest.raises(IllegalTransition) as ei3:
        await client.stop(rid)
    assert ei3.value.current == "PENDING"


# -- 6. resume refused on an incompatible checkpoint schema; restart works -------------------------
async def test_resume_refused_on_incompatible_checkpoint_schema_and_restart_starts_over(
        client: Client, settings: Settings, items_table: Stores) -> None:
    stores = items_table
    n, every = 2000, 200
    async with _worker(settings):
        rid = await client.submit("t.items", n, every, settings.database_url, 0.0005)
        await wait_state(stores, rid, {"RUNNING"}, 20)
        await wait_until(lambda: _has_checkpoint(stores, rid), timeout=20, what="a checkpoint")
        assert await client.pause(rid) == "REQUESTED"
        await wait_state(stores, rid, {"PAUSED"}, 20)
        ckpt = await _checkpoint(stores, rid)
        assert ckpt is not None and ckpt["schema_version"] == 1 and 0 < ckpt["state"]["next"] < n
        first = await _rows(stores, rid)
        assert first == ckpt["state"]["next"]

        # the handler's definition moves to checkpoint schema version 2, with no migration
        await client.register([JobSpec(name="t.items", queue="tq", max_retries=5, timeout_s=300, version=2)])
        with pytest.raises(ResumeRefused) as ei:
            await client.resume(rid, reason="try")
        msg = str(ei.value)
        assert "schema version 1" in msg and "version 2" in msg and "restart" in msg.lower(), msg
        assert ei.value.offer == "restart" and ei.value.run_id == rid
        assert await run_state(stores, rid) == "PAUSED", "a refused resume changed the run"

        assert await client.restart(rid, reason="new schema") == "PENDING"
        out = await client.wait(rid, timeout=60)
        assert (out.status, out.result) == ("SUCCEEDED", n)
    counts = await _item_counts(stores, rid)
    assert counts[0] == 2, "the restarted attempt did not start from item 0"
    assert set(counts) == set(range(n)) and await _rows(stores, rid) == first + n
    assert {i for i, c in counts.items() if c == 2} == set(range(first))
    lo = await _val(stores, "SELECT min(split_part(op_key, ':', 2)::int) FROM processed_items "
                            "WHERE run_id = $1 AND attempt = 2", rid)
    assert lo == 0
    ck = await _checkpoint(stores, rid)
    assert ck is not None and ck["gen"] == 1 and ck["attempt"] == 2
    await record_all(stores)
    events = await client.events(rid)
    assert not _by_type(events, "resumed")
    (rs,) = _by_type(events, "restarted")
    assert (rs["actor"], rs["reason"], rs["from_status"], rs["to_status"]) == (client.actor, "new schema",
                                                                                "PAUSED", "PENDING")
    assert [(x["attempt"], x["outcome"]) for x in await client.attempts(rid)] == [(1, "paused"), (2, "succeeded")]


# -- 7. a stale attempt's late checkpoint is refused and never read --------------------------------
async def test_stale_attempts_late_checkpoint_is_rejected_and_not_read(client: Client, stores: Stores) -> None:
    keys = stores.keys("tq")
    rid = await client.submit("t.items", 10_000, 500, "unused")
    raw = await _claim(stores, worker="old-worker")
    assert int(raw[0]) == rid and int(raw[2]) == 1
    token1 = int(raw[1])
    cps = Checkpoints(stores, registry)
    old = Context(rid, 1, token1, "tq", "t.items", worker_id="old-worker", gen=0)
    old._writer = cps.write
    assert await old.checkpoint({"next": 500}, processed=500) == 1

    # the old worker stalls; its lease expires and a new attempt takes over
    later = int(time.time() * 1000) + 3_600_000
    await _at(stores, later)
    assert await stores.scripts.run("reap_expired", keys, [10, 10]) == 1
    raw = await _claim(stores, now=later, worker="new-worker")
    assert int(raw[0]) == rid and int(raw[2]) == 2
    token2 = int(raw[1])
    assert token2 > token1
    new = Context(rid, 2, token2, "tq", "t.items", worker_id="new-worker", gen=0)
    new._writer = cps.write
    await cps.load(new)
    assert new.checkpoint_data == {"next": 500} and new.checkpoint_version == 1

    # the stale attempt wakes up and checkpoints: refused
    with pytest.raises(LeaseLost):
        await old.checkpoint({"next": 9000}, processed=9000)
    assert old.should_stop()
    # ... also at the store itself, had it passed the Redis check just before the new claim
    assert await stores.db.fetchrow("write_checkpoint", rid, token1, 1, 0, 1, encode_result({"next": 9000}),
                                    9000) is None
    ck = await _checkpoint(stores, rid)
    assert ck["state"] == {"next": 500} and ck["version"] == 1 and ck["attempt"] == 1

    assert await new.checkpoint({"next": 1000}, processed=1000) == 2
    with pytest.raises(LeaseLost):
        await old.checkpoint({"next": 9500}, processed=9500)
    assert await stores.db.fetchrow("write_checkpoint", rid, token1, 1, 0, 1, encode_result({"next": 9500}),
                                    9500) is None
    ck = await _checkpoint(stores, rid)
    assert (ck["state"], ck["token"], ck["attempt"], ck["processed"]) == ({"next": 1000}, token2, 2, 1000)
    assert cps.refused == 2 and cps.written == 2

    # what the next attempt reads is the new attempt's state
    later += 3_600_000
    await _at(stores, later)
    assert await stores.scripts.run("reap_expired", keys, [10, 10]) == 1
    raw = await _claim(stores, now=later, worker="third-worker")
    third = Context(rid, int(raw[2]), int(raw[1]), "tq", "t.items", gen=0)
    await cps.load(third)
    assert third.checkpoint_data == {"next": 1000} and third.processed == 1000
    written = await _val(stores, "SELECT count(*) FROM events WHERE run_id = $1 AND type = 'checkpointed'", rid)
    assert written == 2, "a refused checkpoint left an event"


# -- 8. bulk commands need confirmation and are capped ---------------------------------------------
async def _cli(settings: Settings, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "fencepost.cli", *args, cwd=ROOT,
                                                env=worker_env(settings), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(errors="replace")


async def _redis_states(stores: Stores, ids: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for rid in ids:
        s = await run_state(stores, rid)
        out[s] = out.get(s, 0) + 1
    return out


async def test_bulk_cancel_needs_confirmation_and_respects_the_limit(client: Client, settings: Settings,
                                                                     stores: Stores) -> None:
    ids = [await client.submit("t.noop") for _ in range(7)]
    with pytest.raises(BulkNotConfirmed) as ei:
        await client.bulk("cancel", queue="tq", status="PENDING", confirm=False)
    assert ei.value.matched == 7
    assert await _redis_states(stores, ids) == {"PENDING": 7}, "an unconfirmed bulk command changed runs"

    res = await client.bulk("cancel", queue="tq", status="PENDING", limit=3, confirm=True, reason="cleanup")
    assert (res["matched"], res["acted"], res["results"], res["refused"]) == (7, 3, {"CANCELLED": 3}, {})
    assert await _redis_states(stores, ids) == {"PENDING": 4, "CANCELLED": 3}
    assert [await run_state(stores, r) for r in ids[:3]] == ["CANCELLED"] * 3  # in id order
    await record_all(stores)

    code, out = await _cli(settings, "cancel", "--queue", "tq", "--status", "PENDING")
    assert code == 0, out  # a dry run counts, as asked: exit 0 (issue 15; it was 1)
    assert "4 runs" in out and "nothing changed" in out and "--yes" in out, out
    assert await _redis_states(stores, ids) == {"PENDING": 4, "CANCELLED": 3}

    code, out = await _cli(settings, "cancel", "--queue", "tq", "--status", "PENDING", "--yes", "--limit", "2",
                           "--reason", "cli cleanup")
    assert code == 0, out
    assert "4 matched, 2 acted on: 2 CANCELLED" in out, out
    assert await _redis_states(stores, ids) == {"PENDING": 2, "CANCELLED": 5}
    await record_all(stores)
    (c,) = _by_type(await client.events(ids[3]), "cancelled")
    assert c["actor"].startswith("cli") and c["reason"] == "cli cleanup"
    assert await _val(stores, "SELECT count(*) FROM runs WHERE status = 'PENDING'") == 2


# -- 9. queue pause: nothing is dispatched from it --------------------------------------------------
async def test_paused_queue_dispatches_nothing_until_resumed(client: Client, settings: Settings,
                                                             stores: Stores) -> None:
    ids = [await client.submit("t.echo", 0)]  # the queue exists from here on
    await client.pause_queue("tq", reason="incident 42")
    ids += [await client.submit("t.echo", i) for i in range(1, 4)]
    assert await _claim(stores, 10) == [], "a paused queue dispatched a run"
    assert await _redis_states(stores, ids) == {"PENDING": 4}
    assert (await _fetch(stores, "SELECT paused FROM queues WHERE name = 'tq'"))[0]["paused"] is True
    async with _worker(settings) as w:
        assert await _claim(stores, 10) == []
        assert w.claimed == 0 and await _redis_states(stores, ids) == {"PENDING": 4}
        await client.resume_queue("tq", reason="incident over")
        for i, rid in enumerate(ids):
            out = await client.wait(rid, timeout=20)
            assert (out.status, out.result) == ("SUCCEEDED", i)
        assert w.claimed == 4
    code, out = await _cli(settings, "queue", "pause", "tq", "--reason", "cli")
    assert code == 0 and "paused" in out, out
    assert await _claim(stores, 10) == [] and await stores.redis.exists(stores.keys("tq").paused)
    events = await _fetch(stores, "SELECT type, actor, reason FROM events WHERE queue = 'tq' AND run_id IS NULL "
                                  "ORDER BY id")
    got = [(e["type"], e["actor"], e["reason"]) for e in events]
    assert got[:2] == [("queue_paused", client.actor, "incident 42"), ("queue_resumed", client.actor, "incident over")]
    assert len(got) == 3 and got[2][0] == "queue_paused" and got[2][1].startswith("cli") and got[2][2] == "cli"


# -- 10. thread handlers get the same checkpoint API -----------------------------------------------
async def test_thread_handler_pauses_at_a_checkpoint_and_resumes_from_it(client: Client, settings: Settings,
                                                                        stores: Stores) -> None:
    n, every = 2000, 100
    async with _worker(settings):
        rid = await client.submit("t.items_sync", n, every, 0.001)
        await wait_state(stores, rid, {"RUNNING"}, 20)
        await wait_until(lambda: _has_checkpoint(stores, rid), timeout=20, what="a checkpoint")
        assert await client.pause(rid, reason="thread pause") == "REQUESTED"
        await wait_state(stores, rid, {"PAUSED"}, 20)
        ck = await _checkpoint(stores, rid)
        k = ck["state"]["next"]
        assert 0 < k < n and k % every == 0 and ck["processed"] == k
        assert await stores.redis.zcard(stores.keys("tq").active) == 0
        assert await client.resume(rid, reason="go on") == "PENDING"
        out = await client.wait(rid, timeout=30)
        assert (out.status, out.result) == ("SUCCEEDED", n)
    await record_all(stores)
    assert [(x["attempt"], x["outcome"]) for x in await client.attempts(rid)] == [(1, "paused"), (2, "succeeded")]
    ck_events = await _fetch(stores, "SELECT attempt, (data->>'processed')::int AS p FROM events "
                                     "WHERE run_id = $1 AND type = 'checkpointed' ORDER BY id", rid)
    first2 = [e["p"] for e in ck_events if e["attempt"] == 2]
    assert [e["p"] for e in ck_events if e["attempt"] == 1][-1] == k
    assert first2[0] == k + every, "attempt 2 did not start from the checkpoint"
    assert [e["p"] for e in ck_events] == list(range(every, n + 1, every)), "a unit was checkpointed twice"
