"""The producer's client: durable submit (PostgreSQL first, then Redis), wait, inspect."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

import msgspec

from fencepost.control import COMMANDS, ControlMixin
from fencepost.core import rates, validate
from fencepost.core import workers as fleet
from fencepost.core.config import Settings
from fencepost.core.errors import (
    DatabaseUnavailable,
    FencepostError,
    IdempotencyConflict,
    InvalidInput,
    PayloadTooLarge,
    RedisUnavailable,
    StoreUnavailable,
    SubmitInDoubt,
    UnknownHandler,
    UnknownRun,
    WaitTimeout,
)
from fencepost.core.models import JobSpec, Outcome, RunRow, Submit, decode_result, encode_payload, run_columns
from fencepost.core.queues import check_queue_name, declare_queues, require_queue, stamp_created
from fencepost.core.record import REFUSED, Conn, store_definitions
from fencepost.core.registry import Handler, Registry
from fencepost.core.schedules import ScheduleSpec
from fencepost.core.states import DEAD, RESTING, Status
from fencepost.core.stores import Stores
from fencepost.core.tracing import submit_traceparent, submit_tracer, valid_traceparent
from fencepost.core.views import (
    Attempt,
    Checkpoint,
    Event,
    QueueStats,
    RecorderSilence,
    Reply,
    Run,
    RunProgress,
    RunRecord,
    RunSummary,
    live_runs,
    live_summaries,
    queue_stats,
    recorder_silence,
    run_view,
    status_filter,
    view,
)
from fencepost.core.workers import WorkerInfo
from fencepost.schedules import Schedules, ScheduleUpdate
from fencepost.workflows import RunHandle, SyncRunHandle, WorkflowMixin

__all__ = ["Client", "SyncClient", "idempotency_scope", "request_fingerprint"]

log = logging.getLogger("fencepost.client")

T = TypeVar("T")
_UTC = UTC
_PENDING = Status.PENDING.value  # an Enum member's .value is a descriptor call: ~0.5 us per run


def _argument_key(spec: JobSpec, req: Submit, name: str, pos: int | None, what: str) -> str:
    """`handler:<value of the declared argument>`, the key a handler's declared limit counts by."""
    if name in req.kwargs:
        value = req.kwargs[name]
    elif pos is not None and pos < len(req.args):
        value = req.args[pos]
    else:
        raise InvalidInput(f"{spec.name} limits {what} by its argument {name!r}, which this submit "
                           "does not give", field="kwargs")
    return f"{spec.name}:{value}"


def _concurrency(spec: JobSpec, req: Submit) -> tuple[str | None, int | None]:
    """The run's concurrency key and limit: the submit's own, else `handler:<argument value>`
    with the handler's declared limit."""
    key = req.concurrency_key
    if key is None and spec.concurrency_key is not None:
        key = _argument_key(spec, req, spec.concurrency_key, spec.concurrency_arg, "concurrency")
    limit = req.concurrency_limit if req.concurrency_limit is not None else spec.concurrency_limit
    if limit is not None:
        validate.integer("concurrency_limit", limit)
    if key is None:
        if req.concurrency_limit is not None:
            raise InvalidInput("concurrency_limit needs a concurrency_key", field="concurrency_limit")
        return None, None
    validate.label("concurrency_key", key)
    if limit is None:
        raise InvalidInput(f"concurrency key {key!r} needs a concurrency_limit",
                           field="concurrency_limit")
    return key, limit


def _rate(spec: JobSpec, req: Submit) -> tuple[str | None, str | None]:
    """The run's rate key and rate ('N/ms'): the submit's own, else `handler:<argument value>` with
    the handler's declared rate."""
    key = req.rate_key
    if key is None and spec.rate_key == "":
        key = spec.name  # a rate declared without a key argument: the handler's own
    elif key is None and spec.rate_key is not None:
        key = _argument_key(spec, req, spec.rate_key, spec.rate_arg, "its rate")
    if key is None:
        if req.rate_limit is not None:
            raise InvalidInput("rate_limit needs a rate_key", field="rate_limit")
        return None, None
    validate.label("rate_key", key)
    if req.rate_limit is not None:  # a submit's is spelt like '100/1s', as on the CLI and the API
        return key, rates.parse("rate_limit", req.rate_limit).stored
    if spec.rate_limit is None:
        raise InvalidInput(f"rate key {key!r} needs a rate_limit", field="rate_limit")
    # a spec holds the canonical 'N/ms' (a definition row from an older release may still be spelt)
    return key, (rates.parse_stored(spec.rate_limit) or rates.parse("rate_limit", spec.rate_limit)).stored


def _inserted(rows: Sequence[Any], n: int) -> tuple[list[int | None], list[int], dict[str, int]]:
    """insert_runs' answer: ids in request order (None: not created), created indexes, new queues."""
    ids: list[int | None] = [None] * n
    created: list[int] = []
    new_queues: dict[str, int] = {}
    for r in rows:
        if r["ord"] is None:
            new_queues[r["queue"]] = r["epoch"]
        elif r["created"]:
            ids[r["ord"] - 1] = r["id"]
            created.append(r["ord"] - 1)
    return ids, created, new_queues


