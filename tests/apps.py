"""Handlers the tests run in real worker processes (`--app tests.apps:registry`)."""

from __future__ import annotations

import asyncio
import os
import time

from scheduler.registry import Registry

registry = Registry()


@registry.job("t.noop", queue="tq")
async def noop(ctx) -> None:
    return None


@registry.job("t.echo", queue="tq")
async def echo(ctx, value):
    return value


@registry.job("t.sleep", queue="tq", max_retries=3, timeout=60)
async def sleep(ctx, seconds: float, only_attempt: int | None = None) -> int:
    """Sleeps (only on attempt `only_attempt` when given), then returns the attempt."""
    if only_attempt is None or ctx.attempt == only_attempt:
        await asyncio.sleep(seconds)
    return ctx.attempt


@registry.job("t.fail", queue="tq", max_retries=3)
async def fail(ctx) -> None:
    raise ConnectionError(f"always failing, attempt {ctx.attempt}")


@registry.job("t.hang", queue="tq", model="process", timeout=2, max_retries=0)
def hang(ctx) -> None:
    time.sleep(3600)


@registry.job("t.spin", queue="tq", model="process", timeout=30)
def spin(ctx, n: int) -> int:
    return sum(range(n))


@registry.job("t.die", queue="tq", model="process", max_retries=10)
def die(ctx) -> None:
    os._exit(7)


@registry.job("t.block", queue="tq", model="thread", timeout=1, max_retries=0)
def block(ctx, seconds: float) -> str:
    time.sleep(seconds)
    return "late"
