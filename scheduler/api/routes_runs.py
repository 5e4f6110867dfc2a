"""Endpoints of runs: submit (one and in batches), list and read runs, their attempts, events and
checkpoint, the fleet's history and its stream, operator commands, queues, dead letter and review."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import msgspec
from starlette.responses import Response

from fencepost.api import schemas as S
from fencepost.api import stream
from fencepost.api.bulk import bulk as bulk_action
from fencepost.api.routing import (
    _BIGINT,
    _UTC,
    Ctx,
    _addr,
    _enc,
    _json,
    _legacy_cursor,
    _live,
    _page,
    _q_text,
    _queue_of,
    _row,
    _run_for,
    _submit,
    _valid_queue,
    _within_batch_limit,
)
from fencepost.core import cursors, hotreads, validate
from fencepost.core.errors import InvalidInput
from fencepost.core.fairness import due_summary
from fencepost.core.models import decode_payload, decode_result
from fencepost.core.states import Status


def _idem_header(ctx: Ctx) -> str | None:
    key = ctx.request.headers.get("idempotency-key")
    if key is not None:
        try:
            validate.text("idempotency_key", key)
        except InvalidInput as exc:
            raise InvalidInput(str(exc).replace("idempotency_key", "Idempotency-Key", 1),
                               field="Idempotency-Key") from None
    return key


# -- submit and read ---------------------------------------------------------------------------
async def submit(ctx: Ctx) -> Any:
    req: S.SubmitRequest = ctx.body
    queue = await _queue_of(ctx.client, req.handler, req.queue)
    ctx.p.require_queue(queue)
    sub = _submit(req, _idem_header(ctx))
    run_id = (await ctx.client.submit_many([sub]))[0]
    if sub.idempotency_key is not None:  # possibly an earlier run: describe it as stored
        queue = (await ctx.client.get(run_id))["queue"]
    return _json(S.Submitted(id=run_id, queue=queue), 201)


async def submit_batch(ctx: Ctx) -> Any:
    batch: S.SubmitBatch = ctx.body
    _within_batch_limit(ctx, len(batch.runs))
    if not batch.runs:
        raise InvalidInput("a batch needs at least one run", field="runs")
    for r in batch.runs:
        ctx.p.require_queue(await _queue_of(ctx.client, r.handler, r.queue))
    key = _idem_header(ctx)
    reqs = [_submit(r, f"{key}:{i}" if key else None) for i, r in enumerate(batch.runs)]
    return _json(S.SubmittedBatch(ids=await ctx.client.submit_many(reqs)), 201)


_SORTS = ("id", "created_at", "finished_at", "attempt", "handler", "status")


COUNT_CAP = 10_000
"""The runs list counts its matches up to this (X-Total-Count; X-Total-Count-Exact: false above it)."""


ARG_WINDOW = 20_000
"""The argument search (`arg`) looks at the newest this many runs (by id): a bounded scan of payloads at any
table size (X-Search-Window says so). Older runs are found by their other filters (id, time, keys)."""


QUEUE_RANGES = 600
"""Within a set of queues (a queue filter, a scoped token), the id and status sorts read one range of
runs_queue_status per queue and state, up to this many ranges; more fall back to the plain filter."""


def _unserved_sort(sort: str) -> InvalidInput:
    return InvalidInput(
        f"sort by {sort} is offered within a queue (status), with a filter on that column, or when the filters "
        f"match at most {COUNT_CAP:,} runs (X-Total-Count-Exact: true); these match more. Narrow the filters "
        "(queue, state, handler, time) or sort by id, created_at or finished_at", field="sort")


async def list_runs(ctx: Ctx) -> Any:
    """Filtered, sorted, paged by keyset cursor in every sort (`cursor`, the previous page's X-Next-Cursor),
    by `offset`, or below an id (`before`); the count of matches, up to COUNT_CAP, in X-Total-Count so a
    page can say "51-100 of 734".

    Every page is read through an index, none by sorting the table (issue 24; an index per sort would be paid
    by every submit and finish, issue 23): id and created_at have theirs; within a set of queues (a queue
    filter or a scoped token) id and status read runs_queue_status range by range; a sort by the column a
    filter fixes is the id sort. Attempt, handler and status otherwise are a top-N sort of the matches, offered
    only when they are at most COUNT_CAP (the count is what says so), else a 422 naming `sort`."""
    p = ctx.p
    sort, order = _sort_and_order(ctx)
    rid = ctx.q_int("id", 0, 1, _BIGINT) or None
    before = ctx.q_int("before", _BIGINT, 1, _BIGINT)
    queue, status, handler = ctx.q_queue(), ctx.q_status(), _q_text(ctx, "handler")
    filters = [queue, status, handler, ctx.q_time("since"), ctx.q_time("until")]
    owner = p.owner if p.role == "producer" else None
    who = [p.scope, owner, before]
    more = [rid, _q_text(ctx, "tenant"), _q_text(ctx, "concurrency_key"), _q_text(ctx, "idempotency_key"),
            _q_text(ctx, "arg")]
    kind = cursors.run_sort_kind(sort, order)
    key = cursors.decode(kind, ctx.q("cursor"))
    limit, offset = ctx.q_int("limit", 50, 1, 1000), ctx.q_int("offset", 0, 0, COUNT_CAP)
    if key is not None and offset:
        raise InvalidInput("send either cursor or offset, not both", field="cursor")
    db = ctx.client.stores.db
    floor = 0 if more[-1] is None else await _arg_floor(db)
    queues = [queue] if queue is not None else p.scope
    states = [status] if status is not None else [s.value for s in Status]
    ranges = queues is not None and len(queues) * len(states) <= QUEUE_RANGES
    fixed = (sort == "status" and status is not None) or (sort == "handler" and handler is not None)
    n: int | None = None
    if sort in ("attempt", "handler", "status") and not fixed and not (sort == "status" and ranges):
        n = await db.fetchval("dashboard_runs_count", *filters, *who, *more, COUNT_CAP + 1, floor)
        if n > COUNT_CAP:
            raise _unserved_sort(sort)
    after_id = None if key is None else key[-1]
    if ranges and (sort in ("id", "status") or fixed):
        by = "status" if sort == "status" and not fixed else "id"
        rows = await db.rows("api_runs_page_by_queue", queues, states, *filters[2:], limit, owner, before, *more,
                             floor, by, order, key is not None, key[0] if key is not None and by == "status" else None,
                             after_id, offset)
    elif offset:
        rows = await db.rows("dashboard_runs", *filters, limit, *who, *more, sort, order, offset, floor)
    elif sort in ("id", "created_at") or fixed:
        at = key[0] if key is not None and sort == "created_at" else None
        rows = await db.rows("api_runs_page_indexed", *filters, limit, *who, *more, "id" if fixed else sort, order,
                             floor, key is not None, at, after_id)
    elif sort == "finished_at":
        rows = await db.rows("api_runs_page_finished", *filters, limit, *who, *more, order, floor,
                             key is not None, None if key is None else key[0], after_id)
    else:
        v = key[0] if key is not None else None
        rows = await db.rows("api_runs_page_other", *filters, limit, *who, *more, sort, order, floor, key is not None,
                             v if sort == "attempt" else None, v if sort in ("handler", "status") else None, after_id)
    if n is None:
        n = await db.fetchval("dashboard_runs_count", *filters, *who, *more, COUNT_CAP + 1, floor)
    return Response(_enc.encode([_row(r, S.RunSummary) for r in rows]), media_type="application/json",
                    headers=_list_headers(n, cursors.after(kind, rows, limit), searched=more[-1] is not None))


def _sort_and_order(ctx: Ctx) -> tuple[str, str]:
    sort, order = ctx.q("sort", "id"), ctx.q("order", "desc")
    if sort not in _SORTS:
        raise InvalidInput(f"sort must be one of {', '.join(_SORTS)}, not {sort!r}", field="sort")
    if order not in ("asc", "desc"):
        raise InvalidInput(f"order must be asc or desc, not {order!r}", field="order")
    return sort, order


async def _arg_floor(db: Any) -> int:
    """The argument search reads the newest ARG_WINDOW runs' payloads, not the table: the id below them."""
    return max(0, int(await db.fetchval("runs_max_id")) - ARG_WINDOW)


def _list_headers(n: int, next_cursor: str | None, *, searched: bool) -> dict[str, str]:
    """The count of matches (N, up to COUNT_CAP), the next page's cursor, and the argument search's window."""
    headers = {"X-Total-Count": str(min(n, COUNT_CAP)), "X-Total-Count-Exact": "true" if n <= COUNT_CAP else "false"}
    if next_cursor is not None:
        headers["X-Next-Cursor"] = next_cursor
    if searched:
        headers["X-Search-Window"] = str(ARG_WINDOW)
    return headers


ARGS_CAP = 64 * 1024
"""The run page shows arguments up to this many bytes of JSON (a larger payload: its size and a prefix)."""


def _arguments(payload: bytes | None) -> dict[str, Any]:
    if payload is None:
        return {}
    args, kwargs = decode_payload(payload)
    size = len(_enc.encode([args, kwargs]))
    if size <= ARGS_CAP:
        return {"args": args, "kwargs": kwargs, "arguments_bytes": size}
    return {"arguments_bytes": size, "arguments_truncated": True,
            "arguments_preview": _enc.encode([args, kwargs])[:ARGS_CAP].decode(errors="ignore")}


async def get_run(ctx: Ctx) -> Any:
    run = await _run_for(ctx, ctx.run_id())
    return _row({**await _live(ctx, run), **_arguments(run.get("payload"))}, S.Run)


async def run_attempts(ctx: Ctx) -> Any:
    run_id = ctx.run_id()
    await _run_for(ctx, run_id)
    return [_row(r, S.Attempt) for r in await ctx.client.attempts(run_id)]


async def run_events(ctx: Ctx) -> Any:
    """The run's timeline in the order recorded, a page at a time (`limit`, `cursor`: X-Next-Cursor)."""
    run_id = ctx.run_id()
    key = cursors.decode("run_events", ctx.q("cursor")) or [None, None, None]
    limit = ctx.q_int("limit", 1000, 1, 1000)
    await _run_for(ctx, run_id)
    rows = await ctx.client.stores.db.rows("run_events_page", run_id, limit, *key)
    return _page(rows, limit, "run_events", S.Event, {"run_id": run_id})


async def run_checkpoint(ctx: Ctx) -> Any:
    run_id = ctx.run_id()
    await _run_for(ctx, run_id)
    row = await ctx.client.stores.db.row("get_checkpoint", run_id)
    if row is None or row.state is None:
        return _json(None)
    return _row(msgspec.structs.replace(row, state=decode_result(row.state)), S.Checkpoint)


async def fleet_events(ctx: Ctx) -> Any:
    """The fleet's history in the caller's scope, newest first, a page at a time (`cursor`: X-Next-Cursor)."""
    since = ctx.q_time("since") or datetime.now(_UTC) - timedelta(hours=1)
    key = cursors.decode("events", ctx.q("cursor")) or [None, None, None, None]
    limit = ctx.q_int("limit", 100, 1, 1000)
    rows = await ctx.client.stores.db.rows("fleet_events_page", since, _q_text(ctx, "type"), ctx.q_queue(), limit,
                                           ctx.p.scope, *key)
    return _page(rows, limit, "events", S.Event)


async def fleet_events_stream(ctx: Ctx) -> Any:
    """GET /v1/events live (Server-Sent Events, fencepost.api.stream): what is recorded from now on,
    filtered as /v1/events filters (type, queue, the token's scope), until `duration` seconds passed
    or the token stops being valid."""
    kind, queue = _q_text(ctx, "type"), ctx.q_queue()
    duration = ctx.q_int("duration", 300, 0, 3600)
    p, request, tokens = ctx.p, ctx.request, ctx.api.tokens

    def accept(item: stream.Item) -> bool:
        seen = p.in_scope(item.queue) if item.queue is not None else not p.queues
        return seen and queue in (None, item.queue) and kind in (None, item.type)

    async def recheck() -> None:
        await tokens.authenticate(request.headers.get("authorization"), _addr(request))

    hub = stream.hub_for(request.app.state, ctx.client.stores.db)
    return stream.sse_response(hub, accept, duration_s=duration, recheck=recheck, token_id=p.id)


# -- commands ----------------------------------------------------------------------------------
def _command(verb: str) -> Callable[[Ctx], Awaitable[Any]]:
    async def run_command(ctx: Ctx) -> Any:
        run_id = ctx.run_id()
        await _run_for(ctx, run_id, act=True)
        body: S.CommandRequest = ctx.body or S.CommandRequest()
        state = await getattr(ctx.client, verb)(run_id, reason=body.reason, expected_version=body.expected_version)
        return S.CommandResult(id=run_id, command=verb, state=state)

    run_command.__name__ = f"{verb}_run"
    return run_command


async def resolve(ctx: Ctx) -> Any:
    run_id = ctx.run_id()
    await _run_for(ctx, run_id, act=True)
    body: S.ResolveRequest = ctx.body
    state = await ctx.client.resolve(run_id, as_=body.as_, reason=body.reason, expected_version=body.expected_version)
    return S.CommandResult(id=run_id, command="resolve", state=state)


def _queue_command(paused: bool) -> Callable[[Ctx], Awaitable[Any]]:
    async def queue_command(ctx: Ctx) -> Any:
        name = _valid_queue(ctx.path("queue"))
        ctx.p.require_queue(name)
        body: S.ConfigCommand = ctx.body or S.ConfigCommand()
        if paused:
            await ctx.client.pause_queue(name, reason=body.reason)
        else:
            await ctx.client.resume_queue(name, reason=body.reason)
        return S.QueueResult(queue=name, paused=paused)

    return queue_command


async def bulk(ctx: Ctx) -> Any:
    """A count (428 with a handle for the counted set) or its confirm: exactly the counted runs that
    have not moved since (fencepost.api.bulk)."""
    name = _valid_queue(ctx.path("queue"))
    ctx.p.require_queue(name)
    cfg = ctx.api.config
    return await bulk_action(ctx.client, ctx.p, name, ctx.body, cap=cfg.bulk_cap, ttl=float(cfg.bulk_handle_ttl_s))


async def list_queues(ctx: Ctx) -> Any:
    p = ctx.p
    window = ctx.q_int("window", 300, 10, 86400)
    rows = await ctx.client.stores.db.rows("api_queue_figures", float(window), p.scope)
    now = time.time()
    out = []
    for row in rows:
        due, age = await due_summary(ctx.client.stores, row.queue, now=now)
        depth = await hotreads.queue_depth(ctx.client.stores.redis, ctx.client.stores.keys(row.queue))
        out.append(S.QueueStats(queue=row.queue, paused=row.paused, due=due, delayed=depth.delayed,
                                active=depth.active,
                                oldest_due_age_s=round(age, 3), finished_last_window=row.finished,
                                throughput_per_min=round(row.finished * 60 / window, 3),
                                schedule_lag_s=None if row.lag_s is None else round(float(row.lag_s), 3),
                                window_s=window))
    return out


async def _dead_or_review(ctx: Ctx, review: bool) -> Response:
    """Filtered by the caller's scope before the limit (a scoped token saw [] once newer failures of other
    queues filled the page), newest finished first, paged by cursor."""
    limit = ctx.q_int("limit", 50, 1, 1000)
    kind = "review" if review else "dead"
    raw = ctx.q("cursor")
    at, rid = _legacy_cursor(raw) or cursors.decode(kind, raw) or [None, None]
    rows = await ctx.client.stores.db.rows("api_dead_letter_page", ctx.q_queue(), ctx.p.scope, limit, at, rid, review)
    return _page(rows, limit, kind, S.RunSummary, {"status": "FAILED", "reason": "review"} if review else None)


async def dead_letter(ctx: Ctx) -> Any:
    return await _dead_or_review(ctx, False)


async def review(ctx: Ctx) -> Any:
    return await _dead_or_review(ctx, True)
