"""Crashes and shutdowns: real worker and reconciler processes killed with SIGKILL/SIGTERM,
hung and dying job processes, leaked threads, and a recorder killed between its commit
and its acknowledgement. Nothing may be lost, run twice, or recorded twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit, decode_result
from fencepost.core.stores import Stores
from fencepost.reconciler.recorder import GROUP, Recorder, stream_id_int
from fencepost.worker.runtime import Worker, WorkerOptions
from tests.apps import registry
from tests.conftest import log_tail, record_all, run_state, spawn, wait_state, wait_until

pytestmark = pytest.mark.slow

APP = "tests.apps:registry"
WORKER = ("worker", "--app", APP, "--queue", "tq")


# -- helpers ---------------------------------------------------------------------------------------
def _kill(*procs: subprocess.Popen[bytes]) -> None:
    """SIGKILL whatever is still running and reap it."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass




async def _exited(proc: subprocess.Popen[bytes], timeout: float, what: str, log: Path | None = None) -> int:
    async def done() -> bool:
        return proc.poll() is not None

    try:
        await wait_until(done, timeout=timeout, what=what, interval=0.05)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- log ---\n{log_tail(log) if log else ''}") from None
    return proc.returncode


async def _submit_many(client: Client, handler: str, n: int, batch: int = 1000) -> list[int]:
    ids: list[int] = []
    for i in range(0, n, batch):
        ids += await client.submit_many([Submit(handler=handler) for _ in range(min(batch, n - i))])
    return ids






async def _fetch(stores: Stores, sql: str, *args: Any) -> list[Any]:
    return await stores.db.pool.fetch(sql, *args)  # type: ignore[union-attr]


async def _val(stores: Stores, sql: str, *args: Any) -> Any:
    return await stores.db.pool.fetchval(sql, *args)  # type: ignore[union-attr]


async def _transitions(stores: Stores) -> set[tuple[int, int, str, str, str, int]]:
    """Every transition Redis wrote, as (stream_id, run, type, from, to, version): the ground truth."""
    entries = await stores.redis.xrange(stores.keys("tq").events)
    return {(stream_id_int(eid), int(f[b"run"]), f[b"type"].decode(), f[b"from"].decode(), f[b"to"].decode(),
             int(f[b"v"])) for eid, f in entries}


async def _stream_events_in_pg(stores: Stores) -> int:
    return await _val(stores, "SELECT count(*) FROM history WHERE stream_id IS NOT NULL")


async def _pending(stores: Stores, consumer: str | None = None) -> int:
    """Entries delivered to the recorder group and not acknowledged (of one consumer, if given)."""
    stream = stores.keys("tq").events
    info = await stores.redis.xpending(stream, GROUP)
    if consumer is None:
        return int(info["pending"])
    for c in info.get("consumers") or []:
        name = c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
        if name == consumer:
            return int(c["pending"])
    return 0


async def _assert_history_equals(stores: Stores, expected: set[tuple[int, int, str, str, str, int]],
                                 run_ids: list[int]) -> None:
    """PostgreSQL holds exactly the transitions Redis made: none lost, none doubled, versions contiguous."""
    rows = await _fetch(stores, "SELECT stream_id, run_id, type, from_status, to_status, version FROM history "
                                "WHERE stream_id IS NOT NULL")
    got = [(r["stream_id"], r["run_id"], r["type"], r["from_status"], r["to_status"], r["version"]) for r in rows]
    assert len(got) == len(set(got)), "an event was recorded twice"
    missing, extra = expected - set(got), set(got) - expected
    assert not missing and not extra, (f"{len(missing)} transitions missing (e.g. {sorted(missing)[:3]}), "
                                       f"{len(extra)} unexpected (e.g. {sorted(extra)[:3]})")
    dup = await _fetch(stores, "SELECT run_id, type, count(*) AS n FROM history GROUP BY run_id, type "
                               "HAVING count(*) > 1 LIMIT 5")
    assert not dup, f"duplicate (run, type) events: {[dict(r) for r in dup]}"
    per_run = await _fetch(stores, "SELECT run_id, array_agg(version ORDER BY version) AS vs FROM history "
                                   "WHERE stream_id IS NOT NULL GROUP BY run_id")
    gaps = [(r["run_id"], list(r["vs"])) for r in per_run if list(r["vs"]) != list(range(1, len(r["vs"]) + 1))]
    assert not gaps, f"versions are not 1..n per run: {gaps[:5]}"
    sub = await _fetch(stores, "SELECT run_id, count(*) AS n, min(version) AS v FROM history WHERE type = 'submitted' "
                               "GROUP BY run_id")
    assert {r["run_id"] for r in sub} == set(run_ids) and {(r["n"], r["v"]) for r in sub} == {(1, 0)}


