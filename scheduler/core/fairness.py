"""A queue's dispatch settings: tenant weights, concurrency limits, rate limits, priority aging.

PostgreSQL's `queues` row is the record (migrations 006, 014); Redis holds the copy the claim
script reads (`<base>weights`, `<base>limits`, `<base>rates`, `max_running` / `priority_age_ms` /
`rate` in `<base>config`). Every change writes the record first, then the copy, and a rebuild after a
Redis failover copies them again (`apply`), so a failover never forgets a limit.
"""

from __future__ import annotations

import json
import math
from typing import Any, cast

import msgspec

from fencepost.core import audit, rates, validate
from fencepost.core.errors import InvalidInput, UnknownQueue
from fencepost.core.hot import PageArgs, RescoreArgs
from fencepost.core.record import Session
from fencepost.core.stores import Stores

__all__ = [
    "QueueSettings",
    "apply",
    "describe",
    "due_and_held_sets",
    "due_summary",
    "load",
    "rate_use",
    "refill_held",
    "scan_queue",
    "set_aging",
    "set_key_rate",
    "set_limit",
    "set_max_running",
    "set_rate",
    "set_weight",
]

DEFAULT_AGE_MS = 60_000
"""One priority level is worth this much waiting (lua/includes/common.lua DEFAULT_AGE_MS)."""
MAX_AGE_MS = 30 * 86_400_000
"""Scores are exact doubles: the clock (~µs since 1970) plus 255 levels of this stay < 2^53."""


class QueueSettings(msgspec.Struct, kw_only=True):
    queue: str
    weights: dict[str, float] = {}
    limits: dict[str, int] = {}
    max_running: int | None = None
    priority_age_ms: int | None = None
    rate: str | None = None
    """The queue-wide rate limit, 'N/ms' (None: none)."""
    rates: dict[str, str] = {}
    """Rate key -> the operator's rate, 'N/ms' (replaces the rate its runs declare)."""


async def load(stores: Stores, queue: str, *, conn: Session | None = None) -> QueueSettings:
    row = await stores.db.row("queue_settings", queue, conn=conn)
    if row is None:
        raise UnknownQueue(queue)
    return QueueSettings(queue=queue, weights=_obj(row.weights), limits=_obj(row.limits),
                         max_running=row.max_running, priority_age_ms=row.priority_age_ms,
                         rate=row.rate_limit, rates=_obj(row.rate_limits))


def _obj(v: Any) -> dict[str, Any]:
    return json.loads(v) if isinstance(v, str) else dict(v or {})


async def apply(stores: Stores, queue: str, *, rescore_from_ms: int | None = None) -> QueueSettings:
    """Copy the record into Redis, then give freed slots to held runs, and re-score waiting
    runs when the aging step changed (`rescore_from_ms`: the step their scores were made with).

    The queue's row stays locked (FOR UPDATE) until Redis holds the copy, so two changes
    at once cannot leave Redis with the older one."""
    async with stores.db.transaction() as tx:
        if await tx.row("lock_queue_settings", queue) is None:
            raise UnknownQueue(queue)
        s = await load(stores, queue, conn=tx)
        await _copy(stores, queue, s)
    await refill_held(stores, queue)
    await _recheck_rates(stores, queue)
    if rescore_from_ms is not None:
        await _rescore(stores, queue, rescore_from_ms)
    return s


async def _copy(stores: Stores, queue: str, s: QueueSettings) -> None:
    k = stores.keys(queue)
    pipe = stores.redis.pipeline(transaction=False)  # idempotent full rewrite; any client version
    pipe.delete(k.weights, k.limits, k.rates)
    if s.weights:
        pipe.hset(k.weights, mapping={t: repr(float(w)) for t, w in s.weights.items()})
    if s.limits:
        pipe.hset(k.limits, mapping={key: int(n) for key, n in s.limits.items()})
    if s.rates:
        pipe.hset(k.rates, mapping={key: str(v) for key, v in s.rates.items()})
    for field, value in (("max_running", s.max_running), ("priority_age_ms", s.priority_age_ms),
                         ("rate", s.rate)):
        if value is None:
            pipe.hdel(k.config, field)
        else:
            pipe.hset(k.config, field, value if isinstance(value, str) else int(value))
    await pipe.execute()


