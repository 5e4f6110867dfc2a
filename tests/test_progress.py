"""ctx.progress(): cheap (coalesced: one statement per flush whatever the call count), fenced by
attempt, shown by `fencepost status`, the API run body and client.get."""

from __future__ import annotations

import asyncio
import json
import math
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from fencepost.api import ApiConfig, create_app
from fencepost.api.auth import create_token
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.registry import Registry
from fencepost.core.release import sweep_blocked
from fencepost.core.stores import Stores
from fencepost.worker.context import Context
from fencepost.worker.progress import RunServicesImpl
from tests.conftest import spawn, wait_until
from tests.test_cli import fp

registry = Registry()
N = 5000


@registry.job("p.count", queue="pq")
async def count(ctx: Context, release: str) -> int:
    """Reports progress N times, then waits (bounded) for the test to let it finish."""
    for i in range(N):
        ctx.progress(i + 1, total=N, message="copying")
    for _ in range(3000):
        if Path(release).exists():
            break
        await asyncio.sleep(0.02)
    return N


async def test_progress_calls_are_coalesced_into_one_write_per_flush(client: Client, stores: Stores) -> None:
    await client.register(registry)
    rid = await client.submit("p.count", "unused")
    services = RunServicesImpl(stores)
    ctx = Context(rid, 2, 7, "pq", "p.count")
    ctx._services = services
    for i in range(10_000):
        ctx.progress(i, total=10_000)
    assert await services.flush() == 1 and services.flushes == 1
    assert await services.flush() == 0 and services.flushes == 1, "nothing new: no write"
    got = (await client.get(rid))["progress"]
    assert (got["done"], got["total"], got["attempt"]) == (9_999, 10_000, 2)
    # a stale attempt (a zombie of attempt 1) never overwrites the newer attempt's progress
    old = Context(rid, 1, 3, "pq", "p.count")
    old._services = services
    old.progress(1, total=10_000)
    await services.flush()
    assert (await client.get(rid))["progress"]["done"] == 9_999


async def test_progress_of_archived_runs_is_pruned_by_the_sweep(client: Client, stores: Stores) -> None:
    await client.register(registry)
    rid = await client.submit("p.count", "unused")
    services = RunServicesImpl(stores)
    for run_id in (rid, 2**62):  # 2**62: a run no longer in `runs` (archived)
        ctx = Context(run_id, 1, 1, "pq", "p.count")
        ctx._services = services
        ctx.progress(1)
    assert await services.flush() == 2
    async with stores.db.transaction() as tx:
        await sweep_blocked(tx)
    assert [r["run_id"] for r in await stores.db.fetch("progress_get", [rid, 2**62])] == [rid]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1, "3", True])
def test_bad_progress_values_are_refused_naming_the_field(bad: Any) -> None:
    ctx = Context(1, 1, 1, "pq", "p.count")
    with pytest.raises(InvalidInput) as e:
        ctx.progress(bad)
    assert e.value.field == "done"
    with pytest.raises(InvalidInput) as e:
        ctx.progress(1, total=bad)
    assert e.value.field == "total"
    with pytest.raises(InvalidInput) as e:
        ctx.progress(1, message="a\x1bb")
    assert e.value.field == "message"
    assert ctx.last_progress is None, "a refused report changes nothing"


@pytest.mark.slow
async def test_progress_of_a_running_job_is_shown_by_status_the_api_and_get(client: Client, settings: Settings,
                                                                             tmp_path: Path) -> None:
    await client.register(registry)
    release = tmp_path / "release"
    rid = await client.submit("p.count", str(release))
    w = spawn(settings, "worker", "--app", "tests.test_progress:registry", "--queue", "pq", "--processes", "1",
              log=tmp_path / "worker.log")
    try:
        async def reported() -> Any:
            p = (await client.get(rid))["progress"]
            return p if p is not None and p["done"] == N else None

        p = await wait_until(reported, timeout=60, what="the progress to reach PostgreSQL")
        assert (p["total"], p["message"], p["attempt"]) == (N, "copying", 1)
        out = await fp(settings, "status", str(rid))
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("progress"))
        assert f"{N}/{N} (100%) copying, attempt 1" in line, out
        js = json.loads((await fp(settings, "status", str(rid), "--json")).stdout)
        assert js["reported_progress"]["done"] == N
        app = create_app(settings, ApiConfig(token_cache_s=0, rate_limit=0))
        async with app.router.lifespan_context(app):
            _, secret = await create_token(client.stores.db, "admin", [], "progress", "test")
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http:
                r = await http.get(f"/v1/runs/{rid}", headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 200, r.text
        assert {k: r.json()["progress"][k] for k in ("done", "total", "message")} == {
            "done": N, "total": N, "message": "copying"}
        release.write_text("go")
        assert (await client.wait(rid, timeout=60)).result == N
    finally:
        w.send_signal(signal.SIGTERM)
        w.wait(20)