_PER_RUN = (RunRow.__struct_fields__.index("payload"), RunRow.__struct_fields__.index("trace_id"))
_FOLDED = tuple(RunRow.__struct_fields__.index(f) for f in (
    "handler", "queue", "priority", "run_at", "max_retries", "timeout_s", "status", "workflow_id", "tenant",
    "concurrency_key", "concurrency_limit", "rate_key", "rate_limit"))


def _fresh_columns(rows: Sequence[RunRow]) -> list[Any]:
    """insert_runs_fresh's $1-$28: payloads and traceparents per run; every other column an array,
    or (the batch sharing one value) an empty array and the value. Building and encoding an array
    element costs the client ~0.5 us and PostgreSQL about as much, for each run and column."""
    cols = list(zip(*map(msgspec.structs.astuple, rows), strict=True))
    arrays: list[Any] = [list(cols[i]) for i in _PER_RUN]
    scalars: list[Any] = []
    for i in _FOLDED:
        col = cols[i]
        if col.count(col[0]) == len(col) and (col[0] is None or col[0].__class__ in (str, int, float, datetime)):
            arrays.append([])
            scalars.append(col[0])
        else:
            arrays.append(list(col))
            scalars.append(None)
    return arrays + scalars


def _fresh(rows: Sequence[Any], n: int) -> tuple[list[int], list[int], dict[str, int]]:
    """insert_runs_fresh's answer: every row was created."""
    ids = [0] * n
    new_queues: dict[str, int] = {}
    for ord_, run_id, queue, epoch in rows:
        if ord_ is None:
            new_queues[queue] = epoch
        else:
            ids[ord_ - 1] = run_id
    return ids, list(range(n)), new_queues


def idempotency_scope(row: RunRow) -> str:
    """Where an idempotency key is unique: the run's queue, or `queue/tenant` when the submit
    names a tenant (a queue name has no '/'). A producer can only reach keys of its own scope."""
    return f"{row.queue}/{row.tenant}" if row.tenant else row.queue


def request_fingerprint(req: Submit, row: RunRow) -> str:
    """sha256 of the request as given (handler, queue, tenant, arguments, options; a delay,
    not the time it resolves to), so a retry matches and a different request does not."""
    when: Any = req.run_at.isoformat() if isinstance(req.run_at, datetime) else None
    data = [row.handler, row.queue, row.tenant, row.payload, row.priority, row.max_retries, row.timeout_s,
            row.concurrency_key, row.concurrency_limit, when, req.delay]
    if row.rate_key is not None:  # appended only when set: fingerprints of other requests do not change
        data += [row.rate_key, row.rate_limit]
    return hashlib.sha256(msgspec.json.encode(data)).hexdigest()


_ENDING_PAGE, _ENDING_SCAN = 500, 10_000
"""wait() looks for the run's ending event this far back in its queue's stream, a page at a time."""


def _outcome_from_event(run_id: int, status: str, result: Any, f: dict[bytes, bytes]) -> Outcome:
    """The outcome from the event that ended the run: its error is that transition's own."""
    def text(name: bytes) -> str | None:
        v = f.get(name)
        return v.decode(errors="replace") if v else None

    reason = None if status == Status.SUCCEEDED else (text(b"reason") or text(b"outcome"))
    return Outcome(run_id, status, result, text(b"error"), text(b"error_class"), reason)


def _outcome_from_row(run_id: int, status: str, result: Any, row: RunRecord, hot_error: str | None) -> Outcome:
    """The outcome from PostgreSQL's row once the ending event was recorded. The row keeps the last
    error of any attempt, so it is reported only where the final attempt is the one that failed."""
    if row["status"] != status:  # the projection is behind (a very busy stream): no reason to give
        failed = status in DEAD
        return Outcome(run_id, status, result, hot_error if failed else None, None, None)
    reason = None if status == Status.SUCCEEDED else row.get("reason")
    failed = status in DEAD or reason == "paused_after_error"
    return Outcome(run_id, status, result, row["last_error"] if failed else None,
                   row["last_error_class"] if failed else None, reason)


def _spec(row: Any) -> JobSpec:
    data = dict(row)
    options = data.pop("options", None) or {}
    if isinstance(options, str):
        options = json.loads(options)
    return msgspec.convert({**data, **options}, JobSpec)


class _Pending(msgspec.Struct):
    req: Submit
    row: RunRow
    fut: asyncio.Future[int]