async def _recheck_rates(stores: Stores, queue: str, page: int = 1000) -> None:
    """After a rate changed, every key with held runs is due for a look at its next claim (its
    release time was computed with the old rate), and idle workers are woken to make that claim."""
    k, r = stores.keys(queue), stores.redis
    start = 0
    while True:
        names = cast("list[bytes]", await r.zrange(k.rwait, start, start + page - 1))
        if not names:
            break
        await r.zadd(k.rwait, dict.fromkeys(names, 0), xx=True)
        start += page
    if start:
        await r.rpush(k.wake, 1)


async def refill_held(stores: Stores, queue: str, page: int = 200) -> int:
    """Give every free concurrency slot of the queue to a held run (lua/refill_held.lua)."""
    keys, cursor, moved = stores.keys(queue), "0", 0
    while True:
        got = await stores.scripts.refill_held(keys, PageArgs(cursor, page))
        moved += got.count
        cursor = got.cursor
        if cursor == "0":
            return moved


async def _rescore(stores: Stores, queue: str, old_ms: int, page: int = 500) -> int:
    keys, n = stores.keys(queue), 0
    for name in await due_and_held_sets(stores, queue, scan=True):
        suffix, cursor = name[len(keys.base):], "0"
        while True:
            got = await stores.scripts.rescore_due(keys, RescoreArgs(suffix, cursor, page, old_ms))
            n += got.count
            cursor = got.cursor
            if cursor == "0":
                break
    return n


async def due_and_held_sets(stores: Stores, queue: str, *, scan: bool = False) -> list[str]:
    """Every sorted set a PENDING run of the queue can wait in: the default due set, the
    tenants' due sets, and the held sets of concurrency and rate keys. From the registries
    (`tenants`, `heldkeys`, `rwait`); with `scan`, also from a SCAN of the queue's keys, which finds a
    set its registry lost (a rebuild and full drift pass use it; ticks do not)."""
    k, r = stores.keys(queue), stores.redis
    names = {k.due}
    # Stores opens Redis with decode_responses=False: replies are bytes (redis-py types them bytes | str).
    names.update(k.tenant_due(t.decode()) for t in cast("list[bytes]", await r.zrange(k.tenants, 0, -1)))
    names.update(k.held(m.decode()) for m in cast("set[bytes]", await r.smembers(k.heldkeys)))
    names.update(k.rate_held(m.decode()) for m in cast("list[bytes]", await r.zrange(k.rwait, 0, -1)) if m)
    if scan:
        for pattern in ("due:t:*", "held:*", "rheld:*"):
            cursor = 0
            while True:
                cursor, found = await scan_queue(stores, queue, pattern, cursor, 1000)
                names.update(found)
                if cursor == 0:
                    break
    return sorted(names)


async def scan_queue(stores: Stores, queue: str, pattern: str, cursor: int, count: int) -> tuple[int, list[str]]:
    """One SCAN step over the queue's keys matching `base + pattern` (on a cluster, on the
    primary owning the queue's slot, where all of them live)."""
    base = stores.keys(queue).base
    match = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in base) + pattern
    if stores.settings.redis_cluster:
        cluster: Any = stores.redis  # a RedisCluster here (Stores types it as Redis): SCAN answers {node: cursor}
        node = cluster.get_node_from_key(base)
        cursors, names = await cluster.scan(cursor, match=match, count=count, target_nodes=node)
        cursor = int(next(iter(cursors.values()))) if isinstance(cursors, dict) else int(cursors)
    else:
        cursor, names = await stores.redis.scan(cursor, match=match, count=count)
    return int(cursor), [n.decode() if isinstance(n, bytes) else n for n in names]


