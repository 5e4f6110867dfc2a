"""The live fleet event stream (issue 17: "live updates ... Server-Sent Events"): GET /v1/events/stream
pushes what the recorder records from now on, with the scope and filters of GET /v1/events, from one
reader per API process (fencepost.api.stream.EventHub) on real PostgreSQL and a real HTTP server.
Streams are bounded: a token holds a limited number open, a stream whose client vanished is
released, and `fencepost api` stops on SIGTERM with a stream open (a dashboard's events view holds
one for up to `duration`; uvicorn waited for it to end, so a rolling deploy hung until its SIGKILL):
the stream gets `event: end` (reason shutdown) and the process exits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import struct
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
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
from tests.test_api import serve_in_thread, start_api
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

    try:
        return await asyncio.wait_for(go(), timeout)
    except TimeoutError:
        raise AssertionError(f"no wanted message within {timeout} s; seen: {seen}") from None


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


async def test_the_api_stops_on_sigterm_with_an_event_stream_open(settings: Settings, client: Client,
                                                                   tmp_path: Path) -> None:
    _, secret = await create_token(client.stores.db, "operator", [], "dashboard", "test")
    log = tmp_path / "api.log"
    proc, url = await start_api(settings, log)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http, \
                http.stream("GET", "/v1/events/stream", params={"duration": 3600},
                            headers={"Authorization": f"Bearer {secret}"}) as resp:
            lines = resp.aiter_lines()
            assert await asyncio.wait_for(anext(lines), 30) == "retry: 2000"
            proc.send_signal(signal.SIGTERM)
            rest: list[str] = []
            with contextlib.suppress(httpx.HTTPError):
                async for line in lines:  # bounded: the server ends it, or the client's read timeout fails the test
                    rest.append(line)
            assert "event: end" in rest and 'data: {"reason": "shutdown"}' in rest, rest
        try:  # a bound far below the stream's hour
            code = await asyncio.to_thread(proc.wait, 60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"fencepost api still running after SIGTERM: {log.read_text()}") from None
        assert code in (0, -signal.SIGTERM), log.read_text()  # uvicorn re-raises the signal it handled
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_token_holds_a_bounded_number_of_open_streams(settings: Settings, client: Client,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Each open stream is a connection, a task and a backlog held for up to an hour: one token may
    not hold more than stream.MAX_PER_TOKEN of them in an API process (429, Retry-After; nothing
    else of the token's is refused, another token is not affected, a closed stream frees its place)."""
    monkeypatch.setattr(stream, "MAX_PER_TOKEN", 2)
    _, op = await create_token(client.stores.db, "operator", [], "tabs", "test")
    _, other = await create_token(client.stores.db, "operator", [], "other", "test")
    app = create_app(settings, ApiConfig(token_cache_s=0, rate_limit=0))

    def h(secret: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {secret}"}

    with serve_in_thread(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            lines: list[Any] = []  # each open stream's line reader (dropping one would close its stream)

            async def opened(secret: str) -> tuple[contextlib.AbstractAsyncContextManager[httpx.Response],
                                                   httpx.Response]:
                cm = http.stream("GET", "/v1/events/stream", headers=h(secret))
                resp = await cm.__aenter__()
                if resp.status_code == 200:
                    lines.append(resp.aiter_lines())
                    assert await asyncio.wait_for(anext(lines[-1]), 30) == "retry: 2000"
                return cm, resp

            first, second = await opened(op), await opened(op)
            assert (first[1].status_code, second[1].status_code) == (200, 200)
            third = await opened(op)
            assert third[1].status_code == 429 and int(third[1].headers["retry-after"]) >= 1
            body = json.loads(await third[1].aread())
            assert body["limit"] == 2 and "event streams" in body["detail"], body
            await third[0].__aexit__(None, None, None)
            assert (await http.get("/v1/events", headers=h(op))).status_code == 200, "the rest of the API is not"
            elsewhere = await opened(other)
            assert elsewhere[1].status_code == 200, "another token has its own places"
            await first[0].__aexit__(None, None, None)

            async def place_freed() -> bool:  # the server sees the close after a moment
                cm, resp = await opened(op)
                if resp.status_code == 200:
                    await cm.__aexit__(None, None, None)
                    return True
                await cm.__aexit__(None, None, None)
                return False

            await wait_until(place_freed, timeout=30, what="the closed stream's place")
            for cm, _ in (second, elsewhere):
                await cm.__aexit__(None, None, None)

            async def all_closed() -> bool:
                return not app.state.event_hub.subscribers and not app.state.event_hub.open_by_token

            await wait_until(all_closed, timeout=30, what="every stream released")


async def test_streams_whose_clients_vanish_are_released(settings: Settings, client: Client) -> None:
    """Clients that go away without a word (closed sockets, resets) while events are coming: every
    subscription and every token's place is given back, and the hub's reader stops."""
    _, secret = await create_token(client.stores.db, "operator", [], "vanishing", "test")
    app = create_app(settings, ApiConfig(token_cache_s=0, rate_limit=0))
    with serve_in_thread(app) as base:
        host, port = base.removeprefix("http://").split(":")
        socks = []
        for _ in range(stream.MAX_PER_TOKEN):
            s = socket.create_connection((host, int(port)), timeout=30)
            s.sendall(f"GET /v1/events/stream?duration=3600 HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {secret}\r\n\r\n".encode())
            socks.append(s)
        for s in socks:
            assert b"event: ready" in await asyncio.to_thread(s.recv, 4096)
        hub = app.state.event_hub
        for i in range(50):  # events arrive while nobody reads them
            await client.submit("t.echo", i)
        for i, s in enumerate(socks):
            if i % 2:  # a reset rather than an orderly close
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()

        async def released() -> bool:
            return not hub.subscribers and not hub.open_by_token and hub._task is None

        await wait_until(released, timeout=60, what="every vanished stream released")
