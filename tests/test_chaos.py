"""`fencepost loadtest chaos` as CI runs it: a short seeded soak on private redis-servers (a
primary and a replica, so FLUSHALL and promotion are in the fault mix) and this test's
database, through the real CLI; every invariant must hold and the exit code must be 0."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from fencepost.core.config import Settings
from tests.conftest import ROOT, worker_env
from tests.servers import RedisServer

pytestmark = pytest.mark.slow


@pytest_asyncio.fixture
async def pair() -> AsyncIterator[tuple[RedisServer, RedisServer]]:
    primary = await RedisServer().start()
    replica = await RedisServer(replicaof=primary).start()
    yield primary, replica
    replica.cleanup()
    primary.cleanup()


async def test_short_seeded_soak_holds_every_invariant(settings: Settings, pair: tuple[RedisServer, RedisServer],
                                                       tmp_path) -> None:  # type: ignore[no-untyped-def]
    primary, replica = pair
    s = Settings(redis_url=primary.url, database_url=settings.database_url, prefix=settings.prefix)
    cmd = [sys.executable, "-m", "fencepost.cli", "loadtest", "chaos", "--duration", "25", "--seed", "7",
           "--rate", "15", "--replica-url", replica.url, "--allow-flushall", "--log-dir", str(tmp_path), "--json"]
    out = subprocess.run(cmd, cwd=ROOT, env=worker_env(s), capture_output=True, text=True, timeout=400)
    assert out.stdout.strip(), out.stderr[-3000:]
    rep = json.loads(out.stdout.strip().splitlines()[-1])
    assert rep["failed"] == [], (rep, out.stderr[-2000:])
    assert out.returncode == 0
    assert rep["acked"] > 100 and rep["lost"] == 0 and rep["untraced"] == 0 and rep["stale_accepted"] == 0
    assert sum(rep["faults"].values()) >= 5
    assert rep["recovery_s"], rep
