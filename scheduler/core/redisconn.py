"""Redis connections for the hot path: commands packed by hiredis (C) instead of redis-py's
pure-Python packer, which dominated the worker's profile for batched EVALSHA calls.

No command is sent twice by the client (`NO_RESEND`): redis-py 6+ retries every command up to
a few times on a timeout or a broken connection, and a re-sent claim, finish or transition can
arrive after its caller gave up (docs/clock.md). Callers retry on their own terms: each script
is safe to run again (claims carry a deadline, finishes and releases a fencing token, operator
commands a state and version check). An idempotent read (INFO, GET, HMGET, SCAN, a pipeline of
reads) may go once more on a fresh connection: `read_twice`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, MaxConnectionsError

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a declared dependency
    hiredis = None  # type: ignore[assignment]  # the module or None; checked before use

__all__ = ["POOL_MAX", "POOL_WAIT_S", "connect", "no_resend", "read_twice", "register_scheme"]

POOL_MAX = 100
"""Connections one client opens at most. A burst of more concurrent commands (400 handlers that
checkpoint in one instant) waits for a free connection: redis-py 8's plain pool has the same cap but
raises MaxConnectionsError past it, which a lease renewal or a claim caught in the burst would take
for Redis being down (tests/test_connection_bursts.py)."""
POOL_WAIT_S = 20.0
"""How long a command waits for a free connection before it fails (MaxConnectionsError). The hot path's
own waits are shorter and bound it first (a renewal's deadline, a claim's deadline on the server clock)."""

T = TypeVar("T")

_SCHEMES: dict[str, Callable[..., aioredis.Redis]] = {}


class _HiredisPackedConnection(aioredis.Connection):
    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):
            args = tuple(args[0].encode().split()) + args[1:]
        elif b" " in args[0]:
            args = tuple(args[0].split()) + args[1:]
        try:
            return [hiredis.pack_command(args)]
        except TypeError as exc:
            raise DataError(str(exc)) from None


class _WaitingPool(aioredis.ConnectionPool):
    """redis-py's plain pool, whose fast path stays as it is (redis-py's BlockingConnectionPool wraps
    every checkout in a timed wait: +20 us of worker CPU per job, bench/throughput.py), except that a
    command finding all POOL_MAX connections in use waits, up to POOL_WAIT_S, for one to come back
    instead of raising MaxConnectionsError."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._returned = asyncio.Event()

    async def get_connection(self, *args: Any, **options: Any) -> Any:
        deadline = time.monotonic() + POOL_WAIT_S
        while True:
            try:
                return await super().get_connection(*args, **options)  # type: ignore[no-untyped-call]
            except MaxConnectionsError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                self._returned.clear()
                try:
                    await asyncio.wait_for(self._returned.wait(), left)
                except TimeoutError:
                    pass

    async def release(self, connection: Any) -> None:
        await super().release(connection)
        self._returned.set()


def register_scheme(scheme: str, factory: Callable[..., aioredis.Redis]) -> None:
    """Serve Redis URLs `scheme://...` with `factory(url, **kwargs)` (fencepost.testing's fakeredis://)."""
    _SCHEMES[scheme] = factory


def no_resend() -> dict[str, Any]:
    """Client options under which redis-py never re-sends a command (no retry on timeout or on a
    connection error): give them to every hot-path client (Stores does, plain and Sentinel)."""
    return {"retry_on_timeout": False, "retry": Retry(NoBackoff(), 0)}


async def read_twice(read: Callable[[], Awaitable[T]]) -> T:
    """Run `read`, an idempotent read and nothing else (never a script or a write), and once more
    if the connection it went out on was broken: redis-py drops that connection, so the second
    try takes a fresh one (a pooled connection a failover or a proxy cut after it was last used)."""
    try:
        return await read()
    except RedisConnectionError:
        return await read()


def connect(url: str, **kwargs: Any) -> aioredis.Redis:
    for k, v in no_resend().items():
        kwargs.setdefault(k, v)
    factory = _SCHEMES.get(url.partition("://")[0])
    if factory is not None:
        return factory(url, **kwargs)
    if hiredis is not None and url.startswith("redis://"):
        kwargs.setdefault("connection_class", _HiredisPackedConnection)
    kwargs.setdefault("max_connections", POOL_MAX)
    client = aioredis.Redis(connection_pool=_WaitingPool.from_url(url, **kwargs))
    client.auto_close_connection_pool = True  # closed with the client, as Redis.from_url's pool is
    return client
