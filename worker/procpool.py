"""A pool of child processes where one hung or crashed job can be killed without the others.

concurrent.futures.ProcessPoolExecutor cannot kill one task, and one os._exit breaks the
whole pool; here each child is addressed on its own pipe, and a child that times out is
killed and replaced while the rest keep serving.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import signal
import traceback
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from scheduler.models import decode_payload, encode_result

from .context import Context

log = logging.getLogger("fencepost.worker.procpool")
_CTX = mp.get_context("spawn")


class ChildCrashed(Exception):
    def __init__(self, exitcode: int | None) -> None:
        sig = f" (signal {signal.Signals(-exitcode).name})" if exitcode and exitcode < 0 else ""
        super().__init__(f"worker process exited with code {exitcode}{sig}")
        self.exitcode = exitcode


class RemoteError(Exception):
    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


def _child_main(app: str, conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from scheduler.registry import load_registry

    registry = load_registry(app)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        handler, payload, ctx_fields = msg
        try:
            args, kwargs = decode_payload(payload)
            ctx = Context(*ctx_fields)
            result = registry[handler].fn(ctx, *args, **kwargs)
            conn.send(("ok", encode_result(result)))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, never raised here
            conn.send(("err", type(exc).__name__, f"{exc}\n{traceback.format_exc(limit=5)}"[:4000]))


class _Child:
    __slots__ = ("proc", "conn")

    def __init__(self, app: str) -> None:
        parent, child = _CTX.Pipe()
        self.proc = _CTX.Process(target=_child_main, args=(app, child), daemon=True, name="fencepost-job")
        self.proc.start()
        child.close()
        self.conn = parent

    def kill(self) -> None:
        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(5)
        self.conn.close()


class ProcessPool:
    def __init__(self, app: str, size: int) -> None:
        self.app, self.size = app, size
        self._idle: asyncio.Queue[_Child] = asyncio.Queue()
        self._io = ThreadPoolExecutor(max_workers=size + 1, thread_name_prefix="fencepost-proc")
        self._children: set[_Child] = set()
        self.rebuilds = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.size):
            child = await loop.run_in_executor(self._io, _Child, self.app)
            self._children.add(child)
            self._idle.put_nowait(child)

    async def run(self, handler: str, payload: bytes, ctx_fields: tuple[Any, ...], timeout: float) -> bytes:
        """Run one job in an idle child; kill it on timeout; replace it if it dies."""
        loop = asyncio.get_running_loop()
        child = await self._idle.get()
        healthy = False
        try:
            child.conn.send((handler, payload, ctx_fields))
            reply = await asyncio.wait_for(loop.run_in_executor(self._io, child.conn.recv), timeout)
            healthy = True
        except TimeoutError:  # a subclass of OSError: must come first
            raise
        except (EOFError, OSError):
            child.proc.join(1)
            raise ChildCrashed(child.proc.exitcode) from None
        finally:
            if healthy:
                self._idle.put_nowait(child)
            else:  # timed out, cancelled or crashed: this child cannot be trusted again
                child.kill()
                self._children.discard(child)
                self.rebuilds += 1
                replacement = await loop.run_in_executor(self._io, _Child, self.app)
                self._children.add(replacement)
                self._idle.put_nowait(replacement)
        if reply[0] == "ok":
            return reply[1]
        raise RemoteError(reply[1], reply[2])

    async def close(self) -> None:
        for child in list(self._children):
            child.kill()
        self._children.clear()
        self._io.shutdown(wait=False, cancel_futures=True)