async def _assert_finished_hashes_expire(stores: Stores, run_ids: list[int]) -> None:
    """Every recorded terminal run's Redis hash got its TTL (expire_finished), or Redis leaks it."""
    pipe = stores.redis.pipeline(transaction=False)
    for rid in run_ids:
        pipe.pttl(stores.keys("tq").run(rid))
    ttls = await pipe.execute()
    forever = [rid for rid, ttl in zip(run_ids, ttls) if ttl == -1]
    assert not forever, (f"{len(forever)} finished runs keep their Redis hash forever (no TTL), "
                         f"e.g. {forever[:5]}")


async def _run_burst_worker(settings: Settings, concurrency: int = 200) -> Worker:
    w = Worker(registry, WorkerOptions(queues=["tq"], concurrency=concurrency, burst=True), settings=settings)
    await asyncio.wait_for(w.run(), 90)
    return w


# -- 1. many worker processes claiming from one queue ------------------------------------------------
async def test_eight_worker_processes_claim_each_run_exactly_once(client: Client, settings: Settings,
                                                                  stores: Stores, tmp_path: Path) -> None:
    n = 5000
    keys = stores.keys("tq")
    await stores.redis.set(keys.paused, 1)  # hold the queue until all eight workers are up
    ids = await _submit_many(client, "t.noop", n)
    logs = [tmp_path / f"w{i}.log" for i in range(8)]
    procs = [spawn(settings, *WORKER, "--concurrency", "50", "--processes", "1", "--burst", log=log) for log in logs]
    try:
        async def all_started() -> bool:
            return all(log.exists() and b"worker_started" in log.read_bytes() for log in logs)

        try:
            await wait_until(all_started, timeout=40, what="8 workers to start", interval=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(f"--- {log.name}\n{log_tail(log, 5)}" for log in logs)) from None
        t0 = time.monotonic()
        await stores.redis.delete(keys.paused)
        await stores.redis.rpush(keys.wake, 1)
        for p, log in zip(procs, logs):
            code = await _exited(p, 40, "burst workers to drain the queue and exit", log)
            assert code == 0, f"worker exited with {code}\n{log_tail(log)}"
        drain_s = time.monotonic() - t0
    finally:
        _kill(*procs)
    assert await stores.redis.zcard(keys.due) == 0 and await stores.redis.zcard(keys.active) == 0
    assert int(await stores.redis.hget(keys.stats, "stale_finish") or 0) == 0, "a finish was rejected as stale"
    await record_all(stores, timeout=60)

    status = {r["status"]: r["n"] for r in await _fetch(
        stores, "SELECT status, count(*) AS n FROM runs WHERE id = ANY($1::bigint[]) GROUP BY status", ids)}
    assert status == {"SUCCEEDED": n}, f"not every run succeeded (drained in {drain_s:.1f}s): {status}"
    claimed = await _fetch(stores, "SELECT run_id, count(*) AS n FROM history WHERE type = 'claimed' GROUP BY run_id")
    assert len(claimed) == n and {r["n"] for r in claimed} == {1}, "a run was claimed more than once (or never)"
    att = await _fetch(stores, "SELECT run_id, attempt, token, outcome FROM attempts")
    assert len(att) == n and {r["run_id"] for r in att} == set(ids)
    assert {(r["attempt"], r["outcome"]) for r in att} == {(1, "succeeded")}
    assert len({r["token"] for r in att}) == n, "two attempts share a fencing token"
    dup_tokens = await _val(stores, "SELECT count(*) FROM (SELECT token FROM history WHERE type = 'claimed' "
                                    "GROUP BY token HAVING count(*) > 1) d")
    assert dup_tokens == 0
    assert await _val(stores, "SELECT count(*) FROM runs WHERE status = 'RUNNING'") == 0
    workers = await _fetch(stores, "SELECT worker_id, count(*) AS n FROM attempts GROUP BY worker_id")
    assert len(workers) == 8, f"expected all 8 workers to claim concurrently, got {[dict(r) for r in workers]}"


