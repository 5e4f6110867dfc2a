"""Review of the live event stream: `fencepost api` stops on SIGTERM while an event stream is open
(a dashboard's events view holds one for up to `duration`, 300 s by default, up to an hour; uvicorn
waited for it to end before exiting, so a rolling deploy hung until its SIGKILL): the stream gets
`event: end` (reason shutdown) and the process exits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import struct
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from fencepost.api import ApiConfig, create_app, stream
from fencepost.api.auth import create_token
from fencepost.client import Client
from fencepost.core.config import Settings
from tests.conftest import wait_until
from tests.test_api import serve_in_thread, start_api

pytestmark = pytest.mark.slow


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
