"""Typed reads of the hot store that are not a script: what a queue's gauges count, and the
fixed-window counters of the API (request rate per token, failed logins per address).

Services above the core read Redis through here or through `fencepost.core.hot` (scripts and
`Scripts.peek`), never with redis-py calls of their own (tests/test_layers.py), so every key
they touch comes from `fencepost.core.keys`.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from fencepost.core.keys import Keys, api_authfail_key, api_rate_key
from fencepost.core.rates import parse_stored

__all__ = [
    "NodeAddress", "QueueBacklog", "QueueDepth", "QueueGauges", "Replication", "Window", "authfail_count",
    "authfail_hit", "cluster_owner", "drop_queue", "ping", "promote", "queue_backlog", "queue_depth", "queue_gauges",
    "rate_hit", "replication", "shutdown_nosave", "used_memory",
]


class QueueGauges(msgspec.Struct, frozen=True):
    """One queue's figures from Redis for the reconciler's gauges (docs/observability.md)."""

    delayed: int
    active: int
    budget_exhausted: int
    stale_finish: int
    rate_limited: int
    """Starts deferred by a rate limit (the claim script's counter)."""
    held: int
    """Runs waiting for a concurrency slot, over the first `max_keys` keys with held runs."""
    rate_held: int
    """Runs waiting for a rate window, over the first `max_keys` rate keys that hold some."""
    rate_window_used: int
    """Starts in the queue-wide rate window now, on the Redis server's clock (as claims count them)."""


async def queue_gauges(redis: Any, keys: Keys, *, max_keys: int) -> QueueGauges:
    """Three round trips at most, whatever the queue's size (ZCARD / HMGET / a sample of keys)."""
    pipe = redis.pipeline(transaction=False)
    pipe.zcard(keys.delayed)
    pipe.zcard(keys.active)
    pipe.hmget(keys.stats, "budget_exhausted", "stale_finish", "rate_limited")
    pipe.srandmember(keys.heldkeys, max_keys)
    pipe.zrange(keys.rwait, 0, max_keys - 1)
    pipe.hget(keys.config, "rate")
    pipe.time()
    delayed, active, stats, held_keys, rate_keys, qrate, (sec, usec) = await pipe.execute()
    rate = parse_stored(qrate.decode() if qrate else None)
    pipe = redis.pipeline(transaction=False)
    for k in held_keys or ():
        pipe.zcard(keys.held(k.decode()))
    named = [k for k in rate_keys or () if k]
    for k in named:
        pipe.zcard(keys.rate_held(k.decode()))
    if rate is not None:
        now_ms = int(sec) * 1000 + int(usec) // 1000
        pipe.zcount(keys.rate_window(""), f"({now_ms - rate.ms}", "+inf")
    counts = await pipe.execute() if (held_keys or named or rate is not None) else []
    n_held = len(held_keys or ())
    return QueueGauges(
        delayed=delayed, active=active, budget_exhausted=int(stats[0] or 0), stale_finish=int(stats[1] or 0),
        rate_limited=int(stats[2] or 0), held=sum(counts[:n_held]), rate_held=sum(counts[n_held:n_held + len(named)]),
        rate_window_used=counts[-1] if rate is not None else 0)


class QueueDepth(msgspec.Struct, frozen=True):
    """A queue's runs in Redis now, by sorted set (one pipeline of ZCARDs). `due` counts the default
    tenant's set only: fencepost.core.fairness.due_summary counts every tenant's."""

    due: int
    delayed: int
    """Delayed and retry-waiting runs (due or not)."""
    active: int
    """RUNNING and STOPPING runs (leased)."""

    @property
    def total(self) -> int:
        return self.due + self.delayed + self.active


async def queue_depth(redis: Any, keys: Keys) -> QueueDepth:
    pipe = redis.pipeline(transaction=False)
    pipe.zcard(keys.due)
    pipe.zcard(keys.delayed)
    pipe.zcard(keys.active)
    due, delayed, active = await pipe.execute()
    return QueueDepth(due=due, delayed=delayed, active=active)


class QueueBacklog(msgspec.Struct, frozen=True):
    """A queue's delayed runs split at a moment, and its leased runs (the dashboard's queue page)."""

    overdue: int
    """Delayed or retry-waiting runs whose run_at is at or before the moment: due, not yet moved."""
    scheduled: int
    """Delayed or retry-waiting runs due after the moment."""
    active: int


async def queue_backlog(redis: Any, keys: Keys, at_ms: int) -> QueueBacklog:
    """AT_MS is the caller's display clock (the dashboard's host time): a split for showing, not a decision."""
    pipe = redis.pipeline(transaction=False)
    pipe.zcount(keys.delayed, "-inf", at_ms)
    pipe.zcount(keys.delayed, f"({at_ms}", "+inf")
    pipe.zcard(keys.active)
    overdue, scheduled, active = await pipe.execute()
    return QueueBacklog(overdue=overdue, scheduled=scheduled, active=active)


async def ping(redis: Any) -> None:
    """Raises what redis-py raises when the server does not answer (readiness probes)."""
    await redis.ping()


class Window(msgspec.Struct, frozen=True):
    """A fixed window's count so far and the seconds until it ends."""

    count: int
    retry_after: int


def _window(window_s: int) -> tuple[int, int]:
    now = time.time()  # the API replicas' windows: a skewed host shifts its own window, decides nothing else
    window = int(now // window_s)
    return window, max(1, int((window + 1) * window_s - now) + 1)


async def _hit(redis: Any, key: str, window_s: int) -> int:
    pipe = redis.pipeline(transaction=False)
    pipe.incr(key)
    pipe.expire(key, window_s + 1)
    count, _ = await pipe.execute()
    return int(count)


async def rate_hit(redis: Any, prefix: str, token_id: int, window_s: int) -> Window:
    """Count one request of TOKEN_ID in this window (shared by every API replica)."""
    window, retry = _window(window_s)
    return Window(count=await _hit(redis, api_rate_key(prefix, token_id, window), window_s), retry_after=retry)


async def authfail_hit(redis: Any, prefix: str, addr: str, window_s: int) -> Window:
    """Count one failed authentication from ADDR in this window."""
    window, retry = _window(window_s)
    return Window(count=await _hit(redis, api_authfail_key(prefix, addr, window), window_s), retry_after=retry)


async def authfail_count(redis: Any, prefix: str, addr: str, window_s: int) -> Window:
    """Failed authentications from ADDR so far in this window."""
    window, retry = _window(window_s)
    count = await redis.get(api_authfail_key(prefix, addr, window))
    return Window(count=int(count or 0), retry_after=retry)


# -- fencepost.testing: the test clock and a test prefix's cleanup ------------------------------


async def server_now_ms(redis: Any) -> int:
    """The Redis server's clock (ms): the one clock every script decides on."""
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def shift_delayed(redis: Any, keys: Keys, ms: int) -> None:
    """Bring every delayed and retry-waiting run of a queue MS closer (ZADD XX: a run claimed or
    cancelled meanwhile is not brought back)."""
    waiting = await redis.zrange(keys.delayed, 0, -1, withscores=True)
    if waiting:
        await redis.zadd(keys.delayed, {m: score - ms for m, score in waiting}, xx=True)


async def first_delayed_ms(redis: Any, keys: Keys) -> int | None:
    """run_at (ms) of a queue's earliest delayed or retry-waiting run, if any."""
    top = await redis.zrange(keys.delayed, 0, 0, withscores=True)
    return int(top[0][1]) if top else None


async def queue_busy(redis: Any, keys: Keys, now_ms: int) -> int:
    """Runs of a queue due, running, waiting in a tenant's set or delayed until before NOW_MS (0: idle)."""
    pipe = redis.pipeline(transaction=False)
    pipe.zcard(keys.due)
    pipe.zcard(keys.active)
    pipe.zcard(keys.tenants)
    pipe.zcount(keys.delayed, "-inf", now_ms)
    return sum(await pipe.execute())


async def unlink_prefix(redis: Any, prefix: str) -> int:
    """Remove every key under PREFIX (a test run's own prefix), 500 at a time."""
    keys = [k async for k in redis.scan_iter(match=f"{prefix}:*", count=1000)]
    for i in range(0, len(keys), 500):
        await redis.unlink(*keys[i:i + 500])
    return len(keys)


# -- the load and fault harnesses (fencepost.dev): a queue's removal, one server's figures and fate ----


async def drop_queue(redis: Any, queues_key: str, keys: Keys) -> int:
    """Remove every key of a queue (500 at a time) and its name from the known queues: a load test's
    own queue once measured. Returns the keys removed."""
    found = [k async for k in redis.scan_iter(match=keys.base + "*", count=1000)]
    for i in range(0, len(found), 500):
        await redis.unlink(*found[i:i + 500])
    await redis.srem(queues_key, keys.queue)
    return len(found)


async def used_memory(redis: Any) -> int:
    """The server's used_memory (INFO memory), bytes."""
    return int((await redis.info("memory"))["used_memory"])


class Replication(msgspec.Struct, frozen=True):
    """A server's replication offsets (INFO replication), bytes of the replication stream."""

    sent: int
    """master_repl_offset: what it wrote as a primary (0 when it never was one)."""
    received: int
    """slave_repl_offset: what it took from its primary (0 when it is not a replica)."""
    link_up: bool
    """A replica's link to its primary is up (master_link_status); False on a primary."""


async def replication(redis: Any) -> Replication:
    info = await redis.info("replication")
    return Replication(sent=int(info.get("master_repl_offset", 0)), received=int(info.get("slave_repl_offset", 0)),
                       link_up=info.get("master_link_status") == "up")


async def promote(redis: Any) -> None:
    """REPLICAOF NO ONE: the replica becomes a primary (the fault harness's failover)."""
    await redis.execute_command("REPLICAOF", "NO", "ONE")


async def shutdown_nosave(redis: Any) -> None:
    """SHUTDOWN NOSAVE: the server dies as in a crash. The connection drops as it goes: redis-py's
    ConnectionError (or an OSError) is the expected answer and is the caller's to ignore."""
    await redis.execute_command("SHUTDOWN", "NOSAVE")


class NodeAddress(msgspec.Struct, frozen=True):
    host: str
    port: int


async def cluster_owner(redis: Any, tag: str) -> NodeAddress | None:
    """The Redis Cluster primary owning the hash slot of TAG (a queue's keys hash on their tag, the
    queue's name: pass the name). None when no slot range holds it."""
    slot = int(await redis.execute_command("CLUSTER", "KEYSLOT", tag))
    for lo, hi, owner, *_ in await redis.execute_command("CLUSTER", "SLOTS"):
        if int(lo) <= slot <= int(hi):
            host = owner[0].decode() if isinstance(owner[0], bytes) else str(owner[0])
            return NodeAddress(host=host, port=int(owner[1]))
    return None
