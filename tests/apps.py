"""Handlers the tests run in real worker processes (`--app tests.apps:registry`)."""

from __future__ import annotations

import asyncio
import os
import time

from fencepost.core.registry import Registry

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


# -- checkpointed and controllable jobs (operator commands) ---------------------------------------
import asyncpg  # noqa: E402


@registry.job("t.items", queue="tq", max_retries=5, timeout=300, version=1)
async def items(ctx, n: int, every: int, dsn: str, delay: float = 0.0) -> int:
    """Processes items n in order, one row per item keyed by ctx.op_key (so tests can count
    duplicates), checkpointing every `every` items after the rows are committed."""
    conn = await asyncpg.connect(dsn)
    try:
        start = (ctx.checkpoint_data or {}).get("next", 0)
        for i in range(start, n):
            await conn.execute("INSERT INTO processed_items (op_key, run_id, attempt) VALUES ($1, $2, $3)",
                               ctx.op_key(i), ctx.run_id, ctx.attempt)
            if (i + 1) % every == 0:
                await ctx.checkpoint({"next": i + 1}, processed=i + 1)
            if delay:
                await asyncio.sleep(delay)
        return n
    finally:
        await conn.close()


@registry.job("t.items_sync", queue="tq", model="thread", max_retries=5, timeout=300)
def items_sync(ctx, n: int, every: int, delay: float = 0.0) -> int:
    """The same loop for a thread handler: checkpoint() blocks until durable."""
    start = (ctx.checkpoint_data or {}).get("next", 0)
    for i in range(start, n):
        if (i + 1) % every == 0:
            ctx.checkpoint({"next": i + 1}, processed=i + 1)
        time.sleep(delay)
    return n


@registry.job("t.stubborn", queue="tq", model="process", timeout=300, stop_grace=1, max_retries=0)
def stubborn(ctx) -> None:
    """Ignores stop requests: never checkpoints, never polls."""
    time.sleep(3600)


@registry.job("t.effects", queue="tq", side_effects=True, compensate="t.compensate", timeout=300)
async def effects(ctx, seconds: float = 60) -> None:
    """Irreversible side effects; checkpoints so it can be stopped at a boundary."""
    for i in range(int(seconds * 10)):
        await asyncio.sleep(0.1)
        await ctx.checkpoint({"i": i})


@registry.job("t.compensate", queue="tq")
async def compensate(ctx, cancelled_run: int) -> int:
    return cancelled_run


# -- error classes, circuit breakers, retry budgets, tracing (tests/test_errors.py, issue 6) ------
from fencepost.core.errors import InvalidJobInput, PolicyViolation, RateLimited, SideEffectFailed, Transient  # noqa: E402

DEPENDENCY: dict = {"up": False, "calls": []}
"""A fake downstream service for in-process workers only: tests flip `up` to simulate an
outage and its recovery; `calls` lists the run ids that reached the handler."""


@registry.job("t.err.transient", queue="tq", max_retries=2, owner="team-errors")
async def err_transient(ctx) -> None:
    raise Transient(f"dependency timed out (attempt {ctx.attempt})")


@registry.job("t.err.rate_limited", queue="tq", max_retries=3, owner="team-errors")
async def err_rate_limited(ctx, retry_after: float) -> int:
    if ctx.attempt == 1:
        raise RateLimited("429 Too Many Requests", retry_after=retry_after)
    return ctx.attempt


@registry.job("t.err.invalid", queue="tq", max_retries=5, owner="team-errors")
async def err_invalid(ctx) -> None:
    raise InvalidJobInput("amount must be positive")


@registry.job("t.err.side_effect", queue="tq", max_retries=5, side_effects=True, owner="team-errors")
async def err_side_effect(ctx) -> int:
    """The charge may or may not have gone out on attempt 1; later attempts succeed."""
    if ctx.attempt == 1:
        raise SideEffectFailed("charge sent, connection reset before the reply")
    return ctx.attempt


@registry.job("t.err.policy", queue="tq", max_retries=5, owner="team-errors")
async def err_policy(ctx) -> None:
    raise PolicyViolation("token lacks scope payments:write")


@registry.job("t.err.unknown", queue="tq", max_retries=1, owner="team-errors")
async def err_unknown(ctx) -> None:
    raise ZeroDivisionError("an exception nobody classified")


@registry.job("t.err.mapped", queue="tq", max_retries=5, owner="team-errors",
              errors={KeyError: "invalid_input", TimeoutError: "transient"})
async def err_mapped(ctx, key: str) -> None:
    return {}[key]  # KeyError: mapped to invalid_input by errors=


@registry.job("t.err.proc_rate_limited", queue="tq", model="process", max_retries=3, timeout=30, owner="team-errors")
def err_proc_rate_limited(ctx, retry_after: float) -> int:
    if ctx.attempt == 1:
        raise RateLimited("429 from a process job", retry_after=retry_after)
    return ctx.attempt


@registry.job("t.err.dependency", queue="tq", max_retries=8, depends_on_service="payments-api", owner="team-errors")
async def err_dependency(ctx) -> int:
    DEPENDENCY["calls"].append(ctx.run_id)
    if not DEPENDENCY["up"]:
        raise Transient("payments-api: 503 Service Unavailable")
    return ctx.attempt


@registry.job("t.err.trace", queue="tq", owner="team-errors")
async def err_trace(ctx, redis_url: str, database_url: str, prefix: str) -> dict:
    """Submits a child run from inside the job: it must carry this run's trace."""
    from fencepost.client import Client
    from fencepost.core.config import Settings

    async with Client(settings=Settings(redis_url=redis_url, database_url=database_url, prefix=prefix)) as c:
        child = await c.submit("t.noop")
    ctx.log.info("submitted child run %s", child)
    return {"trace": ctx.trace, "child": child}


@registry.job("t.export", queue="tq", concurrency_key="customer", concurrency_limit=5, max_retries=5)
async def export(ctx, customer: str, seconds: float = 0.2) -> str:
    """At most 5 exports per customer at once (the claim script enforces it)."""
    await asyncio.sleep(seconds)
    return customer


@registry.job("t.rated", queue="tq", rate_key="account", rate_limit="3/400ms", max_retries=0)
async def rated(ctx, account: str, n: int = 0) -> int:
    """At most 3 starts per account in any 400 ms, over all workers (the claim script enforces it)."""
    return n