# -- 2. kill -9 of a worker mid-run -------------------------------------------------------------------
async def test_sigkilled_worker_run_is_reclaimed_after_its_lease_expires(client: Client, settings: Settings,
                                                                         stores: Stores, tmp_path: Path) -> None:
    run_id = await client.submit("t.sleep", 30, kwargs={"only_attempt": 1})
    log1, log2 = tmp_path / "w1.log", tmp_path / "w2.log"
    w1 = spawn(settings, *WORKER, "--processes", "1", log=log1, FENCEPOST_LEASE_MS="1500")
    w2: subprocess.Popen[bytes] | None = None
    try:
        await wait_state(stores, run_id, {"RUNNING"}, 30, "the first worker to claim the run", log1)
        w1_id = (await stores.redis.hget(stores.keys("tq").run(run_id), "worker")).decode()
        os.kill(w1.pid, signal.SIGKILL)
        assert await _exited(w1, 10, "the SIGKILLed worker to die") == -signal.SIGKILL
        assert await run_state(stores, run_id) == "RUNNING", "nobody may touch the run before its lease expires"
        w2 = spawn(settings, *WORKER, "--processes", "1", log=log2, FENCEPOST_LEASE_MS="1500")
        await wait_state(stores, run_id, {"SUCCEEDED", "FAILED"}, 30, "the second worker to finish the run", log2)
    finally:
        _kill(w1, *([w2] if w2 else []))
    await record_all(stores)
    run = await client.get(run_id)
    assert run["status"] == "SUCCEEDED" and run["attempt"] == 2 and decode_result(run["result"]) == 2
    attempts = await client.attempts(run_id)
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "interrupted"), (2, "succeeded")]
    assert attempts[0]["worker_id"] == w1_id and attempts[1]["worker_id"] != w1_id
    assert attempts[1]["token"] > attempts[0]["token"]
    events = [(e["type"], e["from_status"], e["to_status"]) for e in await client.events(run_id)]
    assert events == [("submitted", None, "PENDING"), ("claimed", "PENDING", "RUNNING"),
                      ("lease_expired", "RUNNING", "PENDING"), ("claimed", "PENDING", "RUNNING"),
                      ("succeeded", "RUNNING", "SUCCEEDED")]


