"""`fencepost db upgrade`: numbered files applied once, recorded, safe from replicas at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import asyncpg
import pytest

from fencepost.core.record import migrations, upgrade
from tests.conftest import ADMIN_URL, ROOT, _db_url


@pytest.fixture
async def empty_db():
    name = f"fp_mig_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    yield _db_url(name)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


async def test_concurrent_upgrades_apply_each_migration_once(empty_db: str) -> None:
    conns = [await asyncpg.connect(empty_db) for _ in range(4)]
    try:
        results = await asyncio.gather(*(upgrade(c) for c in conns))
    finally:
        for c in conns:
            await c.close()
    applied = [name for r in results for name in r]
    assert sorted(applied) == sorted(name for _, name, _ in migrations()), "each migration applied exactly once"
    conn = await asyncpg.connect(empty_db)
    try:
        rows = await conn.fetch("SELECT version, name FROM fencepost_migrations ORDER BY version")
        assert [r["version"] for r in rows] == [v for v, _, _ in migrations()]
        assert await upgrade(conn) == [], "a second upgrade is a no-op"
    finally:
        await conn.close()


def test_cli_upgrade_is_idempotent(empty_db: str) -> None:
    env = {"FENCEPOST_DATABASE_URL": empty_db, "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "fencepost.cli", "db", "upgrade"]
    first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and "applied" in first.stdout, first.stderr
    assert second.returncode == 0 and "up to date" in second.stdout


def test_unreachable_database_is_one_clear_line() -> None:
    env = {"FENCEPOST_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "fencepost.cli", "db", "upgrade"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.startswith("error: postgresql unreachable") and "Traceback" not in out.stderr
