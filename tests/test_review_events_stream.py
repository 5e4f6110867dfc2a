"""Review of the live event stream: `fencepost api` stops on SIGTERM while an event stream is open
(a dashboard's events view holds one for up to `duration`, 300 s by default, up to an hour; uvicorn
waited for it to end before exiting, so a rolling deploy hung until its SIGKILL): the stream gets
`event: end` (reason shutdown) and the process exits."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fencepost.api.auth import create_token
from fencepost.client import Client
from fencepost.core.config import Settings
from tests.conftest import ROOT, wait_until, worker_env

pytestmark = pytest.mark.slow


async def test_the_api_stops_on_sigterm_with_an_event_stream_open(settings: Settings, client: Client,
                                                                   tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _, secret = await create_token(client.stores.db, "operator", [], "dashboard", "test")
    log = tmp_path / "api.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fencepost.cli", "api", "--port", str(port)], cwd=ROOT,
                                env=worker_env(settings), stdout=out, stderr=out)
    try:
        async def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                async with httpx.AsyncClient() as h:
                    return (await h.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await wait_until(up, timeout=30, what="fencepost api to listen")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http, \
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