# -- 3. recorder killed mid-batch ---------------------------------------------------------------------
@pytest.mark.parametrize("crash_at", ["ack", "expire"])
async def test_recorder_crash_after_commit_before_ack_replays_without_duplicates(
        client: Client, settings: Settings, stores: Stores, monkeypatch: pytest.MonkeyPatch, crash_at: str) -> None:
    """The second batch is committed to PostgreSQL, then the recorder dies: at the start of
    `_acknowledge` ("ack"), or while giving finished hashes their TTL ("expire")."""
    ids = await client.submit_many([Submit(handler="t.echo", args=(i,)) for i in range(200)])
    await _run_burst_worker(settings, concurrency=50)
    expected = await _transitions(stores)
    assert len(expected) == 400

    real_ack, real_run = Recorder._acknowledge, stores.scripts.run
    calls = {"n": 0}

    async def ack_then_die_once(self: Recorder, entries: Any, runs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2 and crash_at == "ack":
            raise RuntimeError("recorder killed between commit and ack")
        await real_ack(self, entries, runs)

    async def run_script(name: str, keys: Any, args: Any) -> Any:
        if name == "expire_finished" and calls["n"] == 2 and crash_at == "expire":
            raise RuntimeError("recorder killed between commit and ack (in expire_finished)")
        return await real_run(name, keys, args)

    monkeypatch.setattr(Recorder, "_acknowledge", ack_then_die_once)
    monkeypatch.setattr(stores.scripts, "run", run_script)
    first = Recorder(stores, consumer="rec-a", batch=150)
    assert await first.run_once(block_ms=50) == 150
    with pytest.raises(RuntimeError, match="between commit and ack"):
        await first.run_once(block_ms=50)
    assert await _stream_events_in_pg(stores) == 300, "the second batch must be committed"
    assert await _pending(stores, "rec-a") == 150, "the committed batch must still be pending (never acked)"
    monkeypatch.setattr(Recorder, "_acknowledge", real_ack)
    monkeypatch.setattr(stores.scripts, "run", real_run)

    second = Recorder(stores, consumer="rec-a", batch=150)  # the restart: same consumer name
    assert await second.run_once(pending=True) == 150
    assert await second.run_once(pending=True) == 0
    assert await _pending(stores) == 0
    assert await _stream_events_in_pg(stores) == 300, "replaying a committed batch must write nothing"
    await record_all(stores)
    assert await stores.redis.xlen(stores.keys("tq").events) == 0

    await _assert_history_equals(stores, expected, ids)
    rows = await stores.db.fetch("run_status", ids)
    assert {r["status"] for r in rows} == {"SUCCEEDED"}
    assert sorted(decode_result(r["result"]) for r in rows) == list(range(200))
    att = await _fetch(stores, "SELECT attempt, outcome, count(*) AS n FROM attempts GROUP BY attempt, outcome")
    assert [(r["attempt"], r["outcome"], r["n"]) for r in att] == [(1, "succeeded", 200)]
    await _assert_finished_hashes_expire(stores, ids)


async def _backlog(client: Client, settings: Settings, stores: Stores, n: int) -> tuple[list[int], set[Any]]:
    """n t.noop runs worked off with no recorder running: 2n transitions waiting in the stream."""
    ids = await _submit_many(client, "t.noop", n)
    await _run_burst_worker(settings, concurrency=200)
    expected = await _transitions(stores)
    assert len(expected) == 2 * n
    return ids, expected


_GATE = 0x7E57  # advisory lock key the test holds to stop the recorder inside its second batch


async def _kill_recorder_mid_batch(settings: Settings, stores: Stores, total: int, log: Path) -> int:
    """Start `fencepost reconciler` as rec-1 and SIGKILL it in the middle of a batch: its first
    batch committed and acknowledged, its second read from the stream (pending) and inside its
    PostgreSQL transaction, not committed. Returns its pending count at death.

    To kill at that point every time rather than by luck, a test-only statement trigger makes an
    insert into `attempts` wait on an advisory lock the test holds once any attempt row exists (a claim
    and its finish are attempt columns: issue 23)."""
    gate = await asyncpg.connect(settings.database_url)
    await gate.execute(f"""
        CREATE FUNCTION test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM attempts) THEN
                PERFORM pg_advisory_xact_lock_shared({_GATE});
            END IF;
            RETURN NULL;
        END $$;
        CREATE TRIGGER test_gate BEFORE INSERT ON attempts FOR EACH STATEMENT EXECUTE FUNCTION test_gate();
        SELECT pg_advisory_lock({_GATE});""")
    rec = spawn(settings, "reconciler", log=log, FENCEPOST_RECORDER_ID="rec-1")
    try:
        async def blocked_mid_batch() -> bool:
            done = await _stream_events_in_pg(stores)
            waiting = await gate.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                          "AND wait_event_type = 'Lock' AND wait_event = 'advisory'")
            return 0 < done < total and waiting == 1 and await _pending(stores, "rec-1") > 0

        try:
            await wait_until(blocked_mid_batch, timeout=40, what="the recorder to block inside its second batch",
                             interval=0.05)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log_tail(log)}") from None
        os.kill(rec.pid, signal.SIGKILL)
        assert await _exited(rec, 10, "the SIGKILLed reconciler to die") == -signal.SIGKILL
        # its server-side session would otherwise sit on the gate (and its uncommitted rows) until released
        await gate.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock' AND wait_event = 'advisory'")

        async def orphan_gone() -> bool:
            return await gate.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted") == 0

        await wait_until(orphan_gone, timeout=10, what="the dead recorder's PostgreSQL session to end")
        await gate.execute(f"SELECT pg_advisory_unlock({_GATE}); DROP TRIGGER test_gate ON attempts; "
                           "DROP FUNCTION test_gate()")
    finally:
        _kill(rec)
        await gate.close()
    pending = await _pending(stores, "rec-1")
    done = await _stream_events_in_pg(stores)
    assert 0 < done < total and pending > 0, f"not killed mid-batch: {done}/{total} recorded, {pending} pending"
    return pending


