"""The producer's client: durable submit (PostgreSQL first, then Redis), wait, inspect."""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import msgspec

from fencepost.control import BULK_DEFAULT_LIMIT, COMMANDS, Control
from fencepost.core import cursors
from fencepost.core import tokens as token_store
from fencepost.core import workers as fleet
from fencepost.core.config import Settings
from fencepost.core.errors import (
    DatabaseUnavailable,
    FencepostError,
    InvalidInput,
    StoreUnavailable,
    SubmitInDoubt,
    UnknownRun,
    WaitTimeout,
)
from fencepost.core.models import JobSpec, Outcome, RunRow, Submit, decode_result
from fencepost.core.queues import declare_queues, require_queue
from fencepost.core.record import REFUSED, Conn, store_definitions
from fencepost.core.registry import Handler, Registry
from fencepost.core.schedules import ScheduleSpec
from fencepost.core.states import DEAD, RESTING, Status
from fencepost.core.stores import Stores
from fencepost.core.submit import Inserted, SubmitPath, idempotency_scope, request_fingerprint
from fencepost.core.submit import _rate as _rate  # tests/test_rate_limits.py reads it here
from fencepost.core.views import (
    Attempt,
    AuditEntry,
    Batch,
    BatchRecord,
    BulkCount,
    BulkResult,
    Checkpoint,
    Event,
    QueueStats,
    RecorderSilence,
    Reply,
    Run,
    RunProgress,
    RunRecord,
    RunSummary,
    Schedule,
    ScheduleRun,
    TokenInfo,
    Workflow,
    WorkflowSummary,
    ending_event,
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
from fencepost.workflows import Batch as SubmittedBatch
from fencepost.workflows import Node, RunHandle, SyncRunHandle, Workflows

__all__ = ["Client", "SyncClient", "idempotency_scope", "request_fingerprint"]

log = logging.getLogger("fencepost.client")

T = TypeVar("T")



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
    if row.status != status:  # the projection is behind (a very busy stream): no reason to give
        failed = status in DEAD
        return Outcome(run_id, status, result, hot_error if failed else None, None, None)
    reason = None if status == Status.SUCCEEDED else row.reason
    failed = status in DEAD or reason == "paused_after_error"
    return Outcome(run_id, status, result, row.last_error if failed else None,
                   row.last_error_class if failed else None, reason)


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
        self.preparing = 0
        """Submits validating their request (the server's clock may be read): not yet pending, not done."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.behind: list[tuple[list[int], list[int], list[RunRow]]] = []
        """Committed runs whose Redis enqueue goes out behind their callers (`Client.enqueue_behind`)."""
        self.behind_task: asyncio.Task[None] | None = None

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self.loop:  # a new event loop (asyncio.run again): nothing of the old one survives
            self.loop, self.pending, self.inflight, self.scheduled, self.direct = loop, [], set(), False, 0
            self.preparing = 0
            self.behind, self.behind_task = [], None
        return loop

    async def submit(self, req: Submit) -> int:
        loop = self._bind_loop()
        self.preparing += 1  # close() waits for it: preparing may wait on the server's clock
        try:
            row = (await self.client._prepare([req], outbox=False))[0]  # bad input fails this caller only
        finally:
            self.preparing -= 1
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

    async def enqueue_behind_call(self, created: list[int], ids: list[int], rows: Sequence[RunRow]) -> None:
        """submit_many's enqueue with `Client.enqueue_behind`: sent behind the caller, so a producer's next
        call validates and commits while this one's runs go to Redis. A call that finds the previous
        call's enqueue still in flight waits for it first: at most one call's runs are on their way, so a
        producer faster than Redis is held back instead of piling up committed runs in memory."""
        self._bind_loop()
        if self.behind_task is not None and not self.behind_task.done():
            await asyncio.shield(self.behind_task)
        self._enqueue_behind(created, ids, rows)

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
        while self.pending or self.inflight or self.direct or self.preparing or (
                self.behind_task and not self.behind_task.done()):
            if self.behind_task is not None and not self.behind_task.done() and not (
                    self.pending or self.inflight or self.direct):
                await self.behind_task
                continue
            if self.pending and not self.scheduled:
                self._start()
            if self.inflight:
                await asyncio.gather(*self.inflight, return_exceptions=True)
            else:
                await asyncio.sleep(0.001 if self.direct or self.preparing else 0)  # they finish in their callers' tasks


class Client:
    """Async client. A submit returns only after PostgreSQL committed the run.

    Composed of parts sharing one `SubmitPath` (core/submit.py: the stores, the handler
    declarations, the actor): `control` (operator commands, fencepost.control), `flows` (workflows
    and batches, fencepost.workflows) and `schedule_book` (fencepost.schedules); the methods below
    delegate to them, so the public API is one object."""

    def __init__(self, redis_url: str | None = None, database_url: str | None = None, *,
                 settings: Settings | None = None, actor: str = "client") -> None:
        self.stores = Stores(settings or Settings.from_env(redis_url=redis_url, database_url=database_url))
        self._parts(SubmitPath(self.stores, actor=actor))

    def _parts(self, path: SubmitPath) -> None:
        self.submitter = path
        self.control = Control(path)
        self.flows = Workflows(path, self.control)
        self.schedule_book = Schedules(path)
        self._coalescer = _Coalescer(self)

    def __copy__(self) -> Client:
        """A copy acting as another actor (the API's per-request client): the same stores and
        declarations, its own actor and idempotency namespace, parts bound to them."""
        new = object.__new__(Client)
        new.__dict__.update(self.__dict__)
        new._parts(copy.copy(self.submitter))
        return new

    @property
    def actor(self) -> str:
        """Who this client's commands and submits are recorded as."""
        return self.submitter.actor

    @actor.setter
    def actor(self, value: str) -> None:
        self.submitter.actor = value

    @property
    def idempotency_namespace(self) -> str | None:
        """Idempotency keys of this client's submits are unique within this namespace too (the API sets
        the calling token: a second producer's key never reaches, or reveals, the first one's run)."""
        return self.submitter.idempotency_namespace

    @idempotency_namespace.setter
    def idempotency_namespace(self, value: str | None) -> None:
        self.submitter.idempotency_namespace = value

    @property
    def registry(self) -> Registry | None:
        return self.submitter.registry

    @property
    def _defs(self) -> dict[str, JobSpec]:
        """The handler declarations submits are validated against (SubmitPath.defs)."""
        return self.submitter.defs

    @_defs.setter
    def _defs(self, value: dict[str, JobSpec]) -> None:
        self.submitter.defs = value

    @property
    def settings(self) -> Settings:
        """The settings with the URLs as resolved (core.stores): given, else the embedded pair's,
        known once connected when the pair had to be started."""
        return self.stores.settings

    async def connect(self, *, redis: bool = True) -> Client:
        """Open the stores; REDIS false: PostgreSQL only, for what needs no Redis (tokens, the audit log)."""
        await self.stores.connect(redis=redis)
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
            self.submitter.registry = registry
        await store_definitions(self.stores.db, specs)
        await declare_queues(self.stores, {s.queue for s in specs})
        self._defs.update({s.name: s for s in specs})

    async def _load_definitions(self, names: set[str]) -> None:
        """Refresh the cached declarations once if a handler is not known yet (UnknownHandler)."""
        await self.submitter.load_definitions(names)

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
            if self.enqueue_behind:
                await self._coalescer.enqueue_behind_call(created, ids, rows)
            else:
                await self._enqueue(created, ids, rows)
        return ids

    async def _prepare(self, requests: Sequence[Submit], *, outbox: bool) -> list[RunRow]:
        """Validate everything before writing anything: bad input changes nothing (SubmitPath.prepare)."""
        return await self.submitter.prepare(requests, outbox=outbox)

    def _binds(self, handler: Handler[..., Any]) -> bool:
        return self.submitter.binds(handler)

    chunk = 2000
    """Large batches are split so chunk k reaches Redis while chunk k+1 is being committed;
    also the largest batch of coalesced single submits."""

    coalesce_window = 0.0
    """Seconds a coalesced flush waits for more submits once one is pending (0: to the end of the
    current event-loop turn; submits arriving while a flush is in flight wait for it anyway)."""

    enqueue_behind = False
    """`submit()` returns once PostgreSQL committed the run (invariant 1 as ever) and sends its Redis
    enqueue behind it: one background task per event-loop turn carries every submit's enqueue of that
    turn (coalesced). `submit_many()` (up to `chunk` runs, no `connection`) does the same; its next
    call waits for the previous call's enqueue if that is still in flight. The run is claimable a
    Redis round trip later; if this process dies in between, the reconciler's drift repair (or the
    outbox relay) enqueues it after its grace period, the window docs/performance.md measures.
    `close()` waits for the enqueues. Off by default."""

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
                      connection: Conn | None, *, own: bool = False) -> Inserted:
        """SubmitPath.insert (one method, so a test can watch each chunk of a large submit_many)."""
        return await self.submitter.insert(requests, rows_in, connection, own=own)

    async def _enqueue(self, created: list[int], ids: list[int], rows: Sequence[RunRow]) -> None:
        await self.submitter.enqueue(created, ids, rows)

    async def _stamp_new_queues(self, new_queues: dict[str, int]) -> None:
        await self.submitter.stamp(new_queues)

    # -- read ----------------------------------------------------------------------------------
    async def get(self, run_id: int) -> RunRecord:
        """The run as PostgreSQL records it (hot or archived), with its latest progress report
        (ctx.progress()); `run()` gives the live view an operator sees."""
        row = await self.stores.db.row("get_run", run_id)
        if row is None:
            raise UnknownRun(run_id)
        out = view(RunRecord, row)
        prog = await self.stores.db.row("progress_get", [run_id])  # ctx.progress(): the latest attempt's
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
                ending = await ending_event(self.stores, queue, run_id, hot.state,
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

    async def list_runs(self, *, queue: str | None = None, status: str | None = None,
                        handler: str | None = None, limit: int = 50, cursor: str | None = None) -> list[RunSummary]:
        """Runs newest first, selected by their recorded state, shown with their live one (overlay); after
        CURSOR (fencepost.core.cursors, `runs/id/desc`: the key of the previous page's last row) when given."""
        key = cursors.decode("runs/id/desc", cursor)
        if key is None:
            rows = await self.stores.db.rows("list_runs", queue, status_filter(status), handler, limit)
        else:
            rows = await self.stores.db.rows("api_runs_page_indexed", queue, status_filter(status), handler, None,
                                             None, limit, *([None] * 8), "id", "desc", 0, True, None, key[0])
        return await live_summaries(self.stores, [view(RunSummary, r) for r in rows])

    async def dead_letter(self, *, queue: str | None = None, limit: int = 50) -> list[RunSummary]:
        rows = await self.stores.db.rows("dead_letter", queue, limit)
        return await live_summaries(self.stores, [view(RunSummary, r) for r in rows])

    async def events(self, run_id: int, *, limit: int | None = None, cursor: str | None = None) -> list[Event]:
        """The run's timeline in the order recorded: all of it, or LIMIT events after CURSOR (a `run_events`
        cursor: the key of the previous page's last event)."""
        await self.get(run_id)
        if limit is None and cursor is None:
            return [view(Event, r) for r in await self.stores.db.rows("run_events", run_id)]
        key = cursors.decode("run_events", cursor) or [None, None, None]
        page = [view(Event, r) for r in await self.stores.db.rows("run_events_page", run_id, limit or 1000, *key)]
        for event in page:  # the page's rows do not repeat the run id
            event.run_id = run_id
        return page

    async def fleet_events(self, since: datetime, type_: str | None = None, queue: str | None = None,
                           limit: int = 100, *, cursor: str | None = None) -> list[Event]:
        """The fleet's history since SINCE, of one TYPE and QUEUE when given, newest first; after CURSOR (an
        `events` cursor: the key of the previous page's last event) when given."""
        if queue is not None:
            await require_queue(self.stores, queue)
        key = cursors.decode("events", cursor) or [None, None, None, None]
        return [view(Event, r) for r in await self.stores.db.rows("fleet_events_page", since, type_, queue, limit,
                                                                   None, *key)]

    async def attempts(self, run_id: int) -> list[Attempt]:
        return [view(Attempt, r) for r in await self.stores.db.rows("run_attempts", run_id)]

    async def checkpoint(self, run_id: int) -> Checkpoint | None:
        """The run's latest committed checkpoint (its state decoded), or None."""
        row = await self.stores.db.row("get_checkpoint", run_id)
        if row is None or row.state is None:
            return None
        return view(Checkpoint, msgspec.structs.replace(row, state=decode_result(row.state)))

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
    async def add_schedule(self, spec: ScheduleSpec) -> Schedule:
        """Store a schedule (validated first); the stored schedule, its arguments decoded as the API gives them."""
        return (await self.schedule_book.add(spec)).decoded()

    async def update_schedule(self, name: str, fields: dict[str, Any], *, reason: str = "") -> Schedule:
        """Edit a schedule in place from FIELDS (the ScheduleUpdate fields to change); the schedule as edited."""
        try:
            change = msgspec.convert(fields, ScheduleUpdate)
        except msgspec.ValidationError as exc:
            raise InvalidInput(str(exc), field="update") from exc
        return (await self.schedule_book.update(name, change, reason=reason)).decoded()

    async def run_schedule_now(self, name: str, *, reason: str = "") -> int:
        return await self.schedule_book.run_now(name, reason=reason)

    async def schedules(self, *, limit: int = 100) -> list[Schedule]:
        """Schedules by name (without their arguments, as the API lists them)."""
        return await self.schedule_book.list_scoped(limit=limit)  # every queue's, each with its own queue

    async def schedule(self, name: str) -> Schedule:
        """One schedule, its arguments decoded (`args_json`: {"args": [...], "kwargs": {...}})."""
        return (await self.schedule_book.get(name)).decoded()

    async def schedule_fires(self, name: str, n: int) -> tuple[list[datetime], str]:
        """The schedule's next N fire times and its timezone."""
        store = self.schedule_book
        zone_name = (await store.get(name)).timezone
        return list(await store.upcoming(name, n)), zone_name

    async def schedule_runs(self, name: str, limit: int = 10) -> list[ScheduleRun]:
        """The runs the schedule fired, latest fire first."""
        return await self.schedule_book.runs(name, limit)

    async def set_schedule_paused(self, name: str, paused: bool) -> None:
        await self.schedule_book.set_paused(name, paused)

    async def remove_schedule(self, name: str) -> None:
        await self.schedule_book.remove(name)

    async def recorder_silence(self) -> RecorderSilence | None:
        """The queue whose transitions have waited longest for a recorder, when longer than
        Settings.recorder_silence_s (the lag alert's threshold); None when none has."""
        return await recorder_silence(self.stores)

    # -- operator commands (fencepost.control.Control: `self.control`) ---------------------------
    async def pause(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """PENDING / RETRY_WAIT -> PAUSED now ('PAUSED'); RUNNING -> pause requested ('REQUESTED')."""
        return await self.control.pause(run_id, reason=reason, expected_version=expected_version)

    async def stop(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """RUNNING -> STOPPING; the run becomes STOPPED when the handler lets go (or is forced)."""
        return await self.control.stop(run_id, reason=reason, expected_version=expected_version)

    async def cancel(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """Not running: CANCELLED now. Running: stopped first, then CANCELLED ('STOPPING')."""
        return await self.control.cancel(run_id, reason=reason, expected_version=expected_version)

    async def resume(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """PAUSED / STOPPED -> PENDING: same run, next attempt starts from the latest checkpoint."""
        return await self.control.resume(run_id, reason=reason, expected_version=expected_version)

    async def restart(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """From the beginning: the checkpoint is discarded (its generation is bumped)."""
        return await self.control.restart(run_id, reason=reason, expected_version=expected_version)

    async def retry(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """A dead-lettered run (FAILED / TIMED_OUT / CANCELLED) -> PENDING, keeping its checkpoint."""
        return await self.control.retry(run_id, reason=reason, expected_version=expected_version)

    async def resolve(self, run_id: int, *, as_: str, reason: str = "",
                      expected_version: int | None = None) -> Reply:
        """Close a review-queue run: `as_` is 'succeeded' or 'failed' (or 'retry' to run it again)."""
        return await self.control.resolve(run_id, as_=as_, reason=reason, expected_version=expected_version)

    async def review_queue(self, *, queue: str | None = None, limit: int = 50) -> list[RunSummary]:
        """FAILED runs with reason `review`, waiting for an operator's `resolve`."""
        return await self.control.review_queue(queue=queue, limit=limit)

    async def pause_queue(self, queue: str, *, reason: str = "") -> None:
        """Nothing new is dispatched from the queue; running runs carry on."""
        await self.control.pause_queue(queue, reason=reason)

    async def resume_queue(self, queue: str, *, reason: str = "") -> None:
        await self.control.resume_queue(queue, reason=reason)

    async def bulk(self, command: str, *, queue: str, status: str | None = None, handler: str | None = None,
                   limit: int = BULK_DEFAULT_LIMIT, confirm: bool = False, reason: str = "",
                   until_id: int | None = None) -> BulkResult:
        """A command on the runs of a queue that match (Control.bulk: BulkNotConfirmed without `confirm`)."""
        return await self.control.bulk(command, queue=queue, status=status, handler=handler, limit=limit,
                                       confirm=confirm, reason=reason, until_id=until_id)

    async def act_on(self, command: str, ids: list[int], *, reason: str = "", queue: str | None = None,
                     selection: dict[str, Any] | None = None) -> BulkResult:
        """A command on exactly these runs, one compare-and-set each (Control.act_on)."""
        return await self.control.act_on(command, ids, reason=reason, queue=queue, selection=selection)

    # -- workflows and batches (fencepost.workflows.Workflows: `self.flows`) ---------------------
    async def submit_workflow(self, nodes: Sequence[Node], *, name: str | None = None,
                              trace: str | None = None) -> uuid.UUID:
        """Insert every node atomically under one workflow id; returns it (Workflows.submit_workflow)."""
        return await self.flows.submit_workflow(nodes, name=name, trace=trace)

    async def submit_batch(self, requests: Sequence[Submit], *, on_complete: Submit | None = None,
                           on_success: Submit | None = None, name: str | None = None) -> SubmittedBatch:
        """Runs as one batch whose callbacks run exactly once when all of them are terminal."""
        return await self.flows.submit_batch(requests, on_complete=on_complete, on_success=on_success, name=name)

    async def batch(self, batch_id: uuid.UUID | str) -> BatchRecord:
        """The batch as recorded: its callbacks' run ids and every member's state (`batch_view` counts them)."""
        return await self.flows.batch(batch_id)

    async def batch_view(self, batch_id: uuid.UUID | str) -> Batch:
        return await self.flows.batch_view(batch_id)

    async def workflow(self, workflow_id: uuid.UUID | str) -> Workflow:
        return await self.flows.workflow(workflow_id)

    async def workflows(self, *, limit: int = 50) -> list[WorkflowSummary]:
        return await self.flows.workflows(limit=limit)

    async def workflow_id(self, prefix: str) -> str:
        """The full id of the one workflow whose id starts with PREFIX (4 to 36 hex digits and dashes)."""
        return await self.flows.workflow_id(prefix)

    async def retry_workflow(self, workflow_id: uuid.UUID | str, *, recompute: Sequence[str] = (),
                             reason: str = "") -> dict[str, list[str]]:
        """Re-run what did not succeed, keeping succeeded nodes (Workflows.retry_workflow)."""
        return await self.flows.retry_workflow(workflow_id, recompute=recompute, reason=reason)

    # -- bulk counts, the audit log and tokens (the operator protocol's; the API has the same) ------
    async def bulk_count(self, command: str, *, queue: str, status: str | None = None, handler: str | None = None,
                         limit: int = BULK_DEFAULT_LIMIT) -> BulkCount:
        """What a bulk command would act on (Control.bulk_count): nothing changes; UnknownQueue first."""
        await require_queue(self.stores, queue)
        return await self.control.bulk_count(command, queue=queue, status=status, handler=handler, limit=limit)

    async def bulk_confirm(self, count: BulkCount, *, reason: str = "") -> BulkResult:
        """Act on exactly the runs COUNT counted (Control.bulk_confirm)."""
        return await self.control.bulk_confirm(count, reason=reason)

    async def audit(self, *, actor: str | None = None, queue: str | None = None, since: datetime | None = None,
                    until: datetime | None = None, limit: int = 100, cursor: str | None = None) -> list[AuditEntry]:
        """Who did what, newest first: configuration changes (the audit log) and operators' commands on runs;
        after CURSOR (an `audit` cursor: the key of the previous page's last entry) when given."""
        key = cursors.decode("audit", cursor)
        after = None if key is None else msgspec.json.encode([key[0].isoformat(), key[1], key[2]]).decode()
        rows = await self.stores.db.rows("audit_list", actor, queue, since, until, limit, None, after)
        return [view(AuditEntry, msgspec.structs.replace(r, data=msgspec.json.decode(r.data) if r.data else None))
                for r in rows]

    async def tokens(self) -> list[TokenInfo]:
        """Every API token (never its secret)."""
        return [view(TokenInfo, r) for r in await token_store.list_all(self.stores.db)]

    async def create_token(self, role: str, queues: Sequence[str] = (), *, name: str | None = None,
                           expires_in: float | None = None) -> tuple[TokenInfo, str]:
        """A new API token made by this client's actor, and its secret (shown only now: its sha256 is stored)."""
        row, secret = await token_store.insert(self.stores.db, role, list(queues), name, self.actor,
                                               expires_in=expires_in)
        return view(TokenInfo, row), secret

    async def revoke_token(self, token_id: int, *, reason: str = "") -> None:
        """Revoke a token (audited as this client's actor); InvalidInput when there is none."""
        if await token_store.revoke(self.stores.db, token_id, self.actor, reason=reason) is None:
            raise InvalidInput(f"no token with id {token_id}", field="token_id")


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
