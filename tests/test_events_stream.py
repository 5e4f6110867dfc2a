"""The live fleet event stream (issue 17: "live updates ... Server-Sent Events"): GET /v1/events/stream
pushes what the recorder records from now on, with the scope and filters of GET /v1/events, from one
reader per API process (fencepost.api.stream.EventHub) on real PostgreSQL and a real HTTP server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from fencepost.api import ApiConfig, create_app, stream
from fencepost.api.auth import create_token, revoke_token
from fencepost.api.stream import GAP, EventHub
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from tests.conftest import record_all, wait_until
from tests.test_api import serve_in_thread
from tests.test_control import _worker

pytestmark = pytest.mark.slow


async def _messages(resp: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Server-Sent Events messages: {"event", "id", "data"} (data decoded), comments skipped."""
    msg: dict[str, Any] = {}
    async for line in resp.aiter_lines():
        if not line:
            if msg:
                yield msg
            msg = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(": ")
            msg[field] = json.loads(value) if field == "data" else value


async def _until(messages: AsyncIterator[dict[str, Any]], want: Any, seen: list[dict[str, Any]],
                 timeout: float = 30) -> dict[str, Any]:
    """Read messages (kept in `seen`) until one `want` accepts; bounded."""
    async def go() -> dict[str, Any]:
        async for m in messages:
            seen.append(m)
            if want(m):
                return m
        raise AssertionError(f"the stream ended first: {seen}")

    return await asyncio.wait_for(go(), timeout)


async def test_the_hub_reads_each_recorded_event_once_catches_late_commits_and_reports_gaps(
        client: Client, stores: Stores) -> None:
    hub = EventHub(stores.db, lookback_s=5.0, batch=4)
    assert await hub.look() == []
    first = [await client.submit("t.echo", i) for i in range(2)]
    got = await hub.look()
    assert [i.type for i in got] == ["submitted", "submitted"] and [i.queue for i in got] == ["tq", "tq"]
    assert [json.loads(i.message.split(b"data: ")[1])["run_id"] for i in got] == first
    assert await hub.look() == [], "each event once"

    # a transaction that began before the last look and committed after it (recorded_at 2 s back)
    pool = stores.db.pool
    assert pool is not None
    late = await pool.fetchval("INSERT INTO events (queue, type, at, recorded_at) "
                               "VALUES ('tq', 'late', now(), now() - interval '2 seconds') RETURNING id")
    assert [i.id for i in await hub.look()] == [late]

    # more than a batch between two looks: the newest batch, after a gap
    for i in range(6):
        await client.submit("t.echo", 10 + i)
    got = await hub.look()
    assert got[0] is GAP and len(got) == 5 and all(i.type == "submitted" for i in got[1:])


async def test_the_stream_pushes_recorded_events_within_the_tokens_scope(
        settings: Settings, client: Client, stores: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "RECHECK_S", 0.5)
    op_row, op = await create_token(client.stores.db, "operator", ["tq"], "stream-op", "test")
    _, admin = await create_token(client.stores.db, "admin", [], "stream-admin", "test")
    app = create_app(settings, ApiConfig(token_cache_s=0, rate_limit=0))
    with serve_in_thread(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            def h(secret: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {secret}"}

            r = await http.get("/v1/events/stream", params={"queue": "other", "duration": 0}, headers=h(op))
            assert r.status_code == 403 and r.json()["queue"] == "other", "a queue outside the scope"
            assert (await http.get("/v1/events/stream", params={"duration": 3601}, headers=h(op))).status_code == 422
            assert (await http.get("/v1/events/stream", params={"duration": 0})).status_code == 401

            async with http.stream("GET", "/v1/events/stream", headers=h(op)) as mine, \
                    http.stream("GET", "/v1/events/stream", params={"type": "succeeded"}, headers=h(admin)) as fleet:
                assert mine.status_code == 200 and mine.headers["content-type"].startswith("text/event-stream")
                assert mine.headers["cache-control"] == "no-cache"
                ours, theirs = _messages(mine), _messages(fleet)
                seen: list[dict[str, Any]] = []
                admin_seen: list[dict[str, Any]] = []
                await _until(ours, lambda m: m.get("event") == "ready", seen)
                await _until(theirs, lambda m: m.get("event") == "ready", admin_seen)
                elsewhere = await client.submit("t.echo", 1, queue="other")
                here = await client.submit("t.echo", 2)
                got = await _until(ours, lambda m: m.get("event") == "fleet" and m["data"]["run_id"] == here, seen)
                assert got["data"]["type"] == "submitted" and got["data"]["queue"] == "tq"
                assert got["id"] == str(got["data"]["id"]) and got["data"]["handler"] == "t.echo"

                # a transition the recorder records shows up too; the admin's stream has only that type
                async with _worker(settings, queues=["tq", "other"]):
                    await client.wait(here, timeout=30)
                    await client.wait(elsewhere, timeout=30)
                await record_all(stores)
                done = await _until(ours, lambda m: m.get("data", {}).get("type") == "succeeded", seen)
                assert done["data"]["run_id"] == here and done["data"]["to_status"] == "SUCCEEDED"
                both = {(await _until(theirs, lambda m: m.get("event") == "fleet", admin_seen))["data"]["run_id"]
                        for _ in range(2)}
                assert both == {here, elsewhere}
                assert {m["data"]["type"] for m in admin_seen if m.get("event") == "fleet"} == {"succeeded"}
                assert not [m for m in seen if m.get("event") == "fleet" and m["data"]["run_id"] == elsewhere]

                # a revoked token's stream ends (re-checked every RECHECK_S), the other goes on
                await revoke_token(client.stores.db, int(op_row["id"]), "test", reason="left")
                end = await _until(ours, lambda m: m.get("event") == "end", seen)
                assert "revoked" in end["data"]["reason"]
                assert not [m async for m in ours], "and the server closed it"
                assert (await http.get("/v1/events/stream", params={"duration": 0}, headers=h(op))).status_code == 401
            async def unsubscribed() -> bool:  # the server sees the client's close after a moment, not at once
                return app.state.event_hub.subscribers == set()

            await wait_until(unsubscribed, timeout=30, what="closed streams to unsubscribe")


async def test_a_stream_ends_after_its_duration(settings: Settings, client: Client) -> None:
    _, secret = await create_token(client.stores.db, "operator", [], "d", "test")
    app = create_app(settings, ApiConfig(token_cache_s=0, rate_limit=0))
    with serve_in_thread(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http, \
                http.stream("GET", "/v1/events/stream", params={"duration": 1},
                            headers={"Authorization": f"Bearer {secret}"}) as resp:
            got = [m async for m in _messages(resp)]
    assert got[0]["event"] == "ready" and got[-1] == {"event": "end", "data": {"reason": "duration"}}