async def _assert_three_events_per_run(stores: Stores, ids: list[int]) -> None:
    rows = await _fetch(stores, "SELECT run_id, array_agg(type ORDER BY version) AS types FROM history "
                                "GROUP BY run_id")
    bad = [dict(r) for r in rows if list(r["types"]) != ["submitted", "claimed", "succeeded"]]
    assert not bad and len(rows) == len(ids), f"runs whose history is not exactly submitted, claimed, succeeded: {bad[:5]}"
    status = await _fetch(stores, "SELECT status, count(*) AS n FROM runs GROUP BY status")
    assert {r["status"]: r["n"] for r in status} == {"SUCCEEDED": len(ids)}
    assert await _val(stores, "SELECT count(*) FROM attempts WHERE outcome = 'succeeded'") == len(ids)


async def test_sigkilled_reconciler_restarted_with_same_id_records_everything_once(
        client: Client, settings: Settings, stores: Stores, tmp_path: Path) -> None:
    ids, expected = await _backlog(client, settings, stores, 5000)
    total = len(expected)
    pending = await _kill_recorder_mid_batch(settings, stores, total, tmp_path / "rec1.log")

    log2 = tmp_path / "rec1-again.log"
    rec = spawn(settings, "reconciler", log=log2, FENCEPOST_RECORDER_ID="rec-1")
    try:
        async def drained() -> bool:
            return await _stream_events_in_pg(stores) == total and await _pending(stores) == 0 \
                and await stores.redis.xlen(stores.keys("tq").events) == 0

        try:
            await wait_until(drained, timeout=40, what="the restarted recorder to record everything", interval=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc} (pending at kill: {pending})\n{log_tail(log2)}") from None
    finally:
        _kill(rec)
    await _assert_history_equals(stores, expected, ids)
    await _assert_three_events_per_run(stores, ids)
    await _assert_finished_hashes_expire(stores, ids)


async def test_recorder_with_another_id_adopts_a_dead_recorders_pending_entries(
        client: Client, settings: Settings, stores: Stores, tmp_path: Path) -> None:
    ids, expected = await _backlog(client, settings, stores, 5000)
    total = len(expected)
    pending = await _kill_recorder_mid_batch(settings, stores, total, tmp_path / "rec1.log")

    other = Recorder(stores, consumer="rec-2", claim_idle_ms=500)
    adopted = 0

    async def adopt() -> bool:
        nonlocal adopted
        adopted += await other.adopt_orphans()
        return await _pending(stores, "rec-1") == 0

    await wait_until(adopt, timeout=20, what="rec-2 to adopt rec-1's pending entries", interval=0.1)
    assert adopted == pending, f"adopted {adopted} entries, rec-1 had {pending} pending"
    await record_all(stores, timeout=60)
    assert await _pending(stores) == 0 and await stores.redis.xlen(stores.keys("tq").events) == 0
    await _assert_history_equals(stores, expected, ids)
    await _assert_three_events_per_run(stores, ids)
    await _assert_finished_hashes_expire(stores, ids)


