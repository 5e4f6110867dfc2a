"""The one submit path: prepare (validate every request against its handler's declaration),
insert (one PostgreSQL round trip; the run exists once it commits), deliver (after the commit:
stamp the queues the insert created, one enqueue_runs call per queue, clear the outbox flag).

`Client.submit` / `submit_many`, workflows, batches and recomputes, a schedule's run-now and the
trigger's fires all go through `SubmitPath`, so its checks (payload size, numbers, labels, limits,
idempotency) are written once; tests/test_layers.py fails when another module runs the insert
statements or the enqueue script.

    Client.submit -> SubmitPath.prepare -> .insert ("insert_runs*", sql/queries*.sql) -> .deliver
                  -> Scripts.enqueue_runs (lua/enqueue_runs.lua) per queue"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from fencepost.core import rates, validate
from fencepost.core.config import Settings
from fencepost.core.errors import IdempotencyConflict, InvalidInput, PayloadTooLarge, RedisUnavailable, UnknownHandler
from fencepost.core.models import JobSpec, RunRow, Submit, encode_payload, run_columns
from fencepost.core.queues import check_queue_name, stamp_created
from fencepost.core.record import Conn
from fencepost.core.registry import Handler, Registry
from fencepost.core.states import Status
from fencepost.core.stores import Stores
from fencepost.core.tracing import submit_traceparent, submit_tracer, valid_traceparent

__all__ = ["Inserted", "SubmitPath", "check_payload", "encode_arguments", "fire_row", "idempotency_scope",
           "request_fingerprint"]

log = logging.getLogger("fencepost.client")

_UTC = UTC
_PENDING = Status.PENDING.value  # an Enum member's .value is a descriptor call: ~0.5 us per run

Inserted = tuple[list[int], list[int], dict[str, int]]
"""What an insert answers: run ids in request order (None where a fire another trigger made was not
created), indexes of the rows this call created, queues it created with their epochs."""


def check_payload(payload: bytes, settings: Settings) -> bytes:
    """PAYLOAD, or PayloadTooLarge past Settings.max_payload_bytes: the one size check of every submit
    and schedule (a schedule's arguments become each fire's payload)."""
    if len(payload) > settings.max_payload_bytes:
        raise PayloadTooLarge(len(payload), settings.max_payload_bytes)
    return payload


def encode_arguments(args: Sequence[Any], kwargs: dict[str, Any], settings: Settings) -> bytes:
    """The payload of ARGS and KWARGS, checked: InvalidInput when they cannot be encoded,
    PayloadTooLarge when too big."""
    try:
        payload = encode_payload(tuple(args), dict(kwargs))
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        raise InvalidInput(f"arguments cannot be encoded: {exc}", field="args") from exc
    return check_payload(payload, settings)


def fire_row(*, schedule_id: int, handler: str, queue: str, payload: bytes, priority: Any, max_retries: Any,
             timeout_s: Any, fire_time: datetime, run_at: datetime) -> RunRow:
    """One fire of a schedule as a run (the trigger's and run-now's), its numbers checked against
    fencepost.core.validate: a handler declaring an impossible timeout, or a schedule an older version
    accepted, is refused here, not by a store."""
    return RunRow(handler=handler, queue=queue, priority=validate.integer("priority", priority), payload=payload,
                  run_at=run_at, max_retries=validate.integer("max_retries", max_retries),
                  timeout_s=validate.number("timeout", timeout_s), status=_PENDING, schedule_id=schedule_id,
                  fire_time=fire_time, outbox=True)


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
        if r.ord is None:
            new_queues[r.queue] = r.epoch
        elif r.created:
            ids[r.ord - 1] = r.id
            created.append(r.ord - 1)
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


def _spec(row: Any) -> JobSpec:
    """A definitions row as the JobSpec it declares (its options merged in)."""
    data = msgspec.structs.asdict(row)
    options = data.pop("options", None) or {}
    if isinstance(options, str):
        options = json.loads(options)
    return msgspec.convert({**data, **options}, JobSpec)



class SubmitPath:
    """Prepare, insert and deliver runs for one producer: its stores, the handler declarations it
    validates against (cached, refreshed once when a handler is unknown), the registry whose
    signatures bind arguments, and the actor and idempotency namespace its rows are written with.
    Shared by a client's parts (control, workflows, schedules); the trigger makes its own."""

    def __init__(self, stores: Stores, *, actor: str, registry: Registry | None = None) -> None:
        self.stores = stores
        self.actor = actor
        self.registry = registry
        self.defs: dict[str, JobSpec] = {}
        self.idempotency_namespace: str | None = None
        """Idempotency keys are unique within this namespace too (the API sets the calling token)."""
        self._clock_failed_at = -math.inf

    async def load_definitions(self, names: set[str]) -> None:
        """Refresh the cached declarations once if a handler is not known yet."""
        if names - self.defs.keys():
            rows = await self.stores.db.rows("definitions")
            self.defs = {r.name: _spec(r) for r in rows}
            for name in sorted(names - self.defs.keys()):
                raise UnknownHandler(name)

    async def server_now(self) -> datetime:
        """What a run's relative times count from (run_at of a run due now, now + delay): the Redis
        server's clock, estimated from below (core/hot.ServerClock: one TIME round trip at most every
        5 s), else PostgreSQL's (no sample of the last 30 s: Redis unreachable). Never this host's
        clock, which may be minutes off: runs.run_at is what the outbox relay, drift repair and a
        rebuild after a lost dataset enqueue as a wall-clock instant (docs/clock.md)."""
        clock = self.stores.scripts.clock
        at = time.monotonic()
        if not clock.fresh(at) and at - self._clock_failed_at > clock.REFRESH_S:
            try:
                await self.stores.scripts.sample_clock(0.5)
            except RedisUnavailable:
                self._clock_failed_at = at  # not asked again for REFRESH_S: a submit never waits on it twice
        ms = clock.now_ms()
        if ms is None:
            now: datetime = await self.stores.db.fetchval("db_now")
            return now
        return datetime.fromtimestamp(ms / 1000, _UTC)

    async def prepare(self, requests: Sequence[Submit], *, outbox: bool) -> list[RunRow]:
        """Validate everything before writing anything: bad input changes nothing."""
        names: set[str] = set()
        for r in requests:
            if r.handler.__class__ is not str or r.handler not in names:  # each name checked once
                names.add(validate.text("handler", r.handler))
        await self.load_definitions(names)
        now = await self.server_now()
        defaults: dict[str, tuple[str, int, float, int]] = {}
        tracer = submit_tracer()  # looked up once per batch
        return [self.validated(self.bound(r), now, outbox=outbox, defaults=defaults, tracer=tracer)
                for r in requests]

    def bound(self, req: Submit) -> Submit:
        """A handler this client has registered (Client.register(registry)) checks the arguments
        against its signature here, for string-name submits too: InvalidInput naming the parameter."""
        handler = self.registry.handlers.get(req.handler) if self.registry is not None else None
        if handler is None:  # the declared signature, for producers without the handler (the API, the CLI)
            spec = self.defs.get(req.handler)
            if spec is not None and spec.params is not None:
                validate.check_call(req.handler, spec.params, req.args, req.kwargs)
            return req
        args, kwargs = handler.bind(req.args, req.kwargs)
        return msgspec.structs.replace(req, args=args, kwargs=kwargs)

    def binds(self, handler: Handler[..., Any]) -> bool:
        """`bound` will bind this handle's arguments anyway (its function is the registered one)."""
        registered = self.registry.handlers.get(handler.name) if self.registry is not None else None
        return registered is not None and registered.fn is handler.fn

    async def insert(self, requests: Sequence[Submit] | None, rows_in: Sequence[RunRow],
                     connection: Conn | None, *, own: bool = False) -> Inserted:
        """One round trip to PostgreSQL for a batch of validated rows: (run ids in request order,
        indexes of the rows this call created, queues it created with their epochs). A batch with
        idempotency keys claims them in its scope first (`_insert_keyed`; REQUESTS, the requests as
        given, are their fingerprints' source). `own`: `connection` is this producer's transaction (a
        large submit_many), not a caller's outbox. A fire another trigger already made is not
        created: its id is None."""
        if any(r.idempotency_key is not None for r in rows_in):
            if requests is None:
                raise InvalidInput("an idempotent submit needs its requests", field="idempotency_key")
            if connection is not None:
                return await self._insert_keyed(requests, rows_in, connection)
            async with self.stores.db.transaction() as tx:  # a conflict rolls back the whole batch
                return await self._insert_keyed(requests, rows_in, tx)
        if (connection is None or own) and not any(r.outbox or r.schedule_id is not None for r in rows_in):
            # nothing in the batch can conflict or needs a notify: the cheaper statement
            fresh = await self.stores.db.fetch("insert_runs_fresh", *_fresh_columns(rows_in), self.actor,
                                               conn=connection)
            return _fresh(fresh, len(rows_in))
        rows = await self.stores.db.rows("insert_runs", *run_columns(rows_in), self.actor, conn=connection)
        ids, created, new_queues = _inserted(rows, len(rows_in))
        return ids, created, new_queues  # type: ignore[return-value]

    async def _insert_keyed(self, requests: Sequence[Submit], rows_in: Sequence[RunRow], conn: Conn) -> Inserted:
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
        rows = await db.rows("insert_runs_keyed", *run_columns(rows_in), self.actor, prints, scopes, conn=conn)
        ids, created, new_queues = _inserted(rows, len(requests))
        missing = [i for i, v in enumerate(ids) if v is None]
        if missing:
            found = {(r.scope, r.key): r for r in await db.rows(
                "idempotency_lookup", [scopes[i] for i in missing], [rows_in[i].idempotency_key for i in missing],
                conn=conn)}
            for i in missing:
                key = rows_in[i].idempotency_key
                hit = found.get((scopes[i], key))
                if hit is None:  # a concurrent submit with this key has not committed yet
                    raise InvalidInput(f"idempotency key {key!r} is being submitted concurrently and is not "
                                       "committed yet; retry", field="idempotency_key")
                if hit.request_sha256 and hit.request_sha256 != prints[i]:
                    raise IdempotencyConflict(key or "", scopes[i] or "", hit.run_id)
                ids[i] = hit.run_id
        return ids, created, new_queues  # type: ignore[return-value]

    async def enqueue(self, created: Sequence[int], ids: Sequence[int | None], rows: Sequence[RunRow]) -> set[str]:
        """The created rows to Redis, one enqueue_runs call per queue; returns the queues Redis refused
        for now (RedisUnavailable: logged, left to the reconciler)."""
        refused: set[str] = set()
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
                refused.add(queue)
        return refused

    async def requeue(self, row: RunRow) -> None:
        """Put a recorded run back into Redis as PostgreSQL holds it (a command on a run whose hash
        Redis no longer has): raises what enqueue_runs raises, a value Redis cannot hold included."""
        await self.stores.scripts.enqueue_runs(self.stores.keys(row.queue), [row])

    async def stamp(self, new_queues: dict[str, int]) -> None:
        """A queue this submit created has no history to lose, so its creator may stamp it."""
        await stamp_created(self.stores, new_queues)

    def validated(self, req: Submit, now: datetime, *, outbox: bool,
                  defaults: dict[str, tuple[str, int, float, int]] | None = None, tracer: Any = ...) -> RunRow:
        """`defaults`: the handlers' validated queue, priority, timeout and retries, filled in and
        reused across one batch (a request that gives none of the four takes them as they are);
        `tracer`: submit_tracer() looked up for the batch (... : looked up here)."""
        spec = self.defs[req.handler]
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
        payload = encode_arguments(req.args, req.kwargs, self.stores.settings)
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

    async def deliver(self, ids: Sequence[int | None], send: Sequence[int], rows: Sequence[RunRow],
                      new_queues: dict[str, int] | None = None) -> None:
        """After the commit: stamp the queues the insert created, enqueue the rows at indexes SEND, and
        clear the outbox flag of those Redis took (the outbox relay moves any other)."""
        await self.stamp(new_queues or {})
        refused = await self.enqueue(list(send), ids, rows)
        done = [ids[i] for i in send if rows[i].outbox and rows[i].queue not in refused]
        if done:
            await self.stores.db.execute("clear_outbox", done)
