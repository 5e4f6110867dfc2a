"""The live fleet event stream behind GET /v1/events/stream (Server-Sent Events).

One reader per API process (`EventHub`) asks PostgreSQL every second for the events recorded
since its last look (named query events_recorded_since; the BRIN index of sql/016 makes that a
read of the newest pages) and hands each batch to every open stream, which keeps what its token's
scope and its own filters allow. N open dashboards cost one query a second, not N. The reader
runs while at least one stream is open.

`recorded_at` is the start of the recording transaction: one that began before the last look
but committed after it is caught by looking back LOOKBACK_S each time and skipping the ids
already handed out. A stream that may have missed events (more than BATCH recorded between two
looks, a client too slow to take them, PostgreSQL unreachable) gets a `gap` event, and the
dashboard reloads the list it streams into (GET /v1/events).

The wire format, one event per message: `id:` the event id, `event: fleet`, `data:` the event as
GET /v1/events gives it (JSON). Also `event: ready` once the stream is subscribed (anything
recorded from then on will come), `event: gap`, `event: end` (data: why: duration, a revoked
token, the server shutting down) before the server closes the stream, and a `: keep-alive` comment every KEEPALIVE_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec
from starlette.responses import StreamingResponse

from fencepost.api import schemas as S
from fencepost.api.problems import RateLimited
from fencepost.core.record import Database

__all__ = ["BATCH", "END", "LOOKBACK_S", "MAX_PER_TOKEN", "EventHub", "Item", "close_streams", "hub_for", "sse_response"]

log = logging.getLogger("fencepost.api.stream")
_enc = msgspec.json.Encoder()

BATCH = 1000
"""At most this many events a look; more recorded in one second are announced as a gap."""
LOOKBACK_S = 5.0
EVERY_S = 1.0
KEEPALIVE_S = 15.0
RETRY_S = 2
"""The stream's `retry:` (the client's reconnection delay), in seconds; also the Retry-After of a 429."""
RECHECK_S = 30.0
"""An open stream re-checks its token this often: a revoked or expired token's stream ends."""
BACKLOG = 50
"""Batches a stream may have waiting; beyond it the stream gets a gap instead."""
MAX_PER_TOKEN = 10
"""Open streams one token may hold in one API process (a dashboard tab holds one); more: 429."""


@dataclass(frozen=True, slots=True)
class Item:
    """One event, encoded once for every stream: what the filters need, and the SSE message."""

    id: int
    queue: str | None
    type: str
    message: bytes


GAP = Item(0, None, "", b"event: gap\ndata: {}\n\n")
END = Item(0, None, "", b'event: end\ndata: {"reason": "shutdown"}\n\n')
"""The server is stopping (EventHub.close): the stream ends now, its client reconnects elsewhere."""


class Subscription:
    def __init__(self) -> None:
        self._batches: deque[list[Item]] = deque()
        self._ready = asyncio.Event()

    def offer(self, batch: list[Item]) -> None:
        if len(self._batches) >= BACKLOG:
            self._batches.clear()  # a slow reader: what it missed is announced, not buffered without end
            batch = [GAP]
        self._batches.append(batch)
        self._ready.set()

    def end(self) -> None:
        """End the stream at its next read, whatever it has waiting."""
        self._batches.clear()
        self._batches.append([END])
        self._ready.set()

    async def next(self, timeout: float) -> list[Item] | None:
        """The next batch, or None after `timeout` seconds without one."""
        if not self._batches:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout)
        return self._batches.popleft() if self._batches else None


def _item(row: Any) -> Item:
    d = {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in msgspec.structs.asdict(row).items()}
    event = msgspec.convert(d, S.Event)
    return Item(event.id, event.queue, event.type,
                b"id: %d\nevent: fleet\ndata: %s\n\n" % (event.id, _enc.encode(event)))


