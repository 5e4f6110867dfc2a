"""Real PostgreSQL and Redis for every test: one migrated template database per session,
a fresh clone of it per test, and a fresh Redis key prefix per test.

Which servers (decided once, in pytest_configure; the header line of the run says which):
FENCEPOST_TEST_REDIS_URL / FENCEPOST_TEST_DATABASE_URL when set; else Redis at 127.0.0.1:6379 and
PostgreSQL at 127.0.0.1:5432 when they answer; else embedded ones (fencepost.dev.embedded), started for
the session in a temporary folder and removed after it. FENCEPOST_TEST_SERVERS=embedded skips the
probe of the defaults (as if nothing answered there: how .ci/run proves the bare-machine path);
FENCEPOST_TEST_SERVERS=external never starts embedded servers.

Tests that drive a Debian tool (promtool, chromium, docker-compose) call `need_tool(name)`: when the
tool is missing they are skipped and the run ends with one line naming the tools and how to get them;
FENCEPOST_TEST_REQUIRE_TOOLS=1 (set by .ci/run) makes a missing tool a failure instead."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.record import upgrade
from fencepost.core.registry import Registry
from fencepost.core.stores import Stores
from fencepost.dev.embedded import EmbeddedServers
from tests.servers import TOOLS, TestServers, choose_servers

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("FENCEPOST_TEST_CLOCK", "1")  # scripts may read a test's clock (fencepost.core.hot.TEST_CLOCK_ENV)
REDIS_URL = os.environ.get("FENCEPOST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ADMIN_URL = os.environ.get("FENCEPOST_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
"""Both replaced in pytest_configure by the servers chosen for the session (see the module docstring)."""
RUN_ID = uuid.uuid4().hex[:8]
REQUIRE_TOOLS_ENV = "FENCEPOST_TEST_REQUIRE_TOOLS"
_SESSION: dict[str, Any] = {}
_MISSING_TOOLS: dict[str, int] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Choose the session's servers, starting embedded ones when nothing else is there."""
    global REDIS_URL, ADMIN_URL
    if hasattr(config, "workerinput") or "servers" in _SESSION:
        return
    chosen = choose_servers(os.environ)
    embedded = None
    if chosen.redis_url is None or chosen.database_url is None:
        base = Path(os.environ.get("FENCEPOST_TEST_EMBEDDED_DIR") or _mkdtemp()) / ".fencepost"
        embedded = EmbeddedServers(base)
        if chosen.redis_url is None:
            chosen.redis_url = embedded._start_redis()
        if chosen.database_url is None:
            chosen.database_url = embedded._start_postgres()
    REDIS_URL, ADMIN_URL = chosen.redis_url, chosen.database_url
    # subprocesses (workers, nested pytest runs) see the same servers
    os.environ["FENCEPOST_TEST_REDIS_URL"], os.environ["FENCEPOST_TEST_DATABASE_URL"] = REDIS_URL, ADMIN_URL
    _SESSION["servers"], _SESSION["embedded"] = chosen, embedded


def _mkdtemp() -> str:
    return tempfile.mkdtemp(prefix="fencepost-test-servers-")


def pytest_unconfigure(config: pytest.Config) -> None:
    embedded: EmbeddedServers | None = _SESSION.pop("embedded", None)
    if embedded is not None:
        embedded.stop()
        if not os.environ.get("FENCEPOST_TEST_EMBEDDED_DIR"):
            for path in embedded.data_dirs():
                shutil.rmtree(path.parent if path == embedded.base_dir else path, ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> list[str]:
    chosen: TestServers | None = _SESSION.get("servers")
    return [chosen.describe()] if chosen is not None else []


def need_tool(name: str) -> str:
    """The path of the Debian tool NAME; when missing, skip the test (fail it under
    FENCEPOST_TEST_REQUIRE_TOOLS=1) with how to get it."""
    path = shutil.which(name)
    if path is not None:
        return path
    name = Path(name).name
    hint = f"{name} is not installed; {TOOLS.get(name, 'install it')}"
    if os.environ.get(REQUIRE_TOOLS_ENV) == "1":
        pytest.fail(f"{hint} ({REQUIRE_TOOLS_ENV}=1 requires it)", pytrace=False)
    _MISSING_TOOLS[name] = _MISSING_TOOLS.get(name, 0) + 1
    pytest.skip(hint)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _MISSING_TOOLS:
        tools = "; ".join(f"{name} ({n} test{'s' if n > 1 else ''}): {TOOLS.get(name, 'install it')}"
                          for name, n in _MISSING_TOOLS.items())
        terminalreporter.write_line(f"skipped for missing tools, {tools} ({REQUIRE_TOOLS_ENV}=1 fails them instead)",
                                    yellow=True)


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


@pytest.fixture
def client_registry() -> Registry:
    """The registry the `client` fixture registers: tests.apps's; a module overrides this fixture for its own."""
    from tests.apps import registry

    return registry


@pytest_asyncio.fixture
async def client(settings: Settings, client_registry: Registry) -> AsyncIterator[Client]:
    c = await Client(settings=settings).connect()
    await c.register(client_registry)
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


def stop(procs: Iterable[subprocess.Popen[bytes] | None], timeout: float = 20) -> None:
    """SIGTERM every process still running (None: never started), then wait for each; SIGKILL one that
    outlasts `timeout`."""
    started = [p for p in procs if p is not None]
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in started:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()


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
