"""Embedded Redis/PostgreSQL: they answer, stop cleanly, and the database survives a restart."""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
import redis

from fencepost.dev.embedded import EmbeddedServers, resolve_urls


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


async def _query(database_url: str, sql: str) -> object:
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


@pytest.fixture
def base_dir() -> Iterator[Path]:
    # Not tmp_path: under root the servers run as an unprivileged user, who cannot enter
    # pytest's 0700 /tmp/pytest-of-root; a world-traversable directory of our own works for both.
    root = Path(tempfile.mkdtemp(prefix="fencepost-embedded-"))
    root.chmod(0o755)
    try:
        yield root / ".fencepost"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_servers_answer_stop_and_keep_data(base_dir: Path) -> None:
    servers = EmbeddedServers(base_dir)
    try:
        redis_url, database_url = servers.start()
        assert redis_url.startswith("redis://127.0.0.1:")
        assert database_url.startswith("postgresql://") and database_url.endswith("/fencepost")

        client = redis.Redis.from_url(redis_url)
        try:
            assert client.ping() is True
        finally:
            client.close()
        assert asyncio.run(_query(database_url, "select 1")) == 1
        asyncio.run(_query(database_url, "create table kept (id int)"))
    finally:
        servers.stop()
    assert not _port_open(_port(redis_url))
    assert not _port_open(_port(database_url))

    # Second start reuses the initialised data dir instead of running initdb again.
    with EmbeddedServers(base_dir) as again:
        assert again.database_url is not None
        assert asyncio.run(_query(again.database_url, "select count(*) from kept")) == 0
        ports = (_port(again.redis_url or ""), _port(again.database_url))
    assert not any(_port_open(p) for p in ports)


def test_resolve_urls_prefers_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FENCEPOST_REDIS_URL", "redis://example:6379/0")
    monkeypatch.setenv("FENCEPOST_DATABASE_URL", "postgresql://u@example/db")
    assert resolve_urls(tmp_path / "unused") == ("redis://example:6379/0", "postgresql://u@example/db", None)
    assert not (tmp_path / "unused").exists()