class EventHub:
    """Reads the events recorded since its last look, once a second, for every open stream."""

    def __init__(self, db: Database, *, every_s: float = EVERY_S, lookback_s: float = LOOKBACK_S,
                 batch: int = BATCH) -> None:
        self.db, self.every_s, self.lookback_s, self.batch = db, every_s, lookback_s, batch
        self.subscribers: set[Subscription] = set()
        self.open_by_token: dict[int, int] = {}
        """Streams each token holds open (taken when the response is made, given back when it ends)."""
        self._task: asyncio.Task[None] | None = None
        self._cursor: datetime | None = None
        self._seen: dict[tuple[int, int | None], datetime] = {}
        """(history id, run id) of what was sent: an attempt's claim or finish has the id minus its stream
        id, and two queues' streams can hand out the same entry id in the same millisecond."""
        self.looks = 0

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[Subscription]:
        sub = Subscription()
        self.subscribers.add(sub)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="fencepost-event-hub")
        try:
            yield sub
        finally:
            self.subscribers.discard(sub)
            if not self.subscribers and self._task is not None:
                self._task.cancel()
                self._task = None

    def close(self) -> None:
        """The server is stopping: every open stream ends (`event: end`, reason shutdown) instead of
        holding the process for the rest of its duration."""
        for sub in list(self.subscribers):
            sub.end()

    async def _run(self) -> None:
        self._cursor, self._seen = None, {}  # a fresh start: the streams opened now reload their lists
        while self.subscribers:
            try:
                batch = await self.look()
            except Exception as exc:  # PostgreSQL away: every stream may miss events; try again
                log.warning("event stream read failed: %s", exc, extra={"event": "event_stream_failed"})
                batch = [GAP]
            if batch:
                for sub in list(self.subscribers):
                    sub.offer(batch)
            await asyncio.sleep(self.every_s)

    async def look(self) -> list[Item]:
        """One look: the events recorded since the last one, oldest first (a GAP first if some were skipped)."""
        rows = await self.db.rows("events_recorded_since", self._cursor, self.lookback_s, self.batch)
        self.looks += 1
        out: list[Item] = []
        if len(rows) == self.batch and self._cursor is not None \
                and rows[-1].recorded_at > self._cursor - timedelta(seconds=self.lookback_s):
            out.append(GAP)  # the batch did not reach back to what the last look saw
        for row in reversed(rows):
            key = (row.id, row.run_id)
            if key in self._seen:
                continue
            self._seen[key] = row.recorded_at
            out.append(_item(row))
        if rows and (self._cursor is None or rows[0].recorded_at > self._cursor):
            self._cursor = rows[0].recorded_at
        if self._cursor is not None:
            horizon = self._cursor - timedelta(seconds=self.lookback_s)
            self._seen = {k: v for k, v in self._seen.items() if v >= horizon}
        return out


def hub_for(state: Any, db: Database) -> EventHub:
    """The application's hub (one per API process), made on first use."""
    hub: EventHub | None = getattr(state, "event_hub", None)
    if hub is None:
        hub = EventHub(db)
        state.event_hub = hub
    return hub


def close_streams(state: Any) -> None:
    """End the application's open streams (the server is stopping; see EventHub.close)."""
    hub: EventHub | None = getattr(state, "event_hub", None)
    if hub is not None:
        hub.close()


class _Stream(StreamingResponse):
    """A StreamingResponse that gives its token's place back when it ends, however it ends (the
    client went away before the first byte included: the body never started then)."""

    def __init__(self, body: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def sse_response(hub: EventHub, accept: Callable[[Item], bool], *, duration_s: float,
                 recheck: Callable[[], Awaitable[Any]], token_id: int) -> StreamingResponse:
    """The stream for one caller: the events `accept` keeps, until `duration_s` has passed (the client
    reconnects) or `recheck` (the token, every RECHECK_S) raises. RateLimited (429) when the token
    already holds MAX_PER_TOKEN open streams."""
    held = hub.open_by_token.get(token_id, 0)
    if held >= MAX_PER_TOKEN:
        raise RateLimited(f"token {token_id} holds {held} open event streams in this API process (at most "
                          f"{MAX_PER_TOKEN}); close one first", limit=MAX_PER_TOKEN, retry_after=RETRY_S)
    hub.open_by_token[token_id] = held + 1

    def release() -> None:
        left = hub.open_by_token.get(token_id, 1) - 1
        if left > 0:
            hub.open_by_token[token_id] = left
        else:
            hub.open_by_token.pop(token_id, None)

    async def body() -> AsyncIterator[bytes]:
        ends = time.monotonic() + duration_s
        checked = time.monotonic()
        async with hub.subscribe() as sub:
            yield b"retry: %d\nevent: ready\ndata: {}\n\n" % (RETRY_S * 1000)
            while (left := ends - time.monotonic()) > 0:
                if time.monotonic() - checked >= RECHECK_S:
                    try:
                        await recheck()
                    except Exception as exc:
                        yield b"event: end\ndata: %s\n\n" % _enc.encode({"reason": str(exc)})
                        return
                    checked = time.monotonic()
                batch = await sub.next(min(left, KEEPALIVE_S, RECHECK_S))
                if batch is None:
                    yield b": keep-alive\n\n"
                    continue
                if batch[0] is END:
                    yield END.message
                    return
                chunk = b"".join(i.message for i in batch if i is GAP or accept(i))
                if chunk:
                    yield chunk
            yield b'event: end\ndata: {"reason": "duration"}\n\n'

    return _Stream(body(), release)
