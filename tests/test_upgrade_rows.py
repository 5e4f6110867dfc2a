"""Rows an older version stored, the real upgrade way (issue 22 item 8): a database migrated to
009 (before 010 bounded timeouts, retries and intervals), rows written there as that version's
client and trigger wrote them, then `fencepost db upgrade` to the end (010 adds its bounds NOT
VALID, PostgreSQL leaves the rows in place), then the services on it: the trigger fires the other
schedules, the rebuild of a forgotten queue stamps it and quarantines what Redis cannot hold, the
recorder records a run whose value PostgreSQL now refuses, and `fencepost cancel` cancels."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from fencepost.client import Client
from fencepost.core import record
from fencepost.core.config import Settings
from fencepost.core.models import encode_payload
from fencepost.core.stores import Stores
from fencepost.reconciler.rebuild import ensure_stamped, untrusted_queues
from fencepost.testing import Harness
from fencepost.trigger import ManualClock, Trigger
from tests.apps import registry
from tests.conftest import ADMIN_URL, REDIS_URL, ROOT, _db_url, worker_env

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
async def upgraded(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Settings, dict[str, int]]]:
    """A database made by a version before 010, with what that version could store, upgraded."""
    name = f"fp_upg_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = _db_url(name)
    conn = await asyncpg.connect(url)
    try:
        every = record.migrations()
        monkeypatch.setattr(record, "migrations", lambda: [m for m in every if m[0] <= 9])
        await record.upgrade(conn)
        monkeypatch.undo()
        assert not await conn.fetchval("SELECT count(*) FROM pg_constraint WHERE conname LIKE '%bounded'")
        empty = encode_payload((), {})
        await conn.execute("INSERT INTO queues (name) VALUES ('tq')")
        ids: dict[str, int] = {}
        for key, timeout_s, max_retries in (("ok", 60.0, 3), ("ok2", 60.0, 3), ("inf", float("inf"), 3),
                                            ("inf_cancel", float("inf"), 3), ("retries", 60.0, 2147483647)):
            ids[key] = await conn.fetchval(
                "INSERT INTO runs (handler, queue, status, payload, max_retries, timeout_s, run_at) "
                "VALUES ('t.noop', 'tq', 'PENDING', $1, $2, $3, now()) RETURNING id", empty, max_retries, timeout_s)
        for sname, interval_s in (("good", 60.0), ("tiny", 1e-9)):
            await conn.execute(
                "INSERT INTO schedules (name, handler, payload, interval_s, next_fire_time, due_at, allow_overlap) "
                "VALUES ($1, 't.noop', $2, $3, $4, $4, true)", sname, empty, interval_s, T0)
        applied = await record.upgrade(conn)  # what `fencepost db upgrade` does
        assert "010_isolation" in applied and "017_quarantine_any_row" in applied
        assert await conn.fetchval("SELECT timeout_s FROM runs WHERE id = $1", ids["inf"]) == float("inf"), \
            "the upgrade leaves the rows as they were stored"
    finally:
        await conn.close()
    yield Settings(redis_url=REDIS_URL, database_url=url, prefix=f"fpt{uuid.uuid4().hex[:10]}",
                   backoff_base_ms=50, backoff_cap_ms=1000), ids
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


async def test_rows_stored_before_the_bounds_stop_no_service_after_the_upgrade(
        upgraded: tuple[Settings, dict[str, int]]) -> None:
    settings, ids = upgraded
    stores = await Stores(settings).connect()
    client = await Client(settings=settings).connect()
    try:
        await client.register(registry)
        # the trigger: the tiny interval is quarantined, the good schedule fires, tick after tick
        clock = ManualClock(T0 + timedelta(minutes=5))
        trig = Trigger(stores, clock=clock, use_lease=False)
        for _ in range(2):
            assert (await trig.tick()).created == 1
            clock.advance(60)
        assert trig.quarantined == ["tiny"]

        # this Redis prefix has nothing of the queue: the rebuild stamps it, quarantining what Redis cannot hold
        code = subprocess.run([sys.executable, "-m", "fencepost.cli", "cancel", str(ids["inf_cancel"]), "--reason",
                               "stored by 0.9"], cwd=ROOT, env=worker_env(settings), capture_output=True, text=True,
                              timeout=60)
        assert code.returncode == 0 and "Traceback" not in code.stderr, code.stdout + code.stderr
        assert (await client.get(ids["inf_cancel"]))["status"] == "CANCELLED"
        assert "tq" in await untrusted_queues(stores)
        assert "tq" in await ensure_stamped(stores)
        assert "tq" not in await untrusted_queues(stores)
        inf = await client.get(ids["inf"])
        assert (inf["status"], inf["reason"]) == ("CANCELLED", "quarantined"), inf

        # the others run, the one with 2147483647 retries is recorded (not poisoned), and new submits run
        fresh = await client.submit("t.noop")
        await Harness(settings, registry, client).drain(timeout=30)
        for rid in (ids["ok"], ids["ok2"], ids["retries"], fresh):
            row = await client.get(rid)
            assert row["status"] == "SUCCEEDED", row
        assert await stores.redis.xlen(f"{settings.prefix}:recorder:poison") == 0
        check = subprocess.run([sys.executable, "-m", "fencepost.cli", "reconcile", "--check", "--grace", "0"],
                               cwd=ROOT, env=worker_env(settings), capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        await client.close()
        await stores.close()