# -- 4. a hung process job is killed; the worker keeps serving ------------------------------------------
async def test_hung_process_job_is_killed_at_its_timeout_while_others_keep_running(
        client: Client, settings: Settings, stores: Stores) -> None:
    hang = await client.submit("t.hang")
    others = await client.submit_many([Submit(handler="t.spin", args=(10_000 + i,)) for i in range(15)]
                                      + [Submit(handler="t.echo", args=(i,)) for i in range(15)])
    worker = Worker(registry, WorkerOptions(queues=["tq"], concurrency=20, processes=2, idle_wait_s=0.1),
                    settings=settings, app=APP)
    task = asyncio.create_task(worker.run())
    try:
        await wait_state(stores, hang, {"RUNNING"}, 30, "the worker to claim the hanging run")
        pool = worker.executors.procs
        assert pool is not None
        children = list(pool._children)
        assert len(children) == 2

        async def all_finished() -> bool:
            states = [await run_state(stores, rid) for rid in [hang, *others]]
            return all(st in ("SUCCEEDED", "FAILED", "TIMED_OUT") for st in states)

        await wait_until(all_finished, timeout=30, what="every run to finish")
        assert await run_state(stores, hang) == "TIMED_OUT"
        exits = sorted((c.proc.exitcode for c in children), key=str)
        assert exits == [-signal.SIGKILL, None], f"exactly the hung child must be killed, got exit codes {exits}"
        assert pool.rebuilds == 1 and len(pool._children) == 2, "the killed child must be replaced"
        assert all(c.proc.is_alive() for c in pool._children)
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)
    await record_all(stores)

    h = await client.get(hang)
    assert h["status"] == "TIMED_OUT" and h["reason"] == "timeout" and h["attempt"] == 1
    assert 1.9 <= (h["finished_at"] - h["started_at"]).total_seconds() < 10
    assert [(a["attempt"], a["outcome"]) for a in await client.attempts(hang)] == [(1, "timeout")]
    rows = await _fetch(stores, "SELECT id, handler, status, finished_at, result FROM runs WHERE id = ANY($1::bigint[])",
                        others)
    assert {r["status"] for r in rows} == {"SUCCEEDED"}
    late = [r["id"] for r in rows if r["finished_at"] >= h["finished_at"]]
    assert not late, f"runs {late} waited for the hung job instead of running beside it"
    spins = sorted(decode_result(r["result"]) for r in rows if r["handler"] == "t.spin")
    assert spins == sorted(sum(range(10_000 + i)) for i in range(15))


# -- 5. a job that kills its own process -----------------------------------------------------------------
async def test_job_that_kills_its_process_is_quarantined_after_repeated_crashes(
        client: Client, settings: Settings, stores: Stores) -> None:
    assert settings.quarantine_after == 3
    run_id = await client.submit("t.die")
    worker = Worker(registry, WorkerOptions(queues=["tq"], concurrency=4, processes=1, burst=True),
                    settings=settings, app=APP)
    await asyncio.wait_for(worker.run(), 60)
    assert worker.executors.procs is not None and worker.executors.procs.rebuilds == 3
    await record_all(stores)

    run = await client.get(run_id)
    assert run["max_retries"] == 10
    assert (run["status"], run["reason"], run["attempt"]) == ("FAILED", "quarantined", 3)
    assert run["last_error_class"] == "WorkerCrash" and "code 7" in run["last_error"]
    attempts = await client.attempts(run_id)
    assert [(a["attempt"], a["outcome"], a["error_class"]) for a in attempts] == \
        [(n, "crash", "WorkerCrash") for n in (1, 2, 3)]
    types = [e["type"] for e in await client.events(run_id)]
    assert types == ["submitted", "claimed", "retry_scheduled", "due", "claimed", "retry_scheduled", "due",
                     "claimed", "failed"]


