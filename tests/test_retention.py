"""Partitioned history and retention (issue 8, PostgreSQL growth): monthly partitions of
events, attempts and runs_archive; `fencepost retention` drops exactly the partitions older
than --keep (archiving them first) and nothing else; finished runs leave the hot table for
runs_archive and are still found by id; the recorder stays idempotent on partitioned tables."""

from __future__ import annotations

import asyncio
import csv
import gzip
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest

from fencepost.client import Client, Submit
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput, UnknownRun
from fencepost.core.stores import Stores
from fencepost.reconciler.recorder import Recorder
from fencepost.reconciler.retention import (
    Maintenance,
    archive_runs,
    ensure_partitions,
    parse_archive_after,
    parse_duration,
)
from fencepost.reconciler.service import Reconciler
from fencepost.worker.runtime import Worker, WorkerOptions
from fencepost.workflows import Node
from tests.apps import registry
from tests.conftest import ROOT, record_all, worker_env

UTC = UTC
MONTHS = [date(2024, 1, 1), date(2024, 2, 1), date(2024, 3, 1), date(2024, 4, 1)]
TABLES = ("events", "attempts", "runs_archive")


def _part(table: str, month: date) -> str:
    return f"{table}_y{month.year}m{month.month:02d}"


def _at(month: date, day: int = 10) -> datetime:
    return datetime(month.year, month.month, day, 12, tzinfo=UTC)


async def _connect(settings: Settings) -> asyncpg.Connection:
    return await asyncpg.connect(settings.database_url)


async def _history(conn: asyncpg.Connection) -> dict[str, dict[str, set[Any]]]:
    """Four months of history with explicit times (finished runs archived the real way):
    per month, the keys of its rows per table."""
    await ensure_partitions(conn, MONTHS[0], len(MONTHS) - 1)
    out: dict[str, dict[str, set[Any]]] = {}
    for month in MONTHS:
        keys: dict[str, set[Any]] = {t: set() for t in TABLES}
        for i in range(3 + month.month):  # a different row count in each month
            at = _at(month, 1 + i)
            run_id = await conn.fetchval(
                "INSERT INTO runs (handler, queue, status, payload, attempt, max_retries, timeout_s, created_at, "
                "started_at, finished_at) VALUES ('t.echo', 'tq', 'SUCCEEDED', '\\x00', 1, 0, 1, $1, $1, $1) "
                "RETURNING id", at)
            keys["events"].add(await conn.fetchval(
                "INSERT INTO events (run_id, type, to_status, at) VALUES ($1, 'succeeded', 'SUCCEEDED', $2) "
                "RETURNING id", run_id, at))
            await conn.execute(
                "INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome) "
                "VALUES ($1, 1, 7, 'w', $2, $2, 'succeeded')", run_id, at)
            keys["attempts"].add((run_id, 1))
            keys["runs_archive"].add(run_id)
        out[month.isoformat()] = keys
    assert await archive_runs(conn, _at(MONTHS[-1], 28), 1000) == sum(len(k["runs_archive"]) for k in out.values())
    return out


async def _attached(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                            "WHERE i.inhparent IN ('events'::regclass, 'attempts'::regclass, 'runs_archive'::regclass) "
                            "AND c.relkind = 'r'")
    return {r["relname"] for r in rows}


async def _exists(conn: asyncpg.Connection, name: str) -> bool:
    return await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", name)


async def _counts(conn: asyncpg.Connection) -> dict[str, int]:
    return {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES}


