"""Real PostgreSQL and Redis for every test: one migrated template database per session,
a fresh clone of it per test, and a fresh Redis key prefix per test."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest_asyncio
import redis.asyncio as aioredis

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.record import upgrade
from fencepost.core.stores import Stores

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("FENCEPOST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ADMIN_URL = os.environ.get("FENCEPOST_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
RUN_ID = uuid.uuid4().hex[:8]


def _db_url(name: str) -> str:
    base, _, _ = ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


@pytest_asyncio.fixture(scope="session")
async def template_db() -> AsyncIterator[str]:
    name = f"fp_tmpl_{RUN_ID}"
    admin = await asyncpg.connect(ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    conn = await asyncpg.connect(_db_url(name))
    await upgrade(conn)
    await conn.close()
    yield name
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


@pytest_asyncio.fixture
async def database_url(template_db: str) -> AsyncIterator[str]:
    name = f"fp_t_{RUN_ID}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield _db_url(name)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


@pytest_asyncio.fixture
async def settings(database_url: str) -> AsyncIterator[Settings]:
    prefix = f"fpt{uuid.uuid4().hex[:10]}"
    yield Settings(redis_url=REDIS_URL, database_url=database_url, prefix=prefix, backoff_base_ms=50,
                   backoff_cap_ms=1000)
    r = aioredis.Redis.from_url(REDIS_URL)
    keys = [k async for k in r.scan_iter(match=f"{prefix}:*", count=1000)]
    for i in range(0, len(keys), 500):
        await r.unlink(*keys[i:i + 500])
    await r.aclose()


@pytest_asyncio.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    from tests.apps import registry

    c = await Client(settings=settings).connect()
    await c.register(registry)
    yield c
    await c.close()


@pytest_asyncio.fixture
async def stores(settings: Settings) -> AsyncIterator[Stores]:
    s = await Stores(settings).connect()
    yield s
    await s.close()


async def wait_until(predicate: Callable[[], Awaitable[Any]], timeout: float = 30.0, what: str = "condition",
                     interval: float = 0.02) -> Any:
    """Poll an async predicate until truthy; fail with a clear message after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {value!r})")
        await asyncio.sleep(interval)


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(FENCEPOST_REDIS_URL=settings.redis_url, FENCEPOST_DATABASE_URL=settings.database_url,
               FENCEPOST_PREFIX=settings.prefix, FENCEPOST_LOG_FORMAT="json",
               FENCEPOST_BACKOFF_BASE_MS=str(settings.backoff_base_ms),
               FENCEPOST_BACKOFF_CAP_MS=str(settings.backoff_cap_ms), PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


def spawn(settings: Settings, *args: str, log: Path | None = None, **env: str) -> subprocess.Popen[bytes]:
    """Start `fencepost <args>` as a real process (killable with SIGKILL)."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env=worker_env(settings, **env),
                            stdout=out, stderr=out)


async def record_all(stores: Stores, timeout: float = 30.0) -> None:
    """Run the recorder in this process until every queue stream is drained."""
    from fencepost.reconciler.recorder import Recorder

    rec = Recorder(stores, consumer="test")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await rec.run_once(block_ms=50) == 0 and await rec.run_once(block_ms=50) == 0:
            return
    raise AssertionError("recorder did not drain the streams in time")


def log_tail(path: Path | None, n: int = 30) -> str:
    if path is None or not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


async def run_state(stores: Stores, run_id: int, queue: str = "tq") -> str | None:
    """The run's state in Redis (the hot copy, ahead of PostgreSQL's projection)."""
    raw = await stores.redis.hget(stores.keys(queue).run(run_id), "state")
    return raw.decode() if raw else None


async def wait_state(stores: Stores, run_id: int, states: set[str], timeout: float = 30.0, what: str = "",
                     log: Path | None = None) -> str:
    """Wait until the run is in one of `states`; on timeout say where it is and show the log."""
    async def check() -> str | None:
        s = await run_state(stores, run_id)
        return s if s in states else None

    try:
        return await wait_until(check, timeout=timeout, what=what or f"run {run_id} to reach {sorted(states)}")
    except AssertionError as exc:
        h = await stores.redis.hgetall(stores.keys("tq").run(run_id))
        h.pop(b"payload", None)
        raise AssertionError(f"{exc}; run hash is {h}\n--- log ---\n{log_tail(log)}") from None
