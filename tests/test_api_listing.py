"""Listing routes filter by the caller's scope before they limit, and page with keyset cursors
(issue 24 item 3): a scoped operator saw an empty dead letter once newer failures of another queue
filled the page; the review view the same."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fencepost.api import ApiConfig
from fencepost.client import Client
from fencepost.core.config import Settings
from tests.test_api import Api, _make_api


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        yield a


async def _fail(client: Client, queue: str, n: int, *, review: bool = False, start_s: int = 0) -> list[int]:
    """n runs of `queue` dead-lettered (or in review), finished start_s.. seconds ago (older first)."""
    ids = [await client.submit("t.echo", i, queue=queue) for i in range(n)]
    await client.stores.db.pool.execute(  # type: ignore[union-attr]
        "UPDATE runs SET status = 'FAILED', attempt = 1, reason = $2, "
        "finished_at = now() - make_interval(secs => $3 + array_position($1::bigint[], id) * -1 + 1000) "
        "WHERE id = ANY($1)", ids, "review" if review else "max_retries", start_s)
    return ids


@pytest.mark.parametrize("path,review", [("/v1/dead-letter", False), ("/v1/review", True)])
async def test_a_scoped_operator_sees_its_queues_dead_letter_behind_newer_failures_elsewhere(
        api: Api, client: Client, path: str, review: bool) -> None:
    """The issue's reproduction: 42 failures in one queue, then 60 newer ones in another; the scoped
    operator's first page (limit 50) was [] while ?queue= found its 42."""
    mine = await _fail(client, "tq", 42, review=review, start_s=500)
    await _fail(client, "other", 60, review=review, start_s=0)
    r = await api.req("GET", path, "op_tq")
    assert r.status_code == 200, r.text
    got = [x["id"] for x in r.json()]
    assert sorted(got) == sorted(mine) and all(x["queue"] == "tq" for x in r.json()), got


async def test_the_dead_letter_pages_with_a_cursor_and_loses_no_row(api: Api, client: Client) -> None:
    ids = await _fail(client, "tq", 25)
    seen: list[int] = []
    cursor = None
    for _ in range(10):
        r = await api.req("GET", "/v1/dead-letter", "admin", params={"limit": 10, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        seen += [x["id"] for x in r.json()]
        cursor = r.headers.get("x-next-cursor")
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen)), seen
    assert seen == sorted(ids, reverse=True), "newest finished first"
    r = await api.req("GET", "/v1/dead-letter", "admin", params={"cursor": "yesterday"})
    assert r.status_code == 422 and r.json()["field"] == "cursor"


async def test_queue_figures_come_from_the_maintained_rollup_not_a_scan_of_runs(api: Api, client: Client) -> None:
    """Issue 24 item 12: GET /v1/queues counted finished runs and averaged attempt lags by scanning
    runs and attempts (362 ms at 1,000,000 runs); it reads the per-minute rollup the recorder keeps."""
    await client.submit("t.echo", 1)
    hist = [0] * 16
    hist[3] = 10  # ten starts 50-100 ms late
    await client.stores.db.pool.execute(  # type: ignore[union-attr]
        "INSERT INTO queue_minutes (queue, minute, started, succeeded, failed, retried, lag_hist, run_hist) "
        "VALUES ('tq', date_trunc('minute', now()), 10, 25, 5, 0, $1, $2)", hist, [0] * 16)
    r = await api.req("GET", "/v1/queues", "admin", params={"window": 300})
    (tq,) = [q for q in r.json() if q["queue"] == "tq"]
    assert tq["finished_last_window"] == 30 and tq["throughput_per_min"] == 6.0, tq
    assert tq["schedule_lag_s"] == 0.075, tq


async def test_cli_dlq_through_the_api_shows_the_scoped_operators_rows(settings: Settings, client: Client,
                                                                       tmp_path: Any) -> None:
    """The issue's reproduction: `fencepost dlq --api` as an operator scoped to one queue printed "(none)"
    once newer failures of another queue filled the page."""
    import asyncio
    import subprocess
    import sys

    from fencepost.api.auth import create_token
    from tests.conftest import ROOT, stop
    from tests.test_api import start_api

    mine = await _fail(client, "tq", 3, start_s=500)
    await _fail(client, "other", 60)
    _, secret = await create_token(client.stores.db, "operator", ["tq"], "oncall", "test")
    proc, url = await start_api(settings, tmp_path / "api.log")
    try:
        env = {"PATH": "/usr/bin:/bin", "FENCEPOST_API_URL": url, "FENCEPOST_API_TOKEN": secret,
               "FENCEPOST_REDIS_URL": "redis://127.0.0.1:1/0", "FENCEPOST_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}
        out = await asyncio.to_thread(lambda: subprocess.run(
            [sys.executable, "-m", "fencepost.cli", "dlq", "--json"], cwd=ROOT, env=env, capture_output=True,
            text=True, timeout=60))
        assert out.returncode == 0, out.stderr
        assert sorted(r["id"] for r in json.loads(out.stdout)) == sorted(mine), out.stdout
    finally:
        stop([proc])


async def test_the_fleet_history_lists_events_and_attempts_claims_and_finishes_newest_first(
        api: Api, client: Client) -> None:
    """GET /v1/events limits each half of the history (event rows, attempts' claims and finishes) on its own
    before merging them (issue 24 item 12): what it lists is still the newest of both, in order."""
    from tests.conftest import record_all
    from tests.test_drift import claim, finish

    rid = await client.submit("t.echo", 1)
    (cid, token), = await claim(client.stores, 1)
    assert cid == rid and await finish(client.stores, rid, token) == "SUCCEEDED"
    await record_all(client.stores)
    r = await api.req("GET", "/v1/events", "admin")
    assert r.status_code == 200, r.text
    mine = [(e["type"], e["queue"]) for e in r.json() if e["run_id"] == rid]
    assert [t for t, _ in mine][:3] == ["succeeded", "claimed", "submitted"][:len(mine)] and len(mine) >= 3, mine
    assert {q for _, q in mine} == {"tq"}
    ats = [e["at"] for e in r.json()]
    assert ats == sorted(ats, reverse=True)
    r = await api.req("GET", "/v1/events", "op_other")
    assert all(e["run_id"] != rid for e in r.json()), "another scope's history"