async def fencepost(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess (its commands run their own event loop)."""
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT,
                                   env=worker_env(settings), capture_output=True, text=True, timeout=120)


def _read_archive(path: Path) -> list[dict[str, str]]:
    with gzip.open(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


# -- retention -----------------------------------------------------------------------------------
async def test_retention_drops_exactly_the_partitions_older_than_keep_and_archives_their_rows(
        settings: Settings, tmp_path: Path) -> None:
    conn = await _connect(settings)
    try:
        history = await _history(conn)
        before = await _counts(conn)
        archive = tmp_path / "archive"
        # now 2024-05-01, keep 60 days: the cutoff is 2024-03-02, so January and February (ending
        # 2024-02-01 and 2024-03-01) go; March ends 2024-04-01, after the cutoff, and stays.
        out = await fencepost(settings, "retention", "--keep", "60d", "--now", "2024-05-01T00:00:00+00:00",
                              "--archive-dir", str(archive))
        assert out.returncode == 0, out.stderr
        old, kept = MONTHS[:2], MONTHS[2:]
        dropped = {_part(t, m) for t in TABLES for m in old}
        assert not any([await _exists(conn, p) for p in dropped]), "the old partitions are gone"
        attached = await _attached(conn)
        assert {_part(t, m) for t in TABLES for m in kept} <= attached and not dropped & attached
        assert {t + "_default" for t in TABLES} <= attached, "DEFAULT partitions are never dropped"

        lines = out.stdout.splitlines()
        assert len(lines) == len(dropped), out.stdout
        for t in TABLES:
            for m in old:
                n = len(history[m.isoformat()][t])
                path = archive / f"{_part(t, m)}.csv.gz"
                assert f"dropped {_part(t, m)}: {n} rows, archived to {path}" in lines
                rows = _read_archive(path)
                got = ({int(r["id"]) for r in rows} if t == "events" else
                       {(int(r["run_id"]), int(r["attempt"])) for r in rows} if t == "attempts" else
                       {int(r["id"]) for r in rows})
                assert got == history[m.isoformat()][t] and len(rows) == n, f"{path} holds exactly the dropped rows"
        assert sorted(p.name for p in archive.iterdir()) == sorted(f"{p}.csv.gz" for p in dropped)

        after = await _counts(conn)
        for t in TABLES:
            gone = sum(len(history[m.isoformat()][t]) for m in old)
            assert after[t] == before[t] - gone, f"{t}: only the dropped months' rows left"
            for m in kept:
                assert await conn.fetchval(f"SELECT count(*) FROM {_part(t, m)}") == len(history[m.isoformat()][t])

        again = await fencepost(settings, "retention", "--keep", "60d", "--now", "2024-05-01T00:00:00+00:00")
        assert again.returncode == 0 and again.stdout.startswith("nothing to drop"), again.stdout + again.stderr
    finally:
        await conn.close()


async def test_dry_run_prints_the_plan_and_changes_nothing(settings: Settings, tmp_path: Path) -> None:
    conn = await _connect(settings)
    try:
        history = await _history(conn)
        parts, counts = await _attached(conn), await _counts(conn)
        out = await fencepost(settings, "retention", "--keep", "60d", "--now", "2024-05-01T00:00:00+00:00",
                              "--archive-dir", str(tmp_path / "a"), "--dry-run")
        assert out.returncode == 0, out.stderr
        expected = {f"would drop {_part(t, m)}: {len(history[m.isoformat()][t])} rows before "
                    f"{datetime(m.year, m.month + 1, 1, tzinfo=UTC).isoformat()} -> "
                    f"{tmp_path / 'a' / _part(t, m)}.csv.gz" for t in TABLES for m in MONTHS[:2]}
        assert set(out.stdout.splitlines()) == expected
        assert await _attached(conn) == parts and await _counts(conn) == counts
        assert not (tmp_path / "a").exists(), "a dry run writes no archive"
    finally:
        await conn.close()


@pytest.mark.parametrize("keep", ["abc", "0d", "-5d", "30", "30y", ""])
async def test_bad_keep_is_refused_with_a_clear_error_and_changes_nothing(settings: Settings, keep: str) -> None:
    conn = await _connect(settings)
    try:
        await _history(conn)
        parts, counts = await _attached(conn), await _counts(conn)
        out = await fencepost(settings, "retention", "--keep", keep, "--now", "2024-05-01T00:00:00+00:00")
        assert out.returncode == 1
        assert out.stderr.startswith("error: --keep must be a positive duration such as 30d, 12h, 90m or 2w"), \
            out.stderr
        assert "Traceback" not in out.stderr
        assert await _attached(conn) == parts and await _counts(conn) == counts
    finally:
        await conn.close()


async def test_an_existing_archive_file_is_never_overwritten_and_nothing_is_dropped(
        settings: Settings, tmp_path: Path) -> None:
    conn = await _connect(settings)
    try:
        await _history(conn)
        parts = await _attached(conn)
        (tmp_path / f"{_part('attempts', MONTHS[1])}.csv.gz").write_bytes(b"earlier archive")
        out = await fencepost(settings, "retention", "--keep", "60d", "--now", "2024-05-01T00:00:00+00:00",
                              "--archive-dir", str(tmp_path))
        assert out.returncode == 1 and "already exists" in out.stderr, out.stderr
        assert await _attached(conn) == parts
        assert (tmp_path / f"{_part('attempts', MONTHS[1])}.csv.gz").read_bytes() == b"earlier archive"
    finally:
        await conn.close()


def test_durations() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("90m") == timedelta(minutes=90)
    assert parse_duration("2w") == timedelta(weeks=2)
    for bad in ("abc", "0d", "-1d", "1.5d", "d"):
        with pytest.raises(InvalidInput) as exc:
            parse_duration(bad)
        assert exc.value.field == "keep"
    assert parse_archive_after("") is None and parse_archive_after("0") is None
    assert parse_archive_after("7d") == timedelta(days=7)
    with pytest.raises(InvalidInput, match="FENCEPOST_ARCHIVE_AFTER"):
        parse_archive_after("soon")


# -- partitions ----------------------------------------------------------------------------------
async def test_rows_in_the_default_partition_move_into_a_month_created_later(settings: Settings) -> None:
    conn = await _connect(settings)
    try:
        june, august = _at(date(2024, 6, 1)), _at(date(2024, 8, 1))
        ids = [await conn.fetchval("INSERT INTO events (run_id, type, at) VALUES ($1, 'x', $2) RETURNING id", i, at)
               for i, at in ((1, june), (2, june), (3, august))]
        await conn.execute("INSERT INTO attempts (run_id, attempt, token, worker_id, started_at) "
                           "VALUES (1, 1, 1, 'w', $1), (3, 1, 1, 'w', $2)", june, august)
        where = "SELECT tableoid::regclass::text FROM events WHERE id = $1"
        assert {await conn.fetchval(where, i) for i in ids} == {"events_default"}, "no June partition yet"

        created = await ensure_partitions(conn, date(2024, 6, 1), 0)
        assert created == ["events_y2024m06", "attempts_y2024m06", "runs_archive_y2024m06"]
        assert [await conn.fetchval(where, i) for i in ids] == ["events_y2024m06", "events_y2024m06", "events_default"]
        att = await conn.fetch("SELECT run_id, tableoid::regclass::text AS part FROM attempts ORDER BY run_id")
        assert [(r["run_id"], r["part"]) for r in att] == [(1, "attempts_y2024m06"), (3, "attempts_default")]
        assert await conn.fetchval("SELECT count(*) FROM events") == 3, "nothing lost or doubled"
        assert await ensure_partitions(conn, date(2024, 6, 1), 0) == [], "idempotent"
        for part in ("events_y2024m06", "events_default"):  # the new partitions refuse DELETE too
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
                await conn.execute(f"DELETE FROM {part}")
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
            await conn.execute("UPDATE events SET type = 'y'")
        # a later id never collides: the identity sequence carries on
        nxt = await conn.fetchval("INSERT INTO events (run_id, type, at) VALUES (4, 'x', now()) RETURNING id")
        assert nxt > max(ids)
    finally:
        await conn.close()


async def test_runs_archive_has_the_columns_of_runs_in_the_same_order(settings: Settings) -> None:
    """The archive move is INSERT .. SELECT *: a migration adding a column to runs must add it here too."""
    conn = await _connect(settings)
    try:
        cols = "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 " \
               "AND NOT attisdropped ORDER BY attnum"
        assert [tuple(r) for r in await conn.fetch(cols, "runs")] == \
               [tuple(r) for r in await conn.fetch(cols, "runs_archive")]
    finally:
        await conn.close()


# -- the hot table stays small -------------------------------------------------------------------
async def _finish(client: Client, settings: Settings, stores: Stores, n: int) -> list[int]:
    ids = await client.submit_many([Submit(handler="t.echo", args=(i,)) for i in range(n)])
    await Worker(registry, WorkerOptions(queues=["tq"], concurrency=10, burst=True), settings=settings).run()
    await record_all(stores)
    return ids


async def test_archiving_moves_only_old_terminal_runs_and_they_are_still_found_by_id(
        client: Client, settings: Settings, stores: Stores) -> None:
    wf = await client.submit_workflow([Node(name="only", handler="t.echo", args=(1,))])
    old = await _finish(client, settings, stores, 3)
    recent, late = await _finish(client, settings, stores, 2)
    pending = await client.submit("t.echo", 9, delay=3600)  # active, and old (after the bursts: it is not due)
    pool = stores.db.pool
    assert pool is not None
    wf_run = await pool.fetchval("SELECT id FROM runs WHERE workflow_id = $1", wf)
    assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", wf_run) == "SUCCEEDED"
    ten_days_ago = datetime.now(UTC) - timedelta(days=10)
    await pool.execute("UPDATE runs SET finished_at = $2 WHERE id = ANY($1)", [*old, wf_run], ten_days_ago)
    await pool.execute("UPDATE runs SET created_at = $2 WHERE id = $1", pending, ten_days_ago)
    await pool.execute("INSERT INTO checkpoints (run_id, attempt) VALUES ($1, 1)", old[0])
    history = {rid: (await client.events(rid), await client.attempts(rid)) for rid in old}
    hot_rows = {rid: dict(await pool.fetchrow("SELECT * FROM runs WHERE id = $1", rid)) for rid in old}

    keeper = Maintenance(stores.db, archive_after=timedelta(days=7), batch=2)
    await keeper.tick()
    assert keeper.archived == 2, "one batch per tick"
    await keeper.tick()
    assert keeper.archived == 3, "a full batch means a backlog: the next tick goes on"
    await pool.execute("UPDATE runs SET finished_at = $2 WHERE id = $1", late, ten_days_ago)
    await keeper.tick()
    assert keeper.archived == 3, "after a short batch the next pass waits an hour"

    hot = {r["id"] for r in await pool.fetch("SELECT id FROM runs")}
    assert hot == {recent, pending, wf_run, late}, "active, recent and workflow runs stay hot"
    archived = await pool.fetch("SELECT * FROM runs_archive ORDER BY id")
    assert [dict(r) for r in archived] == [hot_rows[rid] for rid in sorted(old)], "moved unchanged"
    assert await pool.fetchval("SELECT count(*) FROM checkpoints WHERE run_id = ANY($1)", old) == 0

    for rid in old:  # lookups fall back to the archive; history is where it was
        run = await client.get(rid)
        assert run["status"] == "SUCCEEDED" and run["id"] == rid
        assert (await client.events(rid), await client.attempts(rid)) == history[rid]
        assert (await client.wait(rid, timeout=5)).status == "SUCCEEDED"
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "fencepost.cli", "status", str(old[0])],
                                  cwd=ROOT, env=worker_env(settings), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"id                {old[0]}" in out.stdout and "SUCCEEDED" in out.stdout, out

    for command in (client.retry, client.resume, client.restart, client.cancel):  # archived runs are history
        with pytest.raises(UnknownRun):
            await command(old[1])
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE id = $1", old[1]) == 0, "not put back"


async def test_reconciler_step_creates_partitions_and_archives_and_zero_disables(settings: Settings,
                                                                                client: Client, stores: Stores) -> None:
    old = await _finish(client, settings, stores, 2)
    assert stores.db.pool is not None
    await stores.db.pool.execute("UPDATE runs SET finished_at = now() - interval '8 days' WHERE id = ANY($1)", old)
    await stores.db.pool.execute("DROP TABLE IF EXISTS " + _part("events", _month_after(datetime.now(UTC), 2)))

    off = Reconciler(msgspec.structs.replace(settings, archive_after="0"))
    assert off.history.archive_after is None
    rec = Reconciler(settings)  # default FENCEPOST_ARCHIVE_AFTER: 7 days
    await rec.stores.connect()
    try:
        await rec.maintain_once()
    finally:
        await rec.stores.close()
    assert await stores.db.pool.fetchval("SELECT count(*) FROM runs_archive WHERE id = ANY($1)", old) == 2
    assert await stores.db.pool.fetchval("SELECT to_regclass($1) IS NOT NULL",
                                         _part("events", _month_after(datetime.now(UTC), 2))), "recreated ahead"


def _month_after(at: datetime, n: int) -> date:
    m = at.year * 12 + at.month - 1 + n
    return date(m // 12, m % 12 + 1, 1)


# -- the recorder on partitioned tables ----------------------------------------------------------
def _entry(ms: int, seq: int, **fields: Any) -> tuple[bytes, dict[bytes, bytes]]:
    return f"{ms}-{seq}".encode(), {k.encode(): str(v).encode() for k, v in fields.items()}


async def test_recorder_redelivery_is_a_no_op_and_a_close_finds_its_attempt_in_any_order(
        client: Client, stores: Stores) -> None:
    a, b = await client.submit("t.echo", 1), await client.submit("t.echo", 2)
    stream = stores.keys("tq").events
    t0 = int(time.time() * 1000) - 5000
    lease = t0 + 30_000

    def claimed(rid: int, ms: int, seq: int) -> tuple[bytes, dict[bytes, bytes]]:
        return _entry(ms, seq, run=rid, type="claimed", **{"from": "PENDING"}, to="RUNNING", v=1, ts=ms,
                      attempt=1, token=11, worker="w1", lease=lease)

    def succeeded(rid: int, ms: int, seq: int) -> tuple[bytes, dict[bytes, bytes]]:
        return _entry(ms, seq, run=rid, type="succeeded", **{"from": "RUNNING"}, to="SUCCEEDED", v=2, ts=ms,
                      attempt=1, token=11, worker="w1")

    rec = Recorder(stores, consumer="test")
    a_claim, a_done = claimed(a, t0, 0), succeeded(a, t0 + 1500, 0)
    b_claim, b_done = claimed(b, t0 + 10, 0), succeeded(b, t0 + 2000, 0)
    await rec.record([(stream, *a_claim)])
    await rec.record([(stream, *a_done)])          # closes an attempt recorded by an earlier batch
    await rec.record([(stream, *b_done)])          # a close recorded before its claim (another recorder)
    await rec.record([(stream, *b_claim)])

    async def snapshot() -> tuple[Any, ...]:
        pool = stores.db.pool
        assert pool is not None
        ev = await pool.fetch("SELECT id, run_id, type, at FROM history WHERE stream_id IS NOT NULL ORDER BY id")
        att = await pool.fetch("SELECT * FROM attempts ORDER BY run_id")
        runs = await pool.fetch("SELECT id, status, version, started_at, finished_at FROM runs ORDER BY id")
        return [tuple(r) for r in ev], [tuple(r) for r in att], [tuple(r) for r in runs]

    first = await snapshot()
    events, attempts, runs = first
    assert len(events) == 4
    ts = {a: (t0, t0 + 1500), b: (t0 + 10, t0 + 2000)}
    assert [(r[0], r[1], r[4], r[5], r[6]) for r in attempts] == [
        (rid, 1, datetime.fromtimestamp(ts[rid][0] / 1000, UTC), datetime.fromtimestamp(ts[rid][1] / 1000, UTC),
         "succeeded") for rid in (a, b)], "one attempt each, started at the claim, closed at the finish"
    assert [r[1] for r in runs] == ["SUCCEEDED", "SUCCEEDED"]

    # redelivery (a recorder killed after commit, before its ack): every entry again, in one batch and alone
    await rec.record([(stream, *e) for e in (a_claim, a_done, b_claim, b_done)])
    for e in (b_done, a_claim):
        await rec.record([(stream, *e)])
    assert await snapshot() == first, "a redelivered entry changes nothing"


# -- the dashboard's chart rollup (issue 17: queue_minutes was never pruned) -----------------------
async def _minutes(stores: Stores, queue: str, ages: list[timedelta], now: datetime) -> None:
    pool = stores.db.pool
    assert pool is not None
    zeros = [0] * 16
    await pool.executemany(
        "INSERT INTO queue_minutes (queue, minute, started, lag_hist, run_hist) "
        "VALUES ($1, date_trunc('minute', $2::timestamptz), 1, $3, $3)",
        [(queue, now - age, zeros) for age in ages])


async def test_chart_rollup_is_pruned_past_its_retention_in_bounded_batches(settings: Settings, stores: Stores) -> None:
    now = datetime.now(UTC)
    old = [timedelta(days=9, minutes=i) for i in range(5)] + [timedelta(days=30)]
    kept = [timedelta(days=7, hours=23), timedelta(days=1), timedelta(minutes=3)]
    await _minutes(stores, "tq", [*old, *kept], now)
    await _minutes(stores, "other", [timedelta(days=8, minutes=5), timedelta(days=2)], now)
    pool = stores.db.pool
    assert pool is not None

    keeper = Maintenance(stores.db, archive_after=None, batch=2, rollup_batch=3, clock=lambda: now)
    assert keeper.chart_retention == timedelta(days=8), "the default outlives the 7 d chart window"
    await keeper.tick()
    assert keeper.rollup_pruned == 3, "one bounded batch per tick, oldest first"
    assert await pool.fetchval("SELECT count(*) FROM queue_minutes WHERE minute < $1", now - timedelta(days=29)) == 0
    await keeper.tick()
    assert keeper.rollup_pruned == 6, "a full batch means a backlog: the next tick goes on"
    await keeper.tick()
    assert keeper.rollup_pruned == 7, "the last old minute"
    await _minutes(stores, "tq", [timedelta(days=10)], now)
    await keeper.tick()
    assert keeper.rollup_pruned == 7, "after a short batch the next pass waits an hour"
    left = {(r["queue"], now - r["minute"] < timedelta(days=8))
            for r in await pool.fetch("SELECT queue, minute FROM queue_minutes")}
    assert left == {("tq", True), ("other", True), ("tq", False)}
    assert await pool.fetchval("SELECT count(*) FROM queue_minutes WHERE minute > $1", now - timedelta(days=8)) == 4

    # the reconciler's own loop, with the setting from the environment: 8.5 days old stays under 9d
    await _minutes(stores, "tq", [timedelta(days=8, hours=12)], datetime.now(UTC))
    rec = Reconciler(msgspec.structs.replace(settings, chart_retention="9d"))
    assert "rollup" in rec.loops and rec.history.chart_retention == timedelta(days=9)
    await rec.stores.connect()
    try:
        await rec.loops["rollup"].once()
    finally:
        await rec.stores.close()
    assert await pool.fetchval("SELECT count(*) FROM queue_minutes WHERE minute < now() - interval '9 days'") == 0
    assert await pool.fetchval("SELECT count(*) FROM queue_minutes") == 5, "nothing younger than 9 days went"


@pytest.mark.parametrize("value", ["6d", "1h", "0", "", "8 days", "-8d", "8d\x1b"])
def test_chart_retention_is_validated(settings: Settings, value: str) -> None:
    with pytest.raises(InvalidInput) as err:
        Reconciler(msgspec.structs.replace(settings, chart_retention=value))
    assert err.value.field == "chart_retention" and "FENCEPOST_CHART_RETENTION" in str(err.value)


# -- issue 22 item 10: retention never removes history of a run that is not finished ----------------
async def test_retention_keeps_the_history_of_runs_not_finished_and_an_attempts_start(
        client: Client, stores: Stores, settings: Settings) -> None:
    """A run submitted in a month whose partition is dropped and still pending lost its `submitted`
    event; with --keep 12h across a month boundary a running job lost its claim and its attempt
    row, and its finish then made a new row with started_at = finished_at. History planted across
    the January and February partitions (the recorder writes at each stream entry's time)."""
    jan, feb = date(2024, 1, 1), date(2024, 2, 1)
    conn = await _connect(settings)
    try:
        await ensure_partitions(conn, jan, 1)
        pending, running = await client.submit("t.echo", 1), await client.submit("t.echo", 2)
        await conn.execute("INSERT INTO events (run_id, queue, type, to_status, at) "
                           "VALUES ($1, 'tq', 'submitted', 'PENDING', $2)", pending, _at(jan, 20))
        done = await conn.fetchval(  # a finished run of January: its history goes
            "INSERT INTO runs (handler, queue, status, payload, attempt, max_retries, timeout_s, created_at, "
            "started_at, finished_at) VALUES ('t.echo', 'tq', 'SUCCEEDED', '\\x00', 1, 0, 1, $1, $1, $1) "
            "RETURNING id", _at(jan, 5))
        await conn.execute("INSERT INTO events (run_id, type, to_status, at) VALUES ($1, 'succeeded', 'SUCCEEDED', $2)",
                           done, _at(jan, 5))
        await conn.execute("INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome) "
                           "VALUES ($1, 1, 7, 'w', $2, $2, 'succeeded')", done, _at(jan, 5))

        stream = stores.keys("tq").events
        start = datetime(2024, 1, 31, 23, 0, tzinfo=UTC)
        t0 = int(start.timestamp() * 1000)
        rec = Recorder(stores, consumer="test")
        await rec.record([(stream, *_entry(t0, 0, run=running, type="claimed", **{"from": "PENDING"}, to="RUNNING",
                                           v=1, ts=t0, attempt=1, token=11, worker="w1", lease=t0 + 3_600_000))])

        async def history(run_id: int) -> tuple[list[Any], list[Any]]:
            ev = await conn.fetch("SELECT id, type, at FROM events WHERE run_id = $1 ORDER BY id", run_id)
            att = await conn.fetch("SELECT attempt, started_at, finished_at, outcome FROM attempts WHERE run_id = $1",
                                   run_id)
            return [tuple(r) for r in ev], [tuple(r) for r in att]

        before = {rid: await history(rid) for rid in (pending, running)}
        assert any(e[1] == "submitted" and e[2] == _at(jan, 20) for e in before[pending][0])
        assert before[running][1] == [(1, start, None, None)], "the running attempt's row, started in January"

        # 2024-02-01 13:00, keep 12h: the cutoff is 01:00, after January's partitions end
        out = await fencepost(settings, "retention", "--keep", "12h", "--now", "2024-02-01T13:00:00+00:00")
        assert out.returncode == 0, out.stderr
        assert not await _exists(conn, _part("events", jan)) and not await _exists(conn, _part("attempts", jan))
        assert await _exists(conn, _part("events", feb)), "February ends after the cutoff"
        for rid in (pending, running):
            assert await history(rid) == before[rid], f"run {rid} is not finished: its history stays"
        assert "kept" in out.stdout and "rows of runs not finished" in out.stdout, out.stdout
        assert await history(done) == ([], []), "the finished run's January history is dropped"

        t1 = int(datetime(2024, 2, 1, 12, 30, tzinfo=UTC).timestamp() * 1000)
        await rec.record([(stream, *_entry(t1, 0, run=running, type="succeeded", **{"from": "RUNNING"},
                                           to="SUCCEEDED", v=2, ts=t1, attempt=1, token=11, worker="w1"))])
        _, attempts = await history(running)
        assert attempts == [(1, start, datetime.fromtimestamp(t1 / 1000, UTC), "succeeded")], \
            "the finish closes the kept row: its start is not rewritten"
    finally:
        await conn.close()
