"""A TCP proxy for tests that can blackhole a link: stop forwarding while keeping every socket
open (the partition a worker meets when a switch or a NAT table drops its packets; a closed
socket would be noticed at once, a silent one is not).

    proxy = await Blackhole.start("127.0.0.1", 6379)   # listens on 127.0.0.1:<free port>
    url = f"redis://127.0.0.1:{proxy.port}/0"           # give this URL to the process under test
    proxy.pause()      # bytes in both directions are held back, not dropped, sockets stay open
    proxy.resume()     # what was held is delivered, in order (a "healed" partition: late commands
                       # run on the server now, late replies reach the client now)
    proxy.pause(drop=True)   # or: bytes sent during the cut are discarded (lost packets)
    proxy.pause(existing_only=True)   # only the connections open now stall; new ones work (a dead
                                      # flow beside a healthy path: what a client's re-send uses)
    await proxy.close()

Runs in the test's own event loop (pytest-asyncio); for a process under test the proxy only
needs to be reachable, so a test starts it in its loop and hands the URL to the child.
`BlackholeThread` runs one in a thread of its own for synchronous tests and for processes
whose event loop is busy: same pause()/resume()/port, started with `BlackholeThread(host, port)`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

__all__ = ["Blackhole", "BlackholeThread"]


class Blackhole:
    """A forwarding proxy to (host, port) with pause()/resume(); `forwarded` counts bytes passed."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.target_port = host, port
        self.port = 0
        self.forwarded = 0
        self.held = 0
        self._gates: list[asyncio.Event] = []  # one per connection: set = forwarding
        self._paused_new = False
        self._drop = False
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @classmethod
    async def start(cls, host: str, port: int, listen: str = "127.0.0.1") -> Blackhole:
        self = cls(host, port)
        self._server = await asyncio.start_server(self._accept, listen, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def paused(self) -> bool:
        return self._paused_new or any(not g.is_set() for g in self._gates)

    def pause(self, drop: bool = False, existing_only: bool = False) -> None:
        """Stop forwarding (both directions) on every connection, and on new ones unless
        `existing_only`; sockets stay open. drop=True discards what is sent during the cut instead
        of delivering it on resume()."""
        self._drop = drop
        self._paused_new = not existing_only
        for g in self._gates:
            g.clear()

    def resume(self) -> None:
        self._drop = False
        self._paused_new = False
        for g in self._gates:
            g.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_w}
        gate = asyncio.Event()
        if not self._paused_new:
            gate.set()
        self._gates.append(gate)
        for src, dst in ((reader, up_w), (up_r, writer)):
            t = asyncio.ensure_future(self._pipe(src, dst, gate))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, gate: asyncio.Event) -> None:
        try:
            while data := await src.read(65536):
                if not gate.is_set():
                    if self._drop:
                        continue
                    self.held += len(data)
                    await gate.wait()  # hold it (reading stops, so TCP buffers fill up too)
                dst.write(data)
                await dst.drain()
                self.forwarded += len(data)
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            if not dst.is_closing():
                dst.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.resume()
        for t in list(self._tasks):
            t.cancel()
        for w in list(self._writers):
            w.close()
        if self._server is not None:
            await self._server.wait_closed()


class BlackholeThread:
    """A Blackhole in its own thread and event loop: for synchronous tests, or when the test's
    loop is the one under test."""

    def __init__(self, host: str, port: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(host, port), daemon=True, name="blackhole")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("blackhole proxy did not start")
        self.port = self.proxy.port

    def _main(self, host: str, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        self.proxy = self._loop.run_until_complete(Blackhole.start(host, port))
        self._ready.set()
        self._loop.run_forever()

    @property
    def forwarded(self) -> int:
        return self.proxy.forwarded

    def _do(self, fn: Any, *args: Any) -> None:
        async def call() -> None:
            fn(*args)
        asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)  # in effect when this returns

    def pause(self, drop: bool = False, existing_only: bool = False) -> None:
        self._do(self.proxy.pause, drop, existing_only)

    def resume(self) -> None:
        self._do(self.proxy.resume)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