class _Coalescer:
    """Group commit for `Client.submit`: concurrent single submits of one client process become
    one insert_runs statement and one enqueue_runs call per queue.

    A lone submit (nothing pending, no flush in flight) goes straight out from its caller's own
    task: one statement and one Lua call, no timer, no extra event-loop turn, no task. A submit
    made while another is in flight joins the pending list; a flush starts at the end of the
    current event-loop turn (plus `Client.coalesce_window` seconds when set), and while
    `Client.parallel` flushes (the lone one included) are in flight new submits accumulate, so
    batches grow with load. Each caller still returns only after PostgreSQL committed its run.
    Batched flushes run as tasks of their own: a caller giving up never cancels its neighbours'
    commit (a lone caller has no neighbours; if it is cancelled after the commit, the reconciler's
    drift repair enqueues its run)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.pending: list[_Pending] = []
        self.inflight: set[asyncio.Task[None]] = set()
        self.scheduled = False
        self.direct = 0
        """Lone submits in flight from their callers' own tasks (they count against `parallel`)."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.behind: list[tuple[list[int], list[int], list[RunRow]]] = []
        """Committed runs whose Redis enqueue goes out behind their callers (`Client.enqueue_behind`)."""
        self.behind_task: asyncio.Task[None] | None = None

    async def submit(self, req: Submit) -> int:
        loop = asyncio.get_running_loop()
        if loop is not self.loop:  # a new event loop (asyncio.run again): nothing of the old one survives
            self.loop, self.pending, self.inflight, self.scheduled, self.direct = loop, [], set(), False, 0
            self.behind, self.behind_task = [], None
        row = (await self.client._prepare([req], outbox=False))[0]  # bad input fails this caller only
        if not self.pending and not self.inflight and not self.direct:
            return await self._lone(req, row)
        fut: asyncio.Future[int] = loop.create_future()
        self.pending.append(_Pending(req, row, fut))
        self._schedule()
        return await fut

    async def _lone(self, req: Submit, row: RunRow) -> int:
        """A submit with nothing to coalesce with goes straight out; submits arriving meanwhile
        accumulate behind it (it counts as a flush in flight)."""
        client = self.client
        self.direct += 1
        try:
            ids, created, new_queues = await client._insert([req], [row], None)
            await client._stamp_new_queues(new_queues)
            if client.enqueue_behind:
                self._enqueue_behind(created, ids, [row])
            else:
                await client._enqueue(created, ids, [row])
            return ids[0]
        finally:
            self.direct -= 1
            if self.pending:
                self._schedule()

    def _schedule(self) -> None:
        if self.scheduled or not self.pending or len(self.inflight) + self.direct >= self.client.parallel:
            return
        self.scheduled = True
        assert self.loop is not None
        window = self.client.coalesce_window
        if window > 0:
            self.loop.call_later(window, self._start)
        else:
            self.loop.call_soon(self._start)

    def _start(self) -> None:
        self.scheduled = False
        while self.pending and len(self.inflight) + self.direct < self.client.parallel:
            batch = [p for p in self.pending[:self.client.chunk] if not p.fut.done()]  # done: the caller gave up
            del self.pending[:self.client.chunk]
            if batch:
                task = asyncio.ensure_future(self._flush(batch))
                self.inflight.add(task)
                task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.inflight.discard(task)
        self._schedule()

    async def _flush(self, batch: list[_Pending]) -> None:
        client = self.client
        reqs, rows = [p.req for p in batch], [p.row for p in batch]
        try:
            try:
                ids, created, new_queues = await client._insert(reqs, rows, None)
            except (FencepostError, *REFUSED) as exc:
                if len(batch) == 1 or isinstance(exc, StoreUnavailable):
                    raise
                # One request's refusal (a key conflict, data PostgreSQL rejects) must not fail its
                # neighbours. The batch's statement wrote nothing, so each goes again on its own.
                await asyncio.gather(*(self._flush([p]) for p in batch))
                return
            await client._stamp_new_queues(new_queues)
            if client.enqueue_behind:
                self._enqueue_behind(created, ids, rows)
            else:
                await client._enqueue(created, ids, rows)
        except BaseException as exc:
            for p in batch:
                if not p.fut.done():
                    p.fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for p, run_id in zip(batch, ids, strict=True):
            if not p.fut.done():
                p.fut.set_result(run_id)

    def _enqueue_behind(self, created: list[int], ids: list[int], rows: Sequence[RunRow]) -> None:
        """Queue committed runs for Redis; one task sends everything queued by the time it runs, one
        enqueue_runs call per queue (the enqueues of many submits coalesced)."""
        if created:
            self.behind.append((created, ids, list(rows)))
            if self.behind_task is None or self.behind_task.done():
                self.behind_task = asyncio.ensure_future(self._send_behind())

    async def _send_behind(self) -> None:
        while self.behind:
            batch, self.behind = self.behind, []
            created: list[int] = []
            ids: list[int] = []
            rows: list[RunRow] = []
            for c, i, r in batch:
                created += [len(ids) + k for k in c]
                ids += i
                rows += r
            try:
                await self.client._enqueue(created, ids, rows)
            except Exception as exc:  # committed: the reconciler's drift repair enqueues them (its grace)
                log.warning("enqueue of %d committed runs failed (%s); drift repair will enqueue them",
                            len(created), exc, extra={"event": "enqueue_behind_failed"})

    async def drain(self) -> None:
        """Flush what is pending and wait for every flush in flight (close)."""
        while self.pending or self.inflight or self.direct or (self.behind_task and not self.behind_task.done()):
            if self.behind_task is not None and not self.behind_task.done() and not (
                    self.pending or self.inflight or self.direct):
                await self.behind_task
                continue
            if self.pending and not self.scheduled:
                self._start()
            if self.inflight:
                await asyncio.gather(*self.inflight, return_exceptions=True)
            else:
                await asyncio.sleep(0.001 if self.direct else 0)  # a lone submit finishes in its caller's task


