"""The worker's reads and writes of the hot store that are not a script: its idle wait (the wake
list, the earliest delayed run), a burst worker's emptiness check, a queue's shared retry budget,
a throttle, a cluster probe and the checkpoint's ownership check.

The worker (worker/) reaches Redis only through here and `fencepost.core.hot` (tests/test_layers.py),
so every key it touches comes from `fencepost.core.keys`. Each function takes the client to use:
the worker's main one, or on Redis Cluster its spare one (Stores.spare_redis).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from fencepost.core.keys import Keys

__all__ = ["DueAt", "RetryBudget", "RunHolder", "due_after", "probe_queue", "queues_empty", "ring_wake",
           "run_holder", "seed_retry_budget", "throttle_queue", "wait_wake"]


class RetryBudget(msgspec.Struct, frozen=True):
    """A queue's retry budget as its config hash holds it (shared by the queue's workers). None: unset."""

    budget_ratio: float | None
    budget_floor: float | None
    budget_window_ms: float | None


class DueAt(msgspec.Struct, frozen=True):
    """The earliest delayed or retry-wait run (or rate window) of the queues asked, on the server's clock."""

    at_ms: int
    queue: str


class RunHolder(msgspec.Struct, frozen=True):
    """Who holds a run now: its state, fencing token and pending control verb (None where unset)."""

    state: str | None
    token: int | None
    ctl: str | None


def _text(v: bytes | str | None) -> str | None:
    return v.decode() if isinstance(v, bytes) else v


async def seed_retry_budget(redis: Any, keys: Keys, mine: dict[str, str]) -> RetryBudget:
    """Fill in the settings the queue has not got yet (HSETNX: never overwrites another worker's),
    then read what it keeps: one pipeline. `mine` maps RetryBudget's field names to stored values."""
    pipe = redis.pipeline(transaction=False)
    for name, value in mine.items():
        pipe.hsetnx(keys.config, name, value)
    fields = RetryBudget.__struct_fields__
    pipe.hmget(keys.config, *fields)
    live = (await pipe.execute())[-1]
    return RetryBudget(*(None if v is None else float(v) for v in live))


async def due_after(redis: Any, queues: Sequence[Keys], seen_ms: Sequence[int]) -> DueAt | None:
    """The earliest delayed or retry-wait entry of `queues` scored after its queue's `seen_ms`
    (the delayed set's run times, the rate-wait set's window ends): one pipelined read."""
    pipe = redis.pipeline(transaction=False)
    for keys, seen in zip(queues, seen_ms):
        for z in (keys.delayed, keys.rwait):
            pipe.zrangebyscore(z, f"({seen}", "+inf", start=0, num=1, withscores=True)
    best: DueAt | None = None
    heads = await pipe.execute()
    for i, keys in enumerate(queues):
        for head in heads[2 * i:2 * i + 2]:
            if head and (best is None or head[0][1] < best.at_ms):
                best = DueAt(int(head[0][1]), keys.queue)
    return best


async def ring_wake(redis: Any, keys: Keys) -> int:
    """Push the queue's wake list (an idle worker blocked on it claims now): the list's length."""
    n: int = await redis.rpush(keys.wake, 1)
    return n


async def wait_wake(redis: Any, queues: Sequence[Keys], timeout_s: float) -> bool:
    """Block on the queues' wake lists (one BLPOP: on Redis Cluster pass one queue, their keys live in
    different slots) until one is pushed (True) or `timeout_s` passes (False)."""
    return await redis.blpop([k.wake for k in queues], timeout=timeout_s) is not None


async def queues_empty(redis: Any, queues: Sequence[Keys]) -> bool:
    """Whether no run is due, delayed or leased in any of the queues (a burst worker's exit test)."""
    pipe = redis.pipeline(transaction=False)
    for k in queues:
        pipe.zcard(k.due)
        pipe.zcard(k.delayed)
        pipe.zcard(k.active)
    return not any(await pipe.execute())


async def throttle_queue(redis: Any, keys: Keys, limit: int, for_ms: int) -> None:
    """Cap every worker's claims on the queue at `limit` for `for_ms` (a dependency said slow down)."""
    await redis.set(keys.throttle, limit, px=for_ms)


async def probe_queue(redis: Any, keys: Keys) -> bool:
    """One EXISTS of the queue's due set: raises while the node owning the queue's slot fails."""
    return bool(await redis.exists(keys.due))


async def run_holder(redis: Any, keys: Keys, run_id: int) -> RunHolder:
    """The run's state, token and control verb (one HMGET of its hash)."""
    state, token, ctl = await redis.hmget(keys.run(run_id), "state", "token", "ctl")
    return RunHolder(_text(state), None if token is None else int(token), _text(ctl) or None)
