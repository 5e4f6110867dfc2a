"""Example handlers used by `fencepost demo` and the tests: one of each execution model,
plus the failures a demo should show (retry then succeed, dead-letter, timeout)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from typing import TYPE_CHECKING

from fencepost.core.registry import Registry

if TYPE_CHECKING:
    from fencepost.worker.context import Context, SyncContext

registry = Registry()


@registry.job("add", queue="demo")
async def add(ctx: Context, a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@registry.job("flaky", queue="demo", max_retries=3)
async def flaky(ctx: Context, succeed_on: int = 2) -> str:
    """Fails until its `succeed_on`-th attempt: shows retries with backoff."""
    if ctx.attempt < succeed_on:
        raise ConnectionError(f"dependency unavailable (attempt {ctx.attempt})")
    return f"ok on attempt {ctx.attempt}"


@registry.job("always_fails", queue="demo", max_retries=2)
async def always_fails(ctx: Context, why: str = "bad input") -> None:
    raise ValueError(why)


@registry.job("digest", queue="demo", model="thread")
def digest(ctx: SyncContext, text: str, rounds: int = 1000) -> str:
    """Blocking work in a thread."""
    data = text.encode()
    for _ in range(rounds):
        data = hashlib.sha256(data).digest()
    return data.hex()[:16]


@registry.job("crunch", queue="demo", model="process", timeout=60)
def crunch(ctx: SyncContext, n: int) -> int:
    """CPU-bound work in a child process (its own GIL)."""
    return sum(i * i for i in range(n))


@registry.job("hang", queue="demo", model="process", timeout=1, max_retries=0)
def hang(ctx: SyncContext, seconds: float = 3600) -> None:
    """Never returns in time: the worker kills its process at the timeout."""
    time.sleep(seconds)


@registry.job("noop", queue="default")
async def noop(ctx: Context) -> None:
    return None


@registry.job("die", queue="demo", model="process", max_retries=5)
def die(ctx: SyncContext) -> None:
    """Kills its own process: the attempt fails as a crash; quarantined after N crashes."""
    os._exit(3)