async def set_weight(stores: Stores, queue: str, tenant: str, weight: float | None, *, actor: str = "client",
                     reason: str = "") -> QueueSettings:
    """Weight of a tenant (None: back to the default, 1). Applies to dispatch from now on."""
    if tenant != "":
        validate.label("tenant", tenant)
    if weight is not None and not (isinstance(weight, (int, float)) and math.isfinite(weight)
                                   and 0.001 <= weight <= 1000):
        raise InvalidInput(f"weight must be between 0.001 and 1000, not {weight}", field="weight")
    await _update(stores, queue, "set_queue_weight", tenant, weight, audit_=(actor, reason, {"weight": weight,
                                                                                  "tenant": tenant}))
    return await apply(stores, queue)


async def set_limit(stores: Stores, queue: str, key: str, limit: int | None, *, actor: str = "client",
                    reason: str = "") -> QueueSettings:
    """Override the limit of one concurrency key (None: back to the runs' declared limit)."""
    validate.label("concurrency_key", key)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000_000):
        raise InvalidInput(f"limit must be a whole number from 1 to 1000000, not {limit!r}", field="limit")
    await _update(stores, queue, "set_queue_limit", key, limit, audit_=(actor, reason, {"limit": limit, "key": key}))
    return await apply(stores, queue)


async def set_max_running(stores: Stores, queue: str, limit: int | None, *, actor: str = "client",
                          reason: str = "") -> QueueSettings:
    """At most this many runs of the queue leased at once, over all workers (None: no limit)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000_000):
        raise InvalidInput(f"max running must be a whole number from 1 to 1000000, not {limit!r}",
                           field="max_running")
    await _update(stores, queue, "set_queue_max_running", limit, audit_=(actor, reason, {"max_running": limit}))
    return await apply(stores, queue)


async def set_rate(stores: Stores, queue: str, rate: str | None, *, actor: str = "client",
                   reason: str = "") -> QueueSettings:
    """At most N runs of the queue start per interval, over all workers: `rate` like '100/1s'
    (fencepost.core.rates; None: no limit)."""
    stored = None if rate is None else rates.parse("rate", rate).stored
    await _update(stores, queue, "set_queue_rate", stored, audit_=(actor, reason, {"rate": stored}))
    return await apply(stores, queue)


async def set_key_rate(stores: Stores, queue: str, key: str, rate: str | None, *, actor: str = "client",
                       reason: str = "") -> QueueSettings:
    """Override the rate of one rate key (None: back to the rate its runs declare)."""
    validate.label("rate_key", key)
    stored = None if rate is None else rates.parse("rate", rate).stored
    await _update(stores, queue, "set_queue_key_rate", key, stored,
                  audit_=(actor, reason, {"rate": stored, "key": key}))
    return await apply(stores, queue)


async def set_aging(stores: Stores, queue: str, seconds: float | None, *, actor: str = "client",
                    reason: str = "") -> QueueSettings:
    """How much waiting one priority level is worth (None: the default, 60 s)."""
    if seconds is not None and not (isinstance(seconds, (int, float)) and math.isfinite(seconds)
                                    and 0.001 <= seconds <= MAX_AGE_MS / 1000):
        raise InvalidInput(f"aging step must be between 0.001 s and {MAX_AGE_MS // 1000} s, not {seconds}",
                           field="aging")
    ms = None if seconds is None else round(seconds * 1000)
    old = (await load(stores, queue)).priority_age_ms or DEFAULT_AGE_MS
    await _update(stores, queue, "set_queue_aging", ms, audit_=(actor, reason, {"aging_ms": ms}))
    return await apply(stores, queue, rescore_from_ms=old)


async def _update(stores: Stores, queue: str, name: str, *args: Any,
                  audit_: tuple[str, str, dict[str, Any]]) -> None:
    """The change and its audit row (actor, address, reason) in one transaction: both or neither."""
    actor, reason, data = audit_
    audit.reason(reason)
    async with stores.db.transaction() as tx:
        row = await stores.db.row(name, queue, *args, conn=tx)
        if row is None:
            raise UnknownQueue(queue)
        await audit.write(stores.db, tx, actor, f"dispatch_{name.removeprefix('set_queue_')}", queue=queue,
                          reason_=reason, data=data)


async def due_summary(stores: Stores, queue: str, *, now: float, max_tenants: int = 200) -> tuple[int, float]:
    """Due runs of the queue over its tenants' due sets, and the age of the oldest tenant
    head (now - run_at, seconds): what the depth gauges and the API's queue list show."""
    k, r = stores.keys(queue), stores.redis
    tenants = [t.decode() for t in cast("list[bytes]", await r.zrange(k.tenants, 0, max_tenants - 1))]
    sets = [k.tenant_due(t) for t in tenants] or [k.due]
    pipe = r.pipeline(transaction=False)
    for z in sets:
        pipe.zcard(z)
        pipe.zrange(z, 0, 0)
    out = await pipe.execute()
    heads = [h[0].decode() for h in out[1::2] if h]
    age = 0.0
    if heads:
        pipe = r.pipeline(transaction=False)
        for h in heads:
            pipe.hget(k.run(h), "run_at")
        times = [int(t) for t in await pipe.execute() if t]
        if times:
            age = max(0.0, now - min(times) / 1000)
    return sum(out[0::2]), age


