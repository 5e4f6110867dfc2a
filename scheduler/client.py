"""The producer's client: durable submit (PostgreSQL first, then Redis), wait, inspect."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import asyncpg
import msgspec

from fencepost.control import ControlMixin
from fencepost.core.config import Settings
from fencepost.core.errors import (
    InvalidInput,
    PayloadTooLarge,
    RedisUnavailable,
    UnknownHandler,
    UnknownRun,
    WaitTimeout,
)
from fencepost.core.hot import StampArgs
from fencepost.core.keys import valid_queue_name
from fencepost.core.models import JobSpec, Outcome, RunRow, Submit, decode_result, encode_payload, run_columns
from fencepost.core.record import Conn, store_definitions
from fencepost.core.registry import Handler, Registry
from fencepost.core.states import RESTING, Status
from fencepost.core.stores import Stores
from fencepost.core.tracing import new_traceparent, traceparent_var, valid_traceparent
from fencepost.workflows import WorkflowMixin

__all__ = ["Client", "SyncClient"]

log = logging.getLogger("fencepost.client")

T = TypeVar("T")
_UTC = UTC


_LABEL_RE = re.compile(r"[^\s{}]{1,128}")  # fullmatch: a trailing newline is not a new tenant


def _concurrency(spec: JobSpec, req: Submit) -> tuple[str | None, int | None]:
    """The run's concurrency key and limit: the submit's own, else `handler:<argument value>`
    with the handler's declared limit."""
    key = req.concurrency_key
    if key is None and spec.concurrency_key is not None:
        name, pos = spec.concurrency_key, spec.concurrency_arg
        if name in req.kwargs:
            value = req.kwargs[name]
        elif pos is not None and pos < len(req.args):
            value = req.args[pos]
        else:
            raise InvalidInput(f"{spec.name} limits concurrency by its argument {name!r}, which this submit "
                               "does not give", field="kwargs")
        key = f"{spec.name}:{value}"
    limit = req.concurrency_limit if req.concurrency_limit is not None else spec.concurrency_limit
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000_000):
        raise InvalidInput(f"concurrency_limit must be a whole number from 1 to 1000000, not {limit!r}",
                           field="concurrency_limit")
    if key is None:
        if req.concurrency_limit is not None:
            raise InvalidInput("concurrency_limit needs a concurrency_key", field="concurrency_limit")
        return None, None
    if not isinstance(key, str) or not _LABEL_RE.fullmatch(key):
        raise InvalidInput(f"concurrency key {key!r} must be 1-128 characters without spaces or braces",
                           field="concurrency_key")
    if limit is None:
        raise InvalidInput(f"concurrency key {key!r} needs a concurrency_limit",
                           field="concurrency_limit")
    return key, limit


def _spec(row: Any) -> JobSpec:
    data = dict(row)
    options = data.pop("options", None) or {}
    if isinstance(options, str):
        options = json.loads(options)
    return msgspec.convert({**data, **options}, JobSpec)


