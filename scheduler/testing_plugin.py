"""The pytest plugin of fencepost.testing, loaded by pytest through the `pytest11` entry point once
fencepost is installed (nothing to add to a conftest.py; `-p no:fencepost` turns it off).

Loading it starts nothing: the fixtures reach the stores (or start embedded servers) only when a test
requests them. `fencepost_urls` (session) is the stores, found as every entry point finds them
(fencepost.core.stores.resolve): FENCEPOST_REDIS_URL / FENCEPOST_DATABASE_URL, else the project
directory's embedded pair (the `embedded` extra); `fencepost_registry` is yours to
override, and `fencepost_app` (the registry's "module:attribute", found by itself when None) too;
`fencepost` is a Harness (`.client`, `.drain()`, `.clock`, `.status()`) on a fresh Redis key
prefix; with FENCEPOST_REDIS_URL=fakeredis:// no Redis server is needed (fencepost.testing.use_fakeredis).
The async fixture needs pytest-asyncio (the `test` extra); without it the plugin still loads and the
fixture says what to install.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core import embedded
from fencepost.core.config import Settings
from fencepost.core.hotreads import unlink_prefix
from fencepost.core.record import Database
from fencepost.core.redisconn import connect
from fencepost.core.registry import Registry
from fencepost.core.stores import resolve
from fencepost.testing import Harness, use_fakeredis

try:
    from pytest_asyncio import fixture as _async_fixture
except ImportError:  # every pytest run of a project with fencepost installed loads this plugin
    _async_fixture = None  # type: ignore[assignment]

__all__ = ["fencepost", "fencepost_app", "fencepost_registry", "fencepost_urls"]


@pytest.fixture(scope="session")
def fencepost_urls() -> Iterator[tuple[str, str]]:
    """(redis_url, database_url) for the session, by the rule every entry point uses
    (fencepost.core.stores.resolve): FENCEPOST_REDIS_URL / FENCEPOST_DATABASE_URL (point the database
    at one for tests: it is migrated once, and runs of earlier tests stay in it), else the embedded pair
    of the project directory (FENCEPOST_EMBEDDED_DIR, default ./.fencepost; the `embedded` extra), found
    running or started now, and then stopped after the session. Override the fixture to choose otherwise."""
    settings = Settings.from_env()
    if settings.redis_url.startswith("fakeredis://"):
        use_fakeredis()  # no Redis server: fakeredis in this process (its Lua runs the scripts)
    resolved = resolve(settings)
    try:
        asyncio.run(_migrate(resolved.settings.database_url))
        yield resolved.settings.redis_url, resolved.settings.database_url
    finally:
        if resolved.started and resolved.embedded_dir is not None:
            embedded.down(resolved.embedded_dir)  # started for this session: stopped with it (its data stays)


async def _migrate(database_url: str) -> None:
    db = await Database(database_url).connect()
    try:
        await db.upgrade()
    finally:
        await db.close()


@pytest.fixture
def fencepost_registry() -> Registry:
    """Override in your conftest.py to return your application's Registry."""
    raise pytest.UsageError("define a `fencepost_registry` fixture returning your Registry to use the "
                            "fencepost fixture")


@pytest.fixture
def fencepost_app() -> str | None:
    """The registry's "module:attribute", which drain() spawns a child process from for `model="process"`
    handlers (as `fencepost worker --app`). None: the loaded module holding the registry, found by itself;
    override in conftest.py when it is not found (the run's error says so)."""
    return None


async def _harness(urls: tuple[str, str], registry: Registry, app: str | None = None) -> AsyncIterator[Harness]:
    redis_url, database_url = urls
    prefix = f"fpt{uuid.uuid4().hex[:10]}"
    settings = Settings(redis_url=redis_url, database_url=database_url, prefix=prefix, backoff_base_ms=50,
                        backoff_cap_ms=1000)
    client = await Client(settings=settings).connect()
    try:
        await client.register(registry)
        harness = Harness(settings, registry, client, app=app)
        await harness.stamp()
        yield harness
    finally:
        await client.close()
        r = connect(redis_url)
        await unlink_prefix(r, prefix)
        await r.aclose()


def _fencepost_fixture() -> Any:
    """The `fencepost` fixture; without pytest-asyncio a plain one that says what is missing."""
    if _async_fixture is None:
        @pytest.fixture(name="fencepost")
        def unavailable(fencepost_registry: Registry) -> Any:
            raise pytest.UsageError("the fencepost fixture needs pytest-asyncio: pip install 'fencepost[test]'")

        return unavailable

    @_async_fixture(name="fencepost")
    async def harness(fencepost_urls: tuple[str, str], fencepost_registry: Registry,
                      fencepost_app: str | None) -> AsyncIterator[Harness]:
        """A Harness with a registered client; each test gets its own Redis key prefix (its keys are removed
        after it), and shares the session's PostgreSQL database."""
        async for h in _harness(fencepost_urls, fencepost_registry, fencepost_app):
            yield h

    return harness


fencepost = _fencepost_fixture()
