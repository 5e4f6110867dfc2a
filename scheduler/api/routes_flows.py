"""Endpoints of schedules, workflows and batches."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.responses import Response

from fencepost.api import schemas as S
from fencepost.api.problems import (
    NotFound,
)
from fencepost.api.routing import (
    Ctx,
    _json,
    _page,
    _queue_of,
    _reason_q,
    _row,
    _submit,
    _within_batch_limit,
)
from fencepost.core import cursors
from fencepost.core.errors import InvalidInput
from fencepost.core.schedules import UnknownSchedule
from fencepost.core.views import Schedule
from fencepost.schedules import Schedules, ScheduleUpdate
from fencepost.workflows import PURGED, UnknownBatch, UnknownWorkflow


# -- schedules ---------------------------------------------------------------------------------
def _schedule(row: Schedule | dict[str, Any]) -> Any:
    """A schedule (fencepost.schedules gives a core Schedule, a listing page its rows) as the API answers it."""
    if isinstance(row.get("args_json"), str):  # jsonb as PostgreSQL gives it: the arguments as an object
        row = {**row, "args_json": msgspec.json.decode(row["args_json"])}
    return _row(row, S.Schedule)


async def _visible_schedule(ctx: Ctx) -> tuple[Schedules, str]:
    """The schedule named in the path, if it fires into a queue of the caller's scope; a schedule
    of another queue is as unknown as a missing one (404)."""
    store, name = Schedules(ctx.client), ctx.path("name")
    queue = await store.queue_named(name)
    if queue is None or not ctx.p.in_scope(queue):
        raise UnknownSchedule(name)
    return store, name


async def list_schedules(ctx: Ctx) -> Any:
    """Schedules by name in the caller's scope, a page at a time (`cursor`: X-Next-Cursor)."""
    key = cursors.decode("schedules", ctx.q("cursor")) or [None]
    limit = ctx.q_int("limit", 100, 1, 1000)
    rows = await ctx.client.stores.db.rows("schedule_page_scoped", limit, ctx.p.scope, *key)
    return _page(rows, limit, "schedules", S.Schedule, convert=_schedule)


async def add_schedule(ctx: Ctx) -> Any:
    body: S.ScheduleCreate = ctx.body
    store = Schedules(ctx.client)
    ctx.p.require_queue(await store.queue_of(body))
    return _json(_schedule(await store.add(body, reason=body.reason)), 201)


async def get_schedule(ctx: Ctx) -> Any:
    store, name = await _visible_schedule(ctx)
    return _schedule(await store.get(name))


async def schedule_runs(ctx: Ctx) -> Any:
    store, name = await _visible_schedule(ctx)
    rows = await store.runs(name, ctx.q_int("limit", 10, 1, 1000))
    return [_row(r, S.ScheduleRun) for r in rows if ctx.p.in_scope(r["queue"])]


async def delete_schedule(ctx: Ctx) -> Any:
    store, name = await _visible_schedule(ctx)
    await store.remove(name, reason=_reason_q(ctx))
    return Response(status_code=204)


def _schedule_paused(paused: bool) -> Callable[[Ctx], Awaitable[Any]]:
    async def set_paused(ctx: Ctx) -> Any:
        body: S.ConfigCommand = ctx.body or S.ConfigCommand()
        store, name = await _visible_schedule(ctx)
        return _schedule(await store.set_paused(name, paused, reason=body.reason))

    return set_paused


async def update_schedule(ctx: Ctx) -> Any:
    body: S.ScheduleEdit = ctx.body
    store, name = await _visible_schedule(ctx)
    changes = body.changes()
    changes.pop("reason", None)
    if "queue" in changes or "handler" in changes:  # a scoped admin cannot move a schedule out of its scope
        old = await store.get(name)
        queue = changes.get("queue", old["queue"])
        if queue is None:
            handler = changes.get("handler", old["handler"])
            await ctx.client._load_definitions({handler})
            queue = ctx.client._defs[handler].queue
        ctx.p.require_queue(queue)
    change = ScheduleUpdate(**changes)
    return _schedule(await store.update(name, change, reason=body.reason))


async def run_schedule_now(ctx: Ctx) -> Any:
    body: S.ConfigCommand = ctx.body or S.ConfigCommand()
    store, name = await _visible_schedule(ctx)
    run_id = await store.run_now(name, reason=body.reason)
    return _json(S.Submitted(id=run_id, queue=(await ctx.client.get(run_id))["queue"]), 201)