class Client(ControlMixin, WorkflowMixin):
    """Async client. A submit returns only after PostgreSQL committed the run."""

    def __init__(self, redis_url: str | None = None, database_url: str | None = None, *,
                 settings: Settings | None = None, actor: str = "client") -> None:
        self.settings = settings or Settings.from_env(redis_url=redis_url, database_url=database_url)
        self.stores = Stores(self.settings)
        self.actor = actor
        self.registry: Registry | None = None
        self._defs: dict[str, JobSpec] = {}

    async def connect(self) -> Client:
        await self.stores.connect()
        return self

    async def close(self) -> None:
        await self.stores.close()

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- definitions ---------------------------------------------------------------------------
    async def register(self, registry: Registry | Iterable[JobSpec]) -> None:
        """Store handler declarations so submits can be validated without a worker running."""
        specs = registry.specs() if isinstance(registry, Registry) else list(registry)
        if isinstance(registry, Registry):
            self.registry = registry
        await store_definitions(self.stores.db, specs)
        self._defs.update({s.name: s for s in specs})

    async def _load_definitions(self, names: set[str]) -> None:
        """Refresh the cached declarations once if a handler is not known yet."""
        if names - self._defs.keys():
            rows = await self.stores.db.fetch("definitions")
            self._defs = {r["name"]: _spec(r) for r in rows}
            for name in sorted(names - self._defs.keys()):
                raise UnknownHandler(name)

    # -- submit --------------------------------------------------------------------------------
    async def submit(self, handler: str | Handler, *args: Any, kwargs: dict[str, Any] | None = None,
                     queue: str | None = None, priority: int | None = None, run_at: datetime | None = None,
                     delay: float | None = None, timeout: float | None = None, max_retries: int | None = None,
                     idempotency_key: str | None = None, trace: str | None = None, tenant: str | None = None,
                     concurrency_key: str | None = None, concurrency_limit: int | None = None,
                     connection: asyncpg.Connection | None = None) -> int:
        name = handler.name if isinstance(handler, Handler) else handler
        req = Submit(handler=name, args=args, kwargs=kwargs or {}, queue=queue, priority=priority, run_at=run_at,
                     delay=delay, timeout=timeout, max_retries=max_retries, idempotency_key=idempotency_key,
                     trace=trace, tenant=tenant, concurrency_key=concurrency_key,
                     concurrency_limit=concurrency_limit)
        return (await self.submit_many([req], connection=connection))[0]

    async def submit_many(self, requests: Sequence[Submit], *, connection: asyncpg.Connection | None = None) -> list[int]:
        """Submit a batch: one round trip to PostgreSQL, then one Lua call per queue.

        With `connection`, the runs are written inside the caller's transaction (an outbox):
        they exist if and only if it commits, and the reconciler moves them to Redis on commit.
        Returns run ids in request order; an existing idempotency key yields the existing run.
        """
        if not requests:
            return []
        # Validate everything before writing anything: bad input changes nothing.
        await self._load_definitions({r.handler for r in requests})
        now = datetime.now(_UTC)
        outbox = connection is not None
        rows = [self._validated(r, now, outbox=outbox) for r in requests]
        if connection is None and len(requests) > self.chunk:
            return await self._submit_pipelined(requests, rows)
        ids, created, new_queues = await self._insert(requests, rows, connection)
        if connection is None:
            await self._stamp_new_queues(new_queues)
            await self._enqueue(created, ids, rows)
        return ids

    chunk = 2000
    """Large batches are split so chunk k reaches Redis while chunk k+1 is being committed."""

    async def _submit_pipelined(self, requests: Sequence[Submit], rows: list[RunRow]) -> list[int]:
        """Chunks go through PostgreSQL then Redis, `self.parallel` at a time, so a chunk's
        enqueue overlaps the next chunk's commit. (A store failing mid-batch leaves the chunks
        committed so far: resubmitting with idempotency keys completes the batch exactly once.)"""
        gate = asyncio.Semaphore(self.parallel)

        async def one(part: slice) -> list[int]:
            async with gate:
                part_ids, created, new_queues = await self._insert(requests[part], rows[part], None)
                await self._stamp_new_queues(new_queues)
            await self._enqueue(created, part_ids, rows[part])
            return part_ids

        parts = await asyncio.gather(*(one(slice(i, i + self.chunk)) for i in range(0, len(requests), self.chunk)))
        return [run_id for part in parts for run_id in part]

    parallel = 2
    """Chunks in flight to PostgreSQL at once."""

    async def _insert(self, requests: Sequence[Submit], rows_in: Sequence[RunRow],
                      connection: Conn | None
                      ) -> tuple[list[int], list[int], dict[str, int]]:
        """One round trip to PostgreSQL for a batch of validated rows: (run ids in request order,
        indexes of the rows this call created, queues it created with their epochs)."""
        db = self.stores.db
        rows = await db.fetch("insert_runs", *run_columns(rows_in), self.actor, conn=connection)
        ids: list[int | None] = [None] * len(requests)
        created: list[int] = []
        new_queues: dict[str, int] = {}
        for r in rows:
            if r["ord"] is None:
                new_queues[r["queue"]] = r["epoch"]
            elif r["created"]:
                ids[r["ord"] - 1] = r["id"]
                created.append(r["ord"] - 1)
        missing = [i for i, v in enumerate(ids) if v is None]
        if missing:
            keys = [requests[i].idempotency_key for i in missing]
            found = {r["idempotency_key"]: r["id"] for r in
                     await db.fetch("runs_by_idempotency_key", keys, conn=connection)}
            for i in missing:
                ids[i] = found.get(requests[i].idempotency_key)
                if ids[i] is None:  # a concurrent submit with this key has not committed yet
                    raise InvalidInput(f"idempotency key {requests[i].idempotency_key!r} is being "
                                       "submitted concurrently and is not committed yet; retry", field="idempotency_key")
        return ids, created, new_queues  # type: ignore[return-value]

    async def _enqueue(self, created: list[int], ids: list[int], rows: Sequence[RunRow]) -> None:
        """The created rows to Redis, one enqueue_runs call per queue."""
        by_queue: dict[str, list[RunRow]] = defaultdict(list)
        for i in created:
            row = rows[i]
            by_queue[row.queue].append(msgspec.structs.replace(row, id=ids[i]))
        for queue, batch in by_queue.items():
            try:
                await self.stores.scripts.enqueue_runs(self.stores.keys(queue), batch)
            except RedisUnavailable as exc:
                # PostgreSQL committed these runs, so the submit stands (failing it would invite a
                # duplicate resubmit); the reconciler's drift repair enqueues them when Redis is back.
                log.warning("submitted %d runs to %s but Redis refused them for now (%s); the reconciler "
                            "will enqueue them", len(batch), queue, exc, extra={"event": "enqueue_deferred"})

    async def _stamp_new_queues(self, new_queues: dict[str, int]) -> None:
        """A queue this submit created has no history to lose, so its creator may stamp it."""
        if not new_queues:
            return
        for queue, epoch in new_queues.items():
            await self.stores.scripts.stamp_queue(self.stores.keys(queue), StampArgs(epoch, force=0))
        await self.stores.redis.sadd(self.stores.queues_key, *new_queues)

    def _validated(self, req: Submit, now: datetime, *, outbox: bool) -> RunRow:
        spec = self._defs[req.handler]
        queue = req.queue or spec.queue
        if not valid_queue_name(queue):
            raise InvalidInput(f"queue name {queue!r} must be 1-64 of letters, digits, '_', '-', '.'", field="queue")
        priority = spec.priority if req.priority is None else req.priority
        if not 0 <= priority <= 255:
            raise InvalidInput(f"priority {priority} is outside 0..255", field="priority")
        timeout = spec.timeout_s if req.timeout is None else float(req.timeout)
        if not timeout > 0:
            raise InvalidInput(f"timeout must be positive, not {timeout}", field="timeout")
        retries = spec.max_retries if req.max_retries is None else req.max_retries
        if retries < 0:
            raise InvalidInput(f"max_retries must be >= 0, not {retries}", field="max_retries")
        if req.run_at is not None and req.delay is not None:
            raise InvalidInput("give run_at or delay, not both", field="run_at")
        run_at = now
        if req.run_at is not None:
            if req.run_at.tzinfo is None:
                raise InvalidInput("run_at must be timezone-aware", field="run_at")
            run_at = req.run_at
        elif req.delay is not None:
            if req.delay < 0:
                raise InvalidInput(f"delay must be >= 0, not {req.delay}", field="delay")
            run_at = now + timedelta(seconds=req.delay)
        try:
            payload = encode_payload(tuple(req.args), dict(req.kwargs))
        except (TypeError, msgspec.EncodeError) as exc:
            raise InvalidInput(f"arguments cannot be encoded: {exc}", field="args") from exc
        if len(payload) > self.settings.max_payload_bytes:
            raise PayloadTooLarge(len(payload), self.settings.max_payload_bytes)
        trace = req.trace or traceparent_var.get() or new_traceparent()
        if req.trace is not None and not valid_traceparent(req.trace):
            raise InvalidInput(f"trace must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), not {req.trace!r}",
                               field="trace")
        tenant = req.tenant or ""
        if tenant and (not isinstance(tenant, str) or not _LABEL_RE.fullmatch(tenant)):
            raise InvalidInput(f"tenant {tenant!r} must be 1-128 characters without spaces or braces", field="tenant")
        ckey, climit = _concurrency(spec, req)
        return RunRow(handler=spec.name, queue=queue, priority=priority, payload=payload, run_at=run_at,
                      max_retries=retries, timeout_s=timeout, idempotency_key=req.idempotency_key, trace_id=trace,
                      status=Status.PENDING.value, outbox=outbox, tenant=tenant, concurrency_key=ckey,
                      concurrency_limit=climit)

    # -- read ----------------------------------------------------------------------------------
    async def get(self, run_id: int) -> dict[str, Any]:
        row = await self.stores.db.fetchrow("get_run", run_id)
        if row is None:
            raise UnknownRun(run_id)
        return dict(row)

    async def wait(self, run_id: int, timeout: float | None = None) -> Outcome:
        """Wait until the run is terminal, PAUSED or STOPPED; return its state and decoded result.

        Polls the run's Redis hash (the hot state, ahead of PostgreSQL's projection) and
        reads PostgreSQL only when Redis no longer holds the run (recorded and expired).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        resting = {s.value.encode() for s in RESTING}
        run = await self.get(run_id)
        key = self.stores.keys(run["queue"]).run(run_id)
        delay = 0.005
        while True:
            state, result, error, eclass = await self.stores.redis.hmget(key, "state", "result", "error", "error_class")
            if state in resting:
                return Outcome(run_id, state.decode(), decode_result(result),
                               error.decode() if error else None, eclass.decode() if eclass else None)
            if state is None:
                run = await self.get(run_id)
                if run["status"] in RESTING:
                    return Outcome(run_id, run["status"], decode_result(run["result"]), run["last_error"],
                                   run["last_error_class"])
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(run_id, state.decode() if state else run["status"])
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    async def list_runs(self, *, queue: str | None = None, status: str | None = None,
                        handler: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        if status is not None and status not in Status.__members__:
            raise InvalidInput(f"unknown status {status!r}; one of {', '.join(Status)}", field="status")
        return [dict(r) for r in await self.stores.db.fetch("list_runs", queue, status, handler, limit)]

    async def dead_letter(self, *, queue: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.stores.db.fetch("dead_letter", queue, limit)]

    async def events(self, run_id: int) -> list[dict[str, Any]]:
        await self.get(run_id)
        return [dict(r) for r in await self.stores.db.fetch("run_events", run_id)]

    async def attempts(self, run_id: int) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.stores.db.fetch("run_attempts", run_id)]


class SyncClient:
    """The same client for plain scripts: a private event loop on a background thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fencepost-client", daemon=True)
        self._thread.start()
        self._client = Client(*args, **kwargs)
        self._call(self._client.connect)

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), self._loop).result()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        attr = getattr(self._client, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr
        return lambda *a, **kw: self._call(attr, *a, **kw)

    def close(self) -> None:
        self._call(self._client.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
