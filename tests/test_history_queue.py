"""Every history row says its queue (issue 24, 047): the recorder writes the queue of the stream an entry came
from on each event row and attempt row, every other statement that writes an event row writes its run's
queue, and 047 fills the rows an older version stored (from runs, else the archive), so a queue's history
reads that queue's rows only."""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from fencepost.client import Client
from fencepost.core.hot import ClaimArgs, Finish, FinishArgs
from fencepost.core.record import migrations, query, upgrade
from fencepost.core.stores import Stores
from tests.conftest import ADMIN_URL, _db_url, record_all

SQL = Path(__file__).resolve().parent.parent / "sql"


@pytest.fixture
async def empty_db() -> AsyncIterator[str]:
    name = f"fp_hq_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    yield _db_url(name)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


async def test_the_recorder_writes_the_streams_queue_on_event_and_attempt_rows(client: Client, stores: Stores) -> None:
    failing = await client.submit("t.fail", queue="tq")
    other = await client.submit("t.noop", queue="qb")
    keys = stores.keys("tq")
    [job] = await stores.scripts.claim_due(keys, ClaimArgs(1, "w", 30_000, 100))
    await stores.scripts.finish_runs(keys, FinishArgs(3), [Finish(job.id, job.token, "error", b"boom", "E", 0)])
    await client.pause(other, reason="hold")  # an operator's command: an event row with an actor
    await record_all(stores)
    pool = stores.db.pool
    assert pool is not None
    events = {(r["run_id"], r["type"]): r["queue"] for r in await pool.fetch("SELECT run_id, type, queue FROM events")}
    assert events == {(failing, "retry_scheduled"): "tq", (other, "paused"): "qb"}, events
    attempts = [tuple(r) for r in await pool.fetch("SELECT run_id, queue, claim_version FROM attempts")]
    assert attempts == [(failing, "tq", 1)], attempts


def test_every_statement_that_writes_an_event_row_names_its_queue() -> None:
    """A row without its queue is found by a queue's history only through its run (events_queue_unknown):
    each writer names it, so that index stays about empty."""
    missing = []
    for path in sorted(SQL.glob("queries*.sql")):
        for block in re.split(r"^-- name: ", path.read_text(), flags=re.M)[1:]:
            name = block.split(None, 1)[0]
            for cols in re.findall(r"INSERT INTO events\s*\(([^)]*)\)", block):
                if "queue" not in [c.strip() for c in cols.split(",")]:
                    missing.append(f"{path.name}:{name}")
    assert missing == [], f"event rows written without their queue: {missing}"


async def test_history_an_older_version_stored_gets_its_runs_queue_from_047(empty_db: str) -> None:
    conn = await asyncpg.connect(empty_db)
    try:
        await conn.execute("CREATE TABLE fencepost_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                           "checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        for version, name, sql in migrations():
            if version >= 47:
                break
            await conn.execute(sql)
            await conn.execute("INSERT INTO fencepost_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                               version, name, hashlib.sha256(sql.encode()).hexdigest())
        # as 046's recorder stored them: event rows and attempt rows with no queue; one run archived, one gone
        t0 = datetime.now(UTC) - timedelta(minutes=5)
        live = await conn.fetchval(
            "INSERT INTO runs (handler, queue, status, payload, max_retries, timeout_s, attempt, token, version, "
            "started_at, finished_at) VALUES ('t.noop', 'tq', 'SUCCEEDED', '\\x90', 3, 60, 1, 7, 3, $1, $1) "
            "RETURNING id", t0)
        await conn.execute(
            "INSERT INTO runs_archive (id, handler, queue, status, priority, payload, run_at, attempt, max_retries, "
            "timeout_s, version, gen, created_at, updated_at, finished_at, pause_requested, stop_requested, "
            "cancel_requested, forced, needs_compensation, outbox, tenant) VALUES (900001, 't.noop', 'qa', "
            "'SUCCEEDED', 0, '\\x90', $1, 1, 3, 60, 2, 0, $1, $1, $1, false, false, false, false, false, false, '')",
            t0)
        await conn.execute(
            "INSERT INTO events (run_id, type, from_status, to_status, version, actor, reason, at) VALUES "
            "($1, 'paused', 'PENDING', 'PAUSED', 1, 'token:1@x', 'hold', $2), "
            "(900001, 'cancelled', 'PENDING', 'CANCELLED', 1, 'token:1@x', NULL, $2), "
            "(900002, 'drift_repaired', 'PENDING', 'FAILED', 1, 'reconciler', 'lost', $2)", live, t0)
        await conn.execute(
            "INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome, claim_version, "
            "claim_stream_id, finish_type, finish_from, finish_to, finish_version, finish_stream_id) VALUES "
            "($1, 1, 7, 'w', $2, $2, 'succeeded', 2, 101, 'succeeded', 'RUNNING', 'SUCCEEDED', 3, 102)", live, t0)
        assert (await upgrade(conn))[0].startswith("047_"), "047 applied over the planted history"
        events = {r["run_id"]: r["queue"] for r in await conn.fetch("SELECT run_id, queue FROM events")}
        assert events == {live: "tq", 900001: "qa", 900002: None}, "a run's queue, from the archive if archived"
        assert await conn.fetchval("SELECT queue FROM attempts WHERE run_id = $1", live) == "tq"
        # and the events stay append-only
        try:
            await conn.execute("UPDATE events SET reason = 'x' WHERE run_id = $1", live)
            raise AssertionError("an event row was updated")
        except asyncpg.InsufficientPrivilegeError:
            pass
        # the queue's history shows the planted rows: the paused event, the claim and the finish
        page = await conn.fetch(query("fleet_events_page"), t0 - timedelta(minutes=1), None, "tq", 10, None,
                                None, None, None, None)
        assert sorted(r["type"] for r in page) == ["claimed", "paused", "succeeded"], [tuple(r) for r in page]
        assert {r["queue"] for r in page} == {"tq"}
        audit = await conn.fetch(query("audit_list"), None, "qa", None, None, 10, None, None)
        assert [(r["source"], r["action"], r["target"]) for r in audit] == [("run", "cancelled", "900001")]
    finally:
        await conn.close()