# -- 6. SIGTERM ------------------------------------------------------------------------------------------
async def test_sigterm_releases_a_run_longer_than_the_grace_period(client: Client, settings: Settings,
                                                                   stores: Stores, tmp_path: Path) -> None:
    run_id = await client.submit("t.sleep", 60, kwargs={"only_attempt": 1})
    log1, log2 = tmp_path / "w1.log", tmp_path / "w2.log"
    w1 = spawn(settings, *WORKER, "--processes", "1", "--grace", "1", log=log1)
    w2: subprocess.Popen[bytes] | None = None
    try:
        await wait_state(stores, run_id, {"RUNNING"}, 30, "the worker to claim the run", log1)
        t0 = time.monotonic()
        w1.send_signal(signal.SIGTERM)
        code = await _exited(w1, 10, "the worker to exit after SIGTERM with --grace 1", log1)
        took = time.monotonic() - t0
        assert code == 0, log_tail(log1)
        assert 0.9 <= took < 10, f"exited {took:.1f}s after SIGTERM"
        assert await run_state(stores, run_id) == "PENDING", "the unfinished run must be released"
        w2 = spawn(settings, *WORKER, "--processes", "1", log=log2)
        await wait_state(stores, run_id, {"SUCCEEDED", "FAILED"}, 30, "a second worker to complete it", log2)
    finally:
        _kill(w1, *([w2] if w2 else []))
    await record_all(stores)
    run = await client.get(run_id)
    assert run["status"] == "SUCCEEDED" and decode_result(run["result"]) == 2
    assert [(a["attempt"], a["outcome"]) for a in await client.attempts(run_id)] == [(1, "released"), (2, "succeeded")]
    assert [(e["type"], e["to_status"]) for e in await client.events(run_id)] == [
        ("submitted", "PENDING"), ("claimed", "RUNNING"), ("released", "PENDING"), ("claimed", "RUNNING"),
        ("succeeded", "SUCCEEDED")]


async def test_sigterm_lets_a_job_shorter_than_the_grace_period_finish(client: Client, settings: Settings,
                                                                       stores: Stores, tmp_path: Path) -> None:
    run_id = await client.submit("t.sleep", 1.5)
    log = tmp_path / "w.log"
    w = spawn(settings, *WORKER, "--processes", "1", "--grace", "20", log=log)
    try:
        await wait_state(stores, run_id, {"RUNNING"}, 30, "the worker to claim the run", log)
        t0 = time.monotonic()
        w.send_signal(signal.SIGTERM)
        code = await _exited(w, 15, "the worker to exit once its job finished", log)
        took = time.monotonic() - t0
    finally:
        _kill(w)
    assert code == 0, log_tail(log)
    assert await run_state(stores, run_id) == "SUCCEEDED", "the job must finish before the worker exits"
    assert took < 15, f"the worker waited {took:.1f}s: longer than its job"
    await record_all(stores)
    run = await client.get(run_id)
    assert run["status"] == "SUCCEEDED" and decode_result(run["result"]) == 1
    assert [e["type"] for e in await client.events(run_id)] == ["submitted", "claimed", "succeeded"]


# -- 7. a thread job that outlives its timeout ---------------------------------------------------------------
async def test_thread_job_past_its_timeout_is_timed_out_and_its_thread_counted_as_leaked(
        client: Client, settings: Settings, stores: Stores) -> None:
    worker = Worker(registry, WorkerOptions(queues=["tq"], concurrency=4, idle_wait_s=0.1), settings=settings)
    task = asyncio.create_task(worker.run())
    try:
        run_id = await client.submit("t.block", 5)
        await wait_state(stores, run_id, {"RUNNING"}, 15, "the worker to claim the run")
        t0 = time.monotonic()
        await wait_state(stores, run_id, {"TIMED_OUT", "SUCCEEDED", "FAILED"}, 10, "the run to time out")
        took = time.monotonic() - t0
        assert await run_state(stores, run_id) == "TIMED_OUT"
        assert 0.5 <= took < 3, f"timed out after {took:.1f}s; its timeout is 1s"
        assert worker.executors.leaked_threads == 1, "the stuck thread must be counted as leaked"
        assert worker._free() == 3, "a leaked thread holds a slot"

        async def returned() -> bool:
            return worker.executors.leaked_threads == 0

        await wait_until(returned, timeout=10, what="the leaked thread to return")
        assert time.monotonic() - t0 >= 3, "the thread returned before its 5s sleep ended"
        assert await run_state(stores, run_id) == "TIMED_OUT", "the late result must not be recorded"
        assert int(await stores.redis.hget(stores.keys("tq").stats, "stale_finish") or 0) == 0
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)
    await record_all(stores)
    run = await client.get(run_id)
    assert (run["status"], run["reason"], run["result"]) == ("TIMED_OUT", "timeout", None)
    assert [e["type"] for e in await client.events(run_id)] == ["submitted", "claimed", "timed_out"]
    assert [(a["attempt"], a["outcome"]) for a in await client.attempts(run_id)] == [(1, "timeout")]