async def next_fires(ctx: Ctx) -> Any:
    store, name = await _visible_schedule(ctx)
    tz = (await store.get(name))["timezone"]
    fires = await store.upcoming(name, ctx.q_int("n", 5, 1, 100))
    return S.NextFires(name=name, fires=list(fires), timezone=tz)


# -- workflows ---------------------------------------------------------------------------------
async def submit_workflow(ctx: Ctx) -> Any:
    body: S.WorkflowSubmit = ctx.body
    for n in body.nodes:
        ctx.p.require_queue(await _queue_of(ctx.client, n.handler, n.queue))
    wid = await ctx.client.submit_workflow(body.nodes, name=body.name)
    return _json(S.WorkflowSubmitted(id=wid), 201)


async def list_workflows(ctx: Ctx) -> Any:
    """Workflows newest first in the caller's scope, a page at a time (`cursor`: X-Next-Cursor)."""
    key = cursors.decode("workflows", ctx.q("cursor"))
    limit = ctx.q_int("limit", 50, 1, 1000)
    at, wid = (None, None) if key is None else (key[0], _cursor_uuid(key[1]))
    rows = await ctx.client.stores.db.rows("api_list_workflows_scoped", limit, ctx.p.scope, at, wid)
    return _page(rows, limit, "workflows", S.WorkflowSummary)


def _cursor_uuid(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise InvalidInput("cursor is not a cursor of this listing (not a workflow id)", field="cursor") from None


async def _visible_workflow(ctx: Ctx) -> Any:  # a fencepost.core.views.Workflow
    """The workflow, if every node is in the caller's scope (else 404, as for a missing one)."""
    wid = ctx.path("workflow_id")
    wf = await ctx.client.workflow(wid)
    if not all(ctx.p.in_scope(n["queue"]) for n in wf["nodes"]):
        raise UnknownWorkflow(wid)
    return wf


async def get_workflow(ctx: Ctx) -> Any:
    return _row(await _visible_workflow(ctx), S.Workflow)


async def retry_workflow(ctx: Ctx) -> Any:
    wf = await _visible_workflow(ctx)
    body: S.WorkflowRetry = ctx.body or S.WorkflowRetry()
    done = await ctx.client.retry_workflow(wf["id"], recompute=body.recompute, reason=body.reason)
    return S.WorkflowRetried(id=wf["id"], done=done)


# -- batches -----------------------------------------------------------------------------------
async def create_batch(ctx: Ctx) -> Any:
    """A batch with its callbacks; a scoped token may only name its queues (members and callbacks)."""
    body: S.BatchCreate = ctx.body
    _within_batch_limit(ctx, len(body.runs))
    if ctx.request.headers.get("idempotency-key") is not None:
        raise InvalidInput("a batch is not idempotent as a whole: send it without an Idempotency-Key",
                           field="Idempotency-Key")
    callbacks = [c for c in (body.on_complete, body.on_success) if c is not None]
    for r in [*body.runs, *callbacks]:
        ctx.p.require_queue(await _queue_of(ctx.client, r.handler, r.queue))
    b = await ctx.client.submit_batch([_submit(r, None) for r in body.runs],
                                      on_complete=None if body.on_complete is None else _submit(body.on_complete, None),
                                      on_success=None if body.on_success is None else _submit(body.on_success, None),
                                      name=body.name)
    return _json(S.BatchCreated(id=b.id, run_ids=b.run_ids, on_complete=b.on_complete, on_success=b.on_success), 201)


async def get_batch(ctx: Ctx) -> Any:
    """Counts by state and the callbacks, if every member and callback is in the caller's scope (else 404,
    as for a missing batch)."""
    raw = ctx.path("batch_id")
    try:
        bid = uuid.UUID(raw)
    except ValueError:
        raise InvalidInput(f"batch id must be a UUID, not {raw!r}", field="batch_id") from None
    queues = await ctx.client.stores.db.fetchval("api_batch_queues", bid)
    try:
        if (ctx.p.queues and not queues) or not all(ctx.p.in_scope(q) for q in queues or ()):
            raise UnknownBatch(bid)
        view = await ctx.client.batch_view(bid)
        if ctx.p.queues and (PURGED in view["counts"] or any(
                cb is not None and cb["status"] == PURGED for cb in (view["on_complete"], view["on_success"]))):
            raise UnknownBatch(bid)  # a purged run's queue is unknown: not shown to be in the scope
        return msgspec.convert(view, S.Batch)
    except UnknownBatch:
        raise NotFound(f"no batch with id {bid}", batch_id=str(bid)) from None
