"""Bulk actions through the API act on exactly the runs that were counted (issue 24 item 1): the
count returns a handle for the counted set (ids, states, versions stored server-side); the confirm
acts only on the counted runs that have not moved, reports what changed and what was skipped, never
touches a run submitted after the count, and its audit row lists exactly the runs acted on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fencepost.api import ApiConfig
from fencepost.client import Client
from fencepost.core.config import Settings
from tests.conftest import record_all
from tests.test_api import Api, _make_api


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0, bulk_cap=20)):
        yield a


async def _hot(client: Client, run_id: int) -> str:
    state = await client.stores.redis.hget(client.stores.keys("tq").run(run_id), "state")
    return state.decode() if state else ""


async def _bulk_rows(client: Client, action: str) -> list[dict[str, Any]]:
    rows = await client.stores.db.pool.fetch(  # type: ignore[union-attr]
        "SELECT data::text AS data FROM audit_log WHERE action = $1 ORDER BY id", action)
    return [json.loads(r["data"]) for r in rows]


async def test_a_confirm_acts_only_on_the_counted_runs_that_have_not_moved(api: Api, client: Client) -> None:
    """The issue's reproduction: z PAUSED, a < b < c PENDING; count the PENDING ones (3); then resume z
    and pause b; the confirm of 3 cancelled z (never counted) and left b. Now: a and c are cancelled,
    b is skipped as moved, z and a run submitted after the count are untouched, the audit row lists
    exactly a and c."""
    z = await client.submit("t.echo", "z")
    await client.pause(z, reason="hold")
    a, b, c = [await client.submit("t.echo", n) for n in "abc"]
    await record_all(client.stores)
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={"command": "cancel", "status": "PENDING"})
    assert r.status_code == 428, r.text
    counted = r.json()
    assert counted["matched"] == 3 and counted["acting"] == 3 and counted["sample"] == [a, b, c], counted
    handle = counted["handle"]
    await client.resume(z, reason="back")
    await client.pause(b, reason="moved")
    late = await client.submit("t.echo", "late")
    await record_all(client.stores)
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin",
                      json={"command": "cancel", "handle": handle, "confirm": 3, "reason": "cleanup"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["changed"] == [a, c] and out["acted"] == 2 and out["results"] == {"CANCELLED": 2}, out
    assert [s["id"] for s in out["skipped"]] == [b] and out["skipped"][0]["reason"].startswith("moved"), out
    assert [await _hot(client, i) for i in (z, a, b, c, late)] == ["PENDING", "CANCELLED", "PAUSED", "CANCELLED",
                                                                    "PENDING"]
    [row] = await _bulk_rows(client, "bulk_cancel")
    assert row["ids"] == [a, c] and row["skipped"] == [b] and row["handle"] == handle, row


async def test_a_handle_is_used_once_and_only_by_the_token_that_counted(api: Api, client: Client) -> None:
    ids = [await client.submit("t.echo", i) for i in range(2)]
    await record_all(client.stores)
    await api.token("admin", name="admin2")
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={"command": "pause", "status": "PENDING"})
    handle = r.json()["handle"]
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin2", json={"command": "pause", "handle": handle, "confirm": 2})
    assert r.status_code == 404 and r.json()["field"] == "handle", r.text
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={"command": "pause", "handle": handle, "confirm": 1})
    assert r.status_code == 428 and r.json()["handle"] == handle and r.json()["acting"] == 2, r.text
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={"command": "cancel", "handle": handle, "confirm": 2})
    assert r.status_code == 422 and r.json()["field"] == "command", r.text
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin",
                      json={"command": "pause", "handle": handle, "confirm": 2, "status": "PAUSED"})
    assert r.status_code == 422 and r.json()["field"] == "status", r.text
    assert [await _hot(client, i) for i in ids] == ["PENDING", "PENDING"], "a refused confirm changed runs"
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={"command": "pause", "handle": handle, "confirm": 2})
    assert r.status_code == 200 and r.json()["changed"] == ids, r.text
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={"command": "pause", "handle": handle, "confirm": 2})
    assert r.status_code == 404 and r.json()["field"] == "handle", "a handle acts once"
    assert len(await _bulk_rows(client, "bulk_pause")) == 1


async def test_a_count_without_a_handle_never_acts_even_with_a_confirm(api: Api, client: Client) -> None:
    """The old protocol's confirm (a count and an until_id) acted on whatever matched then."""
    ids = [await client.submit("t.echo", i) for i in range(3)]
    await record_all(client.stores)
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin",
                      json={"command": "cancel", "status": "PENDING", "confirm": 3, "until_id": ids[-1]})
    assert r.status_code == 428 and r.json()["acting"] == 3, r.text
    assert [await _hot(client, i) for i in ids] == ["PENDING"] * 3
    assert await _bulk_rows(client, "bulk_cancel") == []


async def test_a_count_can_be_answered_200_for_callers_that_treat_4xx_as_errors(api: Api, client: Client) -> None:
    """A browser logs every 4xx as a console error; `count: true` answers the same count with 200."""
    ids = [await client.submit("t.echo", i) for i in range(2)]
    await record_all(client.stores)
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={"command": "retry", "status": "PENDING", "count": True})
    assert r.status_code == 200 and r.json()["acting"] == 2 and r.json()["sample"] == ids, r.text
    r = await api.req("POST", "/v1/queues/nosuch/bulk", "admin", json={"command": "retry", "count": True})
    assert r.status_code == 404, r.text