async def describe(stores: Stores, queue: str) -> dict[str, Any]:
    """Settings plus what Redis holds now: due runs and virtual time per tenant (the first
    100 by virtual time), and leased / held runs per key with an operator's override."""
    s = await load(stores, queue)
    k = stores.keys(queue)
    r = stores.redis
    tenants = []
    for name, vt in cast("list[tuple[bytes, float]]", await r.zrange(k.tenants, 0, 99, withscores=True)):
        t = name.decode()
        z = k.tenant_due(t)
        tenants.append({"tenant": t or "(none)", "due": await r.zcard(z), "virtual_time": round(vt, 3),
                        "weight": s.weights.get(t, 1.0)})
    keys = []
    for key in sorted(s.limits):
        keys.append({"key": key, "limit": s.limits[key], "leased": await r.scard(k.leased(key)),
                     "held": await r.zcard(k.held(key))})
    return {"settings": msgspec.to_builtins(s), "tenants": tenants, "keys": keys,
            "leased": await r.zcard(k.active), "rates": await rate_use(stores, queue, s)}


async def rate_use(stores: Stores, queue: str, s: QueueSettings, max_keys: int = 100) -> list[dict[str, Any]]:
    """Each rate window in play: the queue's ('' key), the keys with an operator's rate and the
    keys with held runs (the first `max_keys`): its rate, starts in the window now (on the Redis
    server's clock, as the claim script counts them) and runs held for it."""
    k, r = stores.keys(queue), stores.redis
    waiting = [m.decode() for m in cast("list[bytes]", await r.zrange(k.rwait, 0, max_keys - 1)) if m]
    sec, usec = await r.time()
    now_ms = int(sec) * 1000 + int(usec) // 1000
    out: list[dict[str, Any]] = []
    for key in ([""] if s.rate else []) + sorted(set(s.rates) | set(waiting))[:max_keys]:
        stored = s.rate if key == "" else s.rates.get(key)
        if stored is None:  # a declared rate: the one its first held run carries
            head = cast("list[bytes]", await r.zrange(k.rate_held(key), 0, 0))
            raw = await r.hget(k.run(head[0].decode()), "rlimit") if head else None
            stored = raw.decode() if isinstance(raw, bytes) else raw
        rate = rates.parse_stored(stored)
        used = 0 if rate is None else await r.zcount(k.rate_window(key), f"({now_ms - rate.ms}", "+inf")
        out.append({"key": key, "rate": None if rate is None else str(rate), "window_ms": rate and rate.ms,
                    "limit": rate and rate.n, "used": used,
                    "held": 0 if key == "" else await r.zcard(k.rate_held(key)),
                    "override": key == "" or key in s.rates})
    return out
