"""History as one row per attempt (issue 23 item 1, DESIGN.md invariant 5): a claim and the worker's
finish are columns of the attempt's row, written once when they fall in one recorder batch and updated
once otherwise; a submit is its run row (021); everything else stays an event row; `run_events` (CLI,
API, dashboard) shows one timeline from all three; history an older version stored as event rows reads
the same after 020."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from fencepost.client import Client
from fencepost.core.hot import ClaimArgs, Finish, FinishArgs
from fencepost.core.models import Submit
from fencepost.core.record import migrations, query, upgrade
from fencepost.core.stores import Stores
from fencepost.reconciler.recorder import Recorder
from tests.conftest import ADMIN_URL, _db_url


async def _claim_and_finish(stores: Stores, n: int, *, outcome: str = "ok") -> list[Any]:
    keys = stores.keys("tq")
    jobs = await stores.scripts.claim_due(keys, ClaimArgs(n, "w", 30_000, 100))
    assert len(jobs) == n
    await stores.scripts.finish_runs(keys, FinishArgs(3), [Finish(j.id, j.token, outcome, b"\xc0" if outcome == "ok"
                                                                  else b"boom", "" if outcome == "ok" else "E", 0)
                                                           for j in jobs])
    return jobs


async def _entries(stores: Stores) -> list[tuple[str, bytes, dict[bytes, bytes]]]:
    stream = stores.keys("tq").events
    return [(stream, eid, f) for eid, f in await stores.redis.xrange(stream)]


def _timeline(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["type"], r["from_status"], r["to_status"], r["version"], r["attempt"]) for r in rows]


async def test_a_claim_and_its_finish_are_one_attempt_row_and_no_event_rows(client: Client, stores: Stores) -> None:
    ids = [await client.submit("t.noop") for _ in range(3)]
    jobs = await _claim_and_finish(stores, 3)
    rec = Recorder(stores, consumer="a")
    await rec._ensure_groups(["tq"])
    await rec.record(await _entries(stores), fresh=True)
    pool = stores.db.pool
    assert pool is not None
    assert await pool.fetchval("SELECT count(*) FROM events") == 0, \
        "no event rows: the submits are their run rows (021), the claims and finishes attempt columns"
    att = await pool.fetch("SELECT run_id, attempt, token, worker_id, outcome, claim_version, finish_type, "
                           "finish_version, finish_to FROM attempts ORDER BY run_id")
    tokens = {j.id: j.token for j in jobs}
    assert [tuple(r) for r in att] == [(rid, 1, tokens[rid], "w", "succeeded", 1, "succeeded", 2, "SUCCEEDED")
                                       for rid in sorted(ids)]
    for rid in ids:  # the timeline every reader shows (Client.events: CLI `events RUN`, API, dashboard)
        assert _timeline(await client.events(rid)) == [
            ("submitted", None, "PENDING", 0, None), ("claimed", "PENDING", "RUNNING", 1, 1),
            ("succeeded", "RUNNING", "SUCCEEDED", 2, 1)]


async def test_a_finish_in_a_later_batch_updates_its_attempt_row_once(client: Client, stores: Stores) -> None:
    rid = await client.submit("t.fail")
    await _claim_and_finish(stores, 1, outcome="fatal")
    entries = await _entries(stores)
    assert [f[b"type"] for _, _, f in entries] == [b"claimed", b"failed"]
    assert b"started" in entries[1][2], "the finish carries its attempt's start (its partition key)"
    rec = Recorder(stores, consumer="a")
    await rec._ensure_groups(["tq"])
    await rec.record(entries[:1], fresh=True)
    pool = stores.db.pool
    assert pool is not None
    before = await pool.fetchrow("SELECT started_at, finished_at, claim_version FROM attempts WHERE run_id = $1", rid)
    assert before is not None and before["finished_at"] is None and before["claim_version"] == 1
    await rec.record(entries[1:], fresh=True)
    rows = await pool.fetch("SELECT started_at, outcome, error_class, finish_type, reason FROM attempts "
                            "WHERE run_id = $1", rid)
    assert [tuple(r) for r in rows] == [(before["started_at"], "fatal", "E", "failed", "fatal")], \
        "one row, found by its key and closed"
    assert _timeline(await client.events(rid)) == [
        ("submitted", None, "PENDING", 0, None), ("claimed", "PENDING", "RUNNING", 1, 1),
        ("failed", "RUNNING", "FAILED", 2, 1)]
    assert await pool.fetchval("SELECT count(*) FROM events WHERE run_id = $1", rid) == 0


async def test_a_retry_scheduled_stays_an_event_row_beside_its_attempt(client: Client, stores: Stores) -> None:
    rid = await client.submit("t.fail")
    await _claim_and_finish(stores, 1, outcome="error")
    rec = Recorder(stores, consumer="a")
    await rec._ensure_groups(["tq"])
    await rec.record(await _entries(stores), fresh=True)
    pool = stores.db.pool
    assert pool is not None
    assert [r["type"] for r in await pool.fetch("SELECT type FROM events WHERE run_id = $1 ORDER BY id", rid)] == [
        "retry_scheduled"]
    att = await pool.fetchrow("SELECT outcome, finish_type FROM attempts WHERE run_id = $1", rid)
    assert att is not None and (att["outcome"], att["finish_type"]) == ("error", None), \
        "the attempt is closed; its closing transition is the event row, shown once"
    assert [t[0] for t in _timeline(await client.events(rid))] == ["submitted", "claimed", "retry_scheduled"]


async def test_a_submit_is_one_run_row_that_the_timeline_shows_as_submitted(client: Client, stores: Stores) -> None:
    rid = await client.submit("t.noop")
    [bulk] = await client.submit_many([Submit(handler="t.noop")])
    pool = stores.db.pool
    assert pool is not None
    assert await pool.fetchval("SELECT count(*) FROM events") == 0, "no 'submitted' event row beside the run row"
    for run in (rid, bulk):
        row = await pool.fetchrow("SELECT submitted_by, created_at FROM runs WHERE id = $1", run)
        assert row is not None and row["submitted_by"] == "client"
        [sub] = await client.events(run)
        assert (sub["type"], sub["to_status"], sub["version"], sub["actor"], sub["at"]) == (
            "submitted", "PENDING", 0, "client", row["created_at"])
    assert await stores.db.fetchval("api_submitted_by", rid) == "client", "the API's scope check reads the row"


@pytest.fixture
async def empty_db() -> Any:
    name = f"fp_hist_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    yield _db_url(name)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


async def test_history_stored_as_event_rows_before_020_reads_the_same_after_it(empty_db: str) -> None:
    conn = await asyncpg.connect(empty_db)
    try:
        await conn.execute("CREATE TABLE fencepost_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                           "checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        for version, name, sql in migrations():
            if version >= 20:
                break
            await conn.execute(sql)
            await conn.execute("INSERT INTO fencepost_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                               version, name, hashlib.sha256(sql.encode()).hexdigest())
        # a run as the recorder stored it before 020: every transition an event row, an attempt row beside
        t0 = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)
        rid = await conn.fetchval(
            "INSERT INTO runs (handler, queue, status, payload, max_retries, timeout_s, attempt, token, version, "
            "started_at, finished_at) VALUES ('t.noop', 'tq', 'SUCCEEDED', '\\x90', 3, 60, 1, 77, 2, $1, $1) "
            "RETURNING id", t0)
        await conn.execute(
            "INSERT INTO events (run_id, type, from_status, to_status, version, attempt, token, worker_id, at, "
            "stream, stream_id) VALUES ($1, 'submitted', NULL, 'PENDING', 0, NULL, NULL, NULL, $2, NULL, NULL), "
            "($1, 'claimed', 'PENDING', 'RUNNING', 1, 1, 77, 'w-old', $2::timestamptz + interval '1 ms', "
            "'fp:{tq}:events', 10), "
            "($1, 'succeeded', 'RUNNING', 'SUCCEEDED', 2, 1, 77, 'w-old', $2::timestamptz + interval '5 ms', "
            "'fp:{tq}:events', 11)",
            rid, t0)
        await conn.execute("INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome) "
                           "VALUES ($1, 1, 77, 'w-old', $2::timestamptz + interval '1 ms', "
                           "$2::timestamptz + interval '5 ms', 'succeeded')", rid, t0)
        before = [tuple(r) for r in await conn.fetch(
            "SELECT type, from_status, to_status, version, attempt, token, worker_id, at FROM events "
            "WHERE run_id = $1 ORDER BY at, id", rid)]
        assert (await upgrade(conn))[0].startswith("020_"), "020 applied over the planted history"
        timeline = [(r["type"], r["from_status"], r["to_status"], r["version"], r["attempt"], r["token"],
                     r["worker_id"], r["at"]) for r in await conn.fetch(query("run_events"), rid)]
        assert timeline == before, "the old run's timeline is its old events, nothing doubled or lost"
    finally:
        await conn.close()
