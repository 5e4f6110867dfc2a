"""Workers' identities and operators' stop requests, in Redis.

Each worker rewrites its identity (host, pid, version, queues, concurrency, the runs it holds, its
last claim) in one pipeline per lease-renewal heartbeat, with a TTL: a worker that dies simply ages
out, nothing has to clean up after it. The same round trip reads the worker's stop key, which an
operator sets (`request_stop`, audited in PostgreSQL first) to make it stop claiming, drain and exit.
This is the operator's view; run liveness and reclaiming are the leases' and the pulse's business.
"""

from __future__ import annotations

import functools
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import msgspec

from fencepost.core import audit, validate
from fencepost.core.errors import FencepostError
from fencepost.core.keys import WORKERS_KEY, worker_key, worker_stop_key
from fencepost.core.stores import Stores

__all__ = ["HeldRun", "StopRequest", "UnknownWorker", "WorkerInfo", "forget", "get_worker", "heartbeat", "list_workers",
           "request_stop", "software_version"]

STOP_TTL_S = 86_400
"""A stop request a worker never picked up (it was already gone) lapses after a day."""


class UnknownWorker(FencepostError, LookupError):
    """No live worker has this id (it never registered, or it stopped and aged out)."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(f"no live worker with id {worker_id!r}")
        self.worker_id = worker_id


class HeldRun(msgspec.Struct, frozen=True):
    id: int
    queue: str
    handler: str
    attempt: int


class StopRequest(msgspec.Struct, frozen=True):
    actor: str
    reason: str
    at: float


class WorkerInfo(msgspec.Struct, kw_only=True):
    id: str
    host: str
    pid: int
    version: str
    queues: list[str]
    concurrency: int
    started_at: float
    """Unix seconds, as every time below."""
    seen_at: float
    """Its last heartbeat."""
    claimed: int
    """Runs claimed since it started."""
    last_claim_at: float | None
    running: list[HeldRun]
    stop_requested: StopRequest | None = None


_enc = msgspec.json.Encoder()
_info = msgspec.json.Decoder(WorkerInfo)
_stop = msgspec.json.Decoder(StopRequest)


@functools.cache
def software_version() -> str:
    try:
        return version("fencepost")
    except PackageNotFoundError:
        return "unknown"


async def heartbeat(stores: Stores, info: WorkerInfo, ttl_s: int, redis: Any = None) -> StopRequest | None:
    """Publish the identity (one pipeline: identity, index, stop key); answers a pending stop request.
    REDIS: another client than stores.redis (on Redis Cluster the worker's spare one: a pipeline that
    meets a dead node makes redis-py close every connection of its client, the claims' too)."""
    prefix = stores.settings.prefix
    pipe = (redis or stores.redis).pipeline(transaction=False)
    pipe.set(worker_key(prefix, info.id), _enc.encode(info), ex=ttl_s)
    pipe.zadd(WORKERS_KEY(prefix), {info.id: int(info.seen_at * 1000)})
    pipe.get(worker_stop_key(prefix, info.id))
    *_, stop = await pipe.execute()
    return _stop.decode(stop) if stop else None


async def forget(stores: Stores, worker_id: str) -> None:
    """A worker leaving gracefully: its identity, index entry and any stop request go at once."""
    prefix = stores.settings.prefix
    pipe = stores.redis.pipeline(transaction=False)
    pipe.delete(worker_key(prefix, worker_id), worker_stop_key(prefix, worker_id))
    pipe.zrem(WORKERS_KEY(prefix), worker_id)
    await pipe.execute()


async def list_workers(stores: Stores, *, stale_after_s: float = 3600) -> list[WorkerInfo]:
    """The live workers (identity not expired), by id; index entries of long-gone workers are pruned."""
    prefix = stores.settings.prefix
    r = stores.redis
    await r.zremrangebyscore(WORKERS_KEY(prefix), 0, int((time.time() - stale_after_s) * 1000))
    ids: list[str] = [i.decode() if isinstance(i, bytes) else str(i) for i in await r.zrange(WORKERS_KEY(prefix), 0, -1)]
    if not ids:
        return []
    pipe = r.pipeline(transaction=False)
    for wid in ids:
        pipe.get(worker_key(prefix, wid))
        pipe.get(worker_stop_key(prefix, wid))
    replies = await pipe.execute()
    out = []
    for i in range(0, len(replies), 2):
        raw, stop = replies[i], replies[i + 1]
        if raw:
            w = _info.decode(raw)
            w.stop_requested = _stop.decode(stop) if stop else None
            out.append(w)
    return sorted(out, key=lambda w: w.id)


async def get_worker(stores: Stores, worker_id: str) -> WorkerInfo:
    for w in await list_workers(stores):
        if w.id == worker_id:
            return w
    raise UnknownWorker(worker_id)


async def request_stop(stores: Stores, worker_id: str, *, actor: str, reason: str = "") -> StopRequest:
    """Ask a live worker to stop claiming, drain (its grace period) and exit. Audited first: a request
    without its audit row does not happen; the worker sees it at its next heartbeat."""
    validate.text("name", worker_id)
    audit.reason(reason)
    w = await get_worker(stores, worker_id)
    req = StopRequest(actor=actor, reason=reason, at=time.time())
    async with stores.db.transaction() as tx:
        await audit.write(stores.db, tx, actor, "worker_stop", queue=w.queues[0] if len(w.queues) == 1 else None,
                          target=worker_id, reason_=reason, data={"queues": w.queues, "host": w.host, "pid": w.pid})
    await stores.redis.set(worker_stop_key(stores.settings.prefix, worker_id), _enc.encode(req), ex=STOP_TTL_S)
    return req