class Client(ControlMixin, WorkflowMixin):
    """Async client. A submit returns only after PostgreSQL committed the run."""

    idempotency_namespace: str | None = None
    """Idempotency keys of this client's submits are unique within this namespace too (the API sets
    the calling token: a second producer's key never reaches, or reveals, the first one's run)."""

    def __init__(self, redis_url: str | None = None, database_url: str | None = None, *,
                 settings: Settings | None = None, actor: str = "client") -> None:
        self.stores = Stores(settings or Settings.from_env(redis_url=redis_url, database_url=database_url))
        self.actor = actor
        self.registry: Registry | None = None
        self._defs: dict[str, JobSpec] = {}
        self._coalescer = _Coalescer(self)

    @property
    def settings(self) -> Settings:
        """The settings with the URLs as resolved (core.stores): given, else the embedded pair's,
        known once connected when the pair had to be started."""
        return self.stores.settings

    async def connect(self) -> Client:
        await self.stores.connect()
        return self

    async def close(self) -> None:
        if self._coalescer.loop is asyncio.get_running_loop():
            await self._coalescer.drain()
        await self.stores.close()

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- definitions ---------------------------------------------------------------------------
    async def register(self, registry: Registry | Iterable[JobSpec]) -> None:
        """Store handler declarations so submits can be validated without a worker running, and
        declare their queues (created and stamped now, so `queue pause` works before the first job)."""
        specs = registry.specs() if isinstance(registry, Registry) else list(registry)
        if isinstance(registry, Registry):
            self.registry = registry
        await store_definitions(self.stores.db, specs)
        await declare_queues(self.stores, {s.queue for s in specs})
        self._defs.update({s.name: s for s in specs})

    async def _load_definitions(self, names: set[str]) -> None:
        """Refresh the cached declarations once if a handler is not known yet."""
        if names - self._defs.keys():
            rows = await self.stores.db.fetch("definitions")
            self._defs = {r["name"]: _spec(r) for r in rows}
            for name in sorted(names - self._defs.keys()):
                raise UnknownHandler(name)

    # -- submit --------------------------------------------------------------------------------
    async def submit(self, handler: str | Handler[..., Any], *args: Any, kwargs: dict[str, Any] | None = None,
                     queue: str | None = None, priority: int | None = None, run_at: datetime | None = None,
                     delay: float | None = None, timeout: float | None = None, max_retries: int | None = None,
                     idempotency_key: str | None = None, trace: str | None = None, tenant: str | None = None,
                     concurrency_key: str | None = None, concurrency_limit: int | None = None,
                     rate_key: str | None = None, rate_limit: str | None = None,
                     connection: Conn | None = None) -> int:
        name = handler.name if isinstance(handler, Handler) else handler
        if isinstance(handler, Handler) and not self._binds(handler):
            args, kwargs = handler.bind(args, kwargs or {})  # a typed handle binds before anything is written
        req = Submit(handler=name, args=args, kwargs=kwargs or {}, queue=queue, priority=priority, run_at=run_at,
                     delay=delay, timeout=timeout, max_retries=max_retries, idempotency_key=idempotency_key,
                     trace=trace, tenant=tenant, concurrency_key=concurrency_key,
                     concurrency_limit=concurrency_limit, rate_key=rate_key, rate_limit=rate_limit)
        if connection is not None:
            return (await self.submit_many([req], connection=connection))[0]
        return await self._coalescer.submit(req)

    async def submit_many(self, requests: Sequence[Submit], *, connection: Conn | None = None) -> list[int]:
        """Submit a batch: one round trip to PostgreSQL, then one Lua call per queue.

        With `connection`, the runs are written inside the caller's transaction (an outbox):
        they exist if and only if it commits, and the reconciler moves them to Redis on commit.
        Returns run ids in request order. An idempotency key is unique per scope (the queue, or
        queue/tenant): the same request again yields the run it created, a different request with
        the key raises IdempotencyConflict (and writes nothing), within FENCEPOST_IDEMPOTENCY_WINDOW.
        """
        if not requests:
            return []
        rows = await self._prepare(requests, outbox=connection is not None)
        if connection is None and len(requests) > self.chunk:
            return await self._submit_pipelined(requests, rows)
        ids, created, new_queues = await self._insert(requests, rows, connection)
        # Stamped now even inside a caller's transaction: the queue is new, so Redis has nothing of
        # it to lose, and the reconciler must not take it for a forgotten queue and "rebuild" it.
        # (Rolled back, the stamp vouches for an empty queue: harmless.)
        await self._stamp_new_queues(new_queues)
        if connection is None:
            await self._enqueue(created, ids, rows)
        return ids

    async def _prepare(self, requests: Sequence[Submit], *, outbox: bool) -> list[RunRow]:
        """Validate everything before writing anything: bad input changes nothing."""
        names: set[str] = set()
        for r in requests:
            if r.handler.__class__ is not str or r.handler not in names:  # each name checked once
                names.add(validate.text("handler", r.handler))
        await self._load_definitions(names)
        now = datetime.now(_UTC)
        defaults: dict[str, tuple[str, int, float, int]] = {}
        tracer = submit_tracer()  # looked up once per batch
        return [self._validated(self._bound(r), now, outbox=outbox, defaults=defaults, tracer=tracer)
                for r in requests]

    def _bound(self, req: Submit) -> Submit:
        """A handler this client has registered (Client.register(registry)) checks the arguments
        against its signature here, for string-name submits too: InvalidInput naming the parameter."""
        handler = self.registry.handlers.get(req.handler) if self.registry is not None else None
        if handler is None:  # the declared signature, for producers without the handler (the API, the CLI)
            spec = self._defs.get(req.handler)
            if spec is not None and spec.params is not None:
                validate.check_call(req.handler, spec.params, req.args, req.kwargs)
            return req
        args, kwargs = handler.bind(req.args, req.kwargs)
        return msgspec.structs.replace(req, args=args, kwargs=kwargs)

    def _binds(self, handler: Handler[..., Any]) -> bool:
        """`_bound` will bind this handle's arguments anyway (its function is the registered one)."""
        registered = self.registry.handlers.get(handler.name) if self.registry is not None else None
        return registered is not None and registered.fn is handler.fn

    chunk = 2000
    """Large batches are split so chunk k reaches Redis while chunk k+1 is being committed;
    also the largest batch of coalesced single submits."""

    coalesce_window = 0.0
    """Seconds a coalesced flush waits for more submits once one is pending (0: to the end of the
    current event-loop turn; submits arriving while a flush is in flight wait for it anyway)."""

    enqueue_behind = False
    """`submit()` returns once PostgreSQL committed the run (invariant 1 as ever) and sends its Redis
    enqueue behind it: one background task per event-loop turn carries every submit's enqueue of that
    turn (coalesced). The run is claimable a Redis round trip later; if this process dies in between,
    the reconciler's drift repair (or the outbox relay) enqueues it after its grace period, the
    window docs/performance.md measures. `close()` waits for the enqueues. Off by default."""

    async def _submit_pipelined(self, requests: Sequence[Submit], rows: list[RunRow]) -> list[int]:
        """A call larger than a chunk: every chunk in one PostgreSQL transaction, then Redis.
        When this raises, nothing of the call is committed (issue 22 item 9: chunks committed
        one by one left 56,000 of 60,000 runs behind a DatabaseUnavailable that named none of
        them, and a retry duplicated them); a connection lost during COMMIT is settled by asking
        PostgreSQL for the transaction's status once it answers again (SubmitInDoubt if it does
        not within `in_doubt_wait`). The chunks reach Redis after the commit, `self.parallel` at
        a time (a run in Redis before its row commits could run and then vanish)."""
        ids: list[int] = []
        created: list[int] = []
        new_queues: dict[str, int] = {}
        txid: int | None = None
        body_done = False
        try:
            async with self.stores.db.transaction() as tx:
                txid = await tx.fetchval("batch_txid")
                for i in range(0, len(requests), self.chunk):
                    part_ids, part_created, part_queues = await self._insert(
                        requests[i:i + self.chunk], rows[i:i + self.chunk], tx, own=True)
                    ids.extend(part_ids)
                    created.extend(i + c for c in part_created)
                    new_queues.update(part_queues)
                body_done = True
        except DatabaseUnavailable as exc:
            if not body_done or txid is None:
                raise  # the transaction never reached COMMIT: PostgreSQL rolled it back
            if not await self._committed(txid, ids, exc):
                raise
        await self._stamp_new_queues(new_queues)
        gate = asyncio.Semaphore(self.parallel)

        async def enqueue(part: list[int]) -> None:
            async with gate:
                await self._enqueue(part, ids, rows)

        await asyncio.gather(*(enqueue(created[i:i + self.chunk]) for i in range(0, len(created), self.chunk)))
        return ids

    in_doubt_wait = 10.0
    """Seconds a batch whose COMMIT lost its connection keeps asking PostgreSQL whether it committed."""

    async def _committed(self, txid: int, ids: list[int], exc: DatabaseUnavailable) -> bool:
        """Whether transaction `txid`, whose COMMIT lost its connection, committed: True, False,
        or SubmitInDoubt when PostgreSQL does not answer within `in_doubt_wait`."""
        deadline = time.monotonic() + self.in_doubt_wait
        delay = 0.05
        while True:
            try:
                status = await self.stores.db.fetchval("batch_txid_status", txid)
            except StoreUnavailable:
                status = "unreachable"
            if status == "committed":
                log.warning("a batch of %d runs committed although its COMMIT lost the connection (%s)",
                            len(ids), exc, extra={"event": "batch_commit_confirmed"})
                return True
            if status == "aborted":
                return False
            if time.monotonic() + delay > deadline:  # 'in progress', no answer, or too old to say
                raise SubmitInDoubt(ids, str(exc)) from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    parallel = 2
    """Chunks (or coalesced batches of single submits) in flight to PostgreSQL at once."""

    async def _insert(self, requests: Sequence[Submit], rows_in: Sequence[RunRow],
                      connection: Conn | None, *, own: bool = False
                      ) -> tuple[list[int], list[int], dict[str, int]]:
        """One round trip to PostgreSQL for a batch of validated rows: (run ids in request order,
        indexes of the rows this call created, queues it created with their epochs). A batch with
        idempotency keys claims them in its scope first (`_insert_keyed`). `own`: `connection` is
        this client's transaction (a large submit_many), not a caller's outbox."""
        if any(r.idempotency_key is not None for r in rows_in):
            if connection is not None:
                return await self._insert_keyed(requests, rows_in, connection)
            async with self.stores.db.transaction() as tx:  # a conflict rolls back the whole batch
                return await self._insert_keyed(requests, rows_in, tx)
        if (connection is None or own) and not any(r.outbox or r.schedule_id is not None for r in rows_in):
            # nothing in the batch can conflict or needs a notify: the cheaper statement
            fresh = await self.stores.db.fetch("insert_runs_fresh", *_fresh_columns(rows_in), self.actor,
                                               conn=connection)
            return _fresh(fresh, len(requests))
        rows = await self.stores.db.fetch("insert_runs", *run_columns(rows_in), self.actor, conn=connection)
        ids, created, new_queues = _inserted(rows, len(requests))
        return ids, created, new_queues  # type: ignore[return-value]

    async def _insert_keyed(self, requests: Sequence[Submit], rows_in: Sequence[RunRow], conn: Conn
                            ) -> tuple[list[int], list[int], dict[str, int]]:
        """Idempotent submit: a key is unique per scope (the queue, or queue/tenant); the same
        request again returns its run, a different one raises IdempotencyConflict and, as the
        caller's transaction rolls back, writes nothing."""
        db = self.stores.db
        ns = "" if self.idempotency_namespace is None else "@" + self.idempotency_namespace
        scopes = [idempotency_scope(r) + ns if r.idempotency_key is not None else None for r in rows_in]
        prints = [request_fingerprint(q, r) if r.idempotency_key is not None else None
                  for q, r in zip(requests, rows_in, strict=True)]
        seen: dict[tuple[str, str], str] = {}
        for scope, row, fp in zip(scopes, rows_in, prints, strict=True):
            if scope is not None and row.idempotency_key is not None and fp is not None:
                if seen.setdefault((scope, row.idempotency_key), fp) != fp:
                    raise IdempotencyConflict(row.idempotency_key, scope, 0)
        rows = await db.fetch("insert_runs_keyed", *run_columns(rows_in), self.actor, prints, scopes, conn=conn)
        ids, created, new_queues = _inserted(rows, len(requests))
        missing = [i for i, v in enumerate(ids) if v is None]
        if missing:
            found = {(r["scope"], r["key"]): r for r in await db.fetch(
                "idempotency_lookup", [scopes[i] for i in missing], [rows_in[i].idempotency_key for i in missing],
                conn=conn)}
            for i in missing:
                key = rows_in[i].idempotency_key
                hit = found.get((scopes[i], key))
                if hit is None:  # a concurrent submit with this key has not committed yet
                    raise InvalidInput(f"idempotency key {key!r} is being submitted concurrently and is not "
                                       "committed yet; retry", field="idempotency_key")
                if hit["request_sha256"] and hit["request_sha256"] != prints[i]:
                    raise IdempotencyConflict(key or "", scopes[i] or "", hit["run_id"])
                ids[i] = hit["run_id"]
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
        await stamp_created(self.stores, new_queues)

    def _validated(self, req: Submit, now: datetime, *, outbox: bool,
                   defaults: dict[str, tuple[str, int, float, int]] | None = None, tracer: Any = ...) -> RunRow:
        """`defaults`: the handlers' validated queue, priority, timeout and retries, filled in and
        reused across one batch (a request that gives none of the four takes them as they are);
        `tracer`: submit_tracer() looked up for the batch (... : looked up here)."""
        spec = self._defs[req.handler]
        if req.queue is None and req.priority is None and req.timeout is None and req.max_retries is None \
                and defaults is not None and spec.name in defaults:
            queue, priority, timeout, retries = defaults[spec.name]
        else:
            queue = check_queue_name(req.queue or spec.queue)
            priority = validate.integer("priority", spec.priority if req.priority is None else req.priority)
            timeout = validate.number("timeout", spec.timeout_s if req.timeout is None else req.timeout)
            retries = validate.integer("max_retries", spec.max_retries if req.max_retries is None else req.max_retries)
            if req.queue is None and req.priority is None and req.timeout is None and req.max_retries is None \
                    and defaults is not None:
                defaults[spec.name] = (queue, priority, timeout, retries)
        if req.idempotency_key is not None:
            validate.text("idempotency_key", req.idempotency_key)
        if req.run_at is not None and req.delay is not None:
            raise InvalidInput("give run_at or delay, not both", field="run_at")
        run_at = now
        delay_ms: int | None = 0  # Redis makes it due on its own clock (docs/clock.md); run_at is for display
        if req.run_at is not None:
            if not isinstance(req.run_at, datetime) or req.run_at.tzinfo is None:
                raise InvalidInput("run_at must be timezone-aware", field="run_at")
            run_at, delay_ms = req.run_at, None  # a wall-clock instant: due at it on Redis's clock
        elif req.delay is not None:
            delta = timedelta(seconds=validate.number("delay", req.delay))
            run_at, delay_ms = now + delta, delta // timedelta(milliseconds=1)
        try:
            payload = encode_payload(tuple(req.args), dict(req.kwargs))
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            raise InvalidInput(f"arguments cannot be encoded: {exc}", field="args") from exc
        if len(payload) > self.settings.max_payload_bytes:
            raise PayloadTooLarge(len(payload), self.settings.max_payload_bytes)
        if req.trace is not None and (not isinstance(req.trace, str) or len(req.trace) != 55
                                      or not valid_traceparent(req.trace)):
            raise InvalidInput(f"trace must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), not {req.trace!r}",
                               field="trace")
        # as given; else a child of the submitting job (a span id of its own) or a new trace; + the submit span
        trace = submit_traceparent(req.trace, spec.name, queue) if tracer is ... else \
            submit_traceparent(req.trace, spec.name, queue, tracer)
        tenant = validate.label("tenant", req.tenant) if req.tenant is not None and req.tenant != "" else ""
        ckey, climit = _concurrency(spec, req)
        rkey, rlimit = _rate(spec, req)
        return RunRow(handler=spec.name, queue=queue, priority=priority, payload=payload, run_at=run_at,
                      max_retries=retries, timeout_s=timeout, idempotency_key=req.idempotency_key, trace_id=trace,
                      status=_PENDING, outbox=outbox, tenant=tenant, concurrency_key=ckey,
                      concurrency_limit=climit, rate_key=rkey, rate_limit=rlimit, delay_ms=delay_ms)

    # -- read ----------------------------------------------------------------------------------
    async def get(self, run_id: int) -> RunRecord:
        """The run as PostgreSQL records it (hot or archived), with its latest progress report
        (ctx.progress()); `run()` gives the live view an operator sees."""
        row = await self.stores.db.fetchrow("get_run", run_id)
        if row is None:
            raise UnknownRun(run_id)
        out = view(RunRecord, row)
        prog = await self.stores.db.fetchrow("progress_get", [run_id])  # ctx.progress(): the latest attempt's
        out.progress = None if prog is None else view(RunProgress, prog)
        return out

    async def run(self, run_id: int) -> Run:
        """The run with its arguments and result decoded and the live state Redis holds when it is
        newer than the record (fencepost.core.views.overlay: the rule every reader uses)."""
        return (await live_runs(self.stores, [run_view(await self.get(run_id))]))[0]

    def handle(self, run_id: int) -> RunHandle:
        """A result handle for a run id (from submit, submit_many, a schedule...): status(), wait(), get()."""
        return RunHandle(self, run_id)

    async def wait(self, run_id: int, timeout: float | None = None) -> Outcome:
        """Wait until the run is terminal, PAUSED or STOPPED; return its state, decoded result, and
        the error and reason of the transition that put it there (never an earlier attempt's error).

        Polls the run's Redis hash (the hot state, ahead of PostgreSQL's projection) and
        reads PostgreSQL only when Redis no longer holds the run (recorded and expired).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        resting = {s.value for s in RESTING}
        run = await self.get(run_id)
        queue = run.queue
        keys = self.stores.keys(queue)
        delay = 0.005
        while True:
            (hot,) = await self.stores.scripts.peek(keys, [run_id])  # the typed read of the hot store
            if hot is not None and hot.state in resting:
                ending = await self._ending_event(queue, run_id, hot.state,
                                                  None if hot.version is None else str(hot.version).encode())
                if ending is not None:
                    return _outcome_from_event(run_id, hot.state, decode_result(hot.result), ending)
                # the recorder has it (it deletes an entry only once PostgreSQL committed it)
                return _outcome_from_row(run_id, hot.state, decode_result(hot.result), await self.get(run_id),
                                         hot.error)
            if hot is None:
                run = await self.get(run_id)
                if run.status in RESTING:
                    return _outcome_from_row(run_id, run.status, decode_result(run.result), run, None)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(run_id, hot.state if hot is not None else run.status)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    async def _ending_event(self, queue: str, run_id: int, status: str, version: bytes | None
                            ) -> dict[bytes, bytes] | None:
        """The event that put the run in STATUS at VERSION while it is still in the queue's stream,
        newest first, at most `_ENDING_SCAN` entries back; None once the recorder took it."""
        events = self.stores.keys(queue).events
        rid, to = str(run_id).encode(), status.encode()
        top = "+"
        for _ in range(_ENDING_SCAN // _ENDING_PAGE):
            entries = cast("list[tuple[bytes, dict[bytes, bytes]]]",  # bytes: decode_responses=False
                           await self.stores.redis.xrevrange(events, max=top, min="-", count=_ENDING_PAGE))
            for _, f in entries:
                if f.get(b"run") == rid and f.get(b"to") == to and (version is None or f.get(b"v") == version):
                    return f
            if len(entries) < _ENDING_PAGE:
                return None
            top = "(" + entries[-1][0].decode()
        return None

    async def list_runs(self, *, queue: str | None = None, status: str | None = None,
                        handler: str | None = None, limit: int = 50) -> list[RunSummary]:
        """Runs newest first, selected by their recorded state, shown with their live one (overlay)."""
        rows = await self.stores.db.fetch("list_runs", queue, status_filter(status), handler, limit)
        return await live_summaries(self.stores, [view(RunSummary, r) for r in rows])

    async def dead_letter(self, *, queue: str | None = None, limit: int = 50) -> list[RunSummary]:
        rows = await self.stores.db.fetch("dead_letter", queue, limit)
        return await live_summaries(self.stores, [view(RunSummary, r) for r in rows])

    async def events(self, run_id: int) -> list[Event]:
        await self.get(run_id)
        return [view(Event, r) for r in await self.stores.db.fetch("run_events", run_id)]

    async def fleet_events(self, since: datetime, type_: str | None = None, queue: str | None = None,
                           limit: int = 100) -> list[Event]:
        """The fleet's history since SINCE, of one TYPE and QUEUE when given."""
        if queue is not None:
            await require_queue(self.stores, queue)
        return [view(Event, r) for r in await self.stores.db.fetch("events_since", since, type_, queue, limit)]

    async def attempts(self, run_id: int) -> list[Attempt]:
        return [view(Attempt, r) for r in await self.stores.db.fetch("run_attempts", run_id)]

    async def checkpoint(self, run_id: int) -> Checkpoint | None:
        """The run's latest committed checkpoint (its state decoded), or None."""
        row = await self.stores.db.fetchrow("get_checkpoint", run_id)
        if row is None or row["state"] is None:
            return None
        return view(Checkpoint, {**dict(row), "state": decode_result(row["state"])})

    async def queues(self, *, window_s: int = 300) -> list[QueueStats]:
        """Every queue, its depth counted in Redis (the live store), its throughput from the record."""
        return await queue_stats(self.stores, window_s=window_s)

    async def known_queue(self, queue: str) -> None:
        """UnknownQueue unless QUEUE exists."""
        await require_queue(self.stores, queue)

    async def command(self, verb: str, run_id: int, *, reason: str = "",
                      expected_version: int | None = None) -> Reply:
        """One operator command by name (pause, stop, cancel, resume, restart, retry)."""
        if verb not in COMMANDS:
            raise InvalidInput(f"unknown command {verb!r}; one of {', '.join(COMMANDS)}", field="command")
        reply: Reply = await getattr(self, verb)(run_id, reason=reason, expected_version=expected_version)
        return reply

    async def workers(self, *, queue: str | None = None) -> list[WorkerInfo]:
        """Live workers (of QUEUE when given): identity, queues, concurrency, the runs each holds."""
        return [w for w in await fleet.list_workers(self.stores) if queue is None or queue in w.queues]

    async def stop_worker(self, worker_id: str, *, reason: str = "") -> None:
        """Ask WORKER_ID to stop claiming, drain within its grace period and exit (audited as this client's actor)."""
        await fleet.request_stop(self.stores, worker_id, actor=self.actor, reason=reason)

    # -- schedules (fencepost.schedules.Schedules; the operator protocol's side of them) --------------
    async def add_schedule(self, spec: ScheduleSpec) -> dict[str, Any]:
        return await Schedules(self).add(spec)

    async def update_schedule(self, name: str, fields: dict[str, Any], *, reason: str = "") -> dict[str, Any]:
        """Edit a schedule in place from FIELDS (the ScheduleUpdate fields to change)."""
        try:
            change = msgspec.convert(fields, ScheduleUpdate)
        except msgspec.ValidationError as exc:
            raise InvalidInput(str(exc), field="update") from exc
        return await Schedules(self).update(name, change, reason=reason)

    async def run_schedule_now(self, name: str, *, reason: str = "") -> int:
        return await Schedules(self).run_now(name, reason=reason)

    async def schedules(self, *, limit: int = 100) -> list[dict[str, Any]]:
        return await Schedules(self).list(limit=limit)

    async def schedule(self, name: str) -> dict[str, Any]:
        return await Schedules(self).get(name)

    async def schedule_fires(self, name: str, n: int) -> tuple[list[datetime], str]:
        """The schedule's next N fire times and its timezone."""
        store = Schedules(self)
        zone_name = str((await store.get(name))["timezone"])
        return list(await store.upcoming(name, n)), zone_name

    async def schedule_runs(self, name: str, limit: int = 10) -> list[dict[str, Any]]:
        return await Schedules(self).runs(name, limit)

    async def set_schedule_paused(self, name: str, paused: bool) -> None:
        await Schedules(self).set_paused(name, paused)

    async def remove_schedule(self, name: str) -> None:
        await Schedules(self).remove(name)

    async def recorder_silence(self) -> RecorderSilence | None:
        """The queue whose transitions have waited longest for a recorder, when longer than
        Settings.recorder_silence_s (the lag alert's threshold); None when none has."""
        return await recorder_silence(self.stores)


class SyncClient:
    """The same client for plain scripts: a private event loop on a background thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fencepost-client", daemon=True)
        self._thread.start()
        self._client = Client(*args, **kwargs)
        self._call(self._client.connect)

    def _call(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T:
        return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), self._loop).result()

    def submit_many(self, requests: Sequence[Submit], **kwargs: Any) -> list[int]:
        """Declared (not left to __getattr__) so a typed handle's submit_sync type-checks against it."""
        return self._call(self._client.submit_many, requests, **kwargs)

    def handle(self, run_id: int) -> SyncRunHandle:
        """A result handle whose status(), wait() and get() block."""
        return SyncRunHandle(self._client.handle(run_id), self._call)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        attr: Callable[..., Any] = getattr(self._client, name)
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
