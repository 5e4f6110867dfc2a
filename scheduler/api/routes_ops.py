"""The routes the dashboard's operations views need (issue 24): the state groups it renders with,
a run's timeline after a cursor, the dead-letter / review / retries / scheduled lists paged by
cursors, bulk actions over those lists (and over the runs list's filter) that act on exactly the
runs counted, per-queue workers and latency, per-handler charts, and a batches list.

Registered by `fencepost.api.routes`, which appends `routes(RouteSpec, ...)` to its ROUTES and hands
over the helpers every route shares (this module cannot import that one: it imports this one), so
Starlette routing, the OpenAPI document and the role x scope matrix test see them as every other route. The same steps apply:
token, role, rate limit, body decoded into its Struct; every listing filters by the token's scope
before it limits; every action writes its audit row before any run changes.

Bulk actions follow the queue bulk's protocol (docs/api.md, `fencepost.api.bulk`): a count stores
the ids with each run's live state and version under a short-lived handle bound to the counting
token and answers 428 {matched, acting, handle, sample, expires_in_s}; the confirm {handle, confirm}
acts on exactly those runs, each only if it has not moved (the command's own compare-and-set on the
counted version backs the check), and answers {matched, acted, changed, skipped}. For pages,
`POST /v1/ops/bulk/count` answers the same count with 200: a browser logs every 4xx answer as a
console error, and a count is an ordinary answer there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from msgspec import Meta

from fencepost.api import bulk as bulk_
from fencepost.api import schemas as S
from fencepost.api.problems import ApiError, BulkTooLarge
from fencepost.core import cursors, fairness, hotreads, states, stats, validate
from fencepost.core import workers as fleet
from fencepost.core.errors import InvalidInput
from fencepost.core.states import TERMINAL, Status
from fencepost.core.validate import meta

if TYPE_CHECKING:
    from fencepost.api.routes import Ctx

__all__ = ["routes"]

_enc = msgspec.json.Encoder()
READ = ("operator", "admin")
_BIGINT = 2**63 - 1
BULK_TTL_S = 300.0
"""How long a counted set waits for its confirmation."""
SAMPLE = 20
"""How many of the counted ids a count shows."""

ListName = Literal["dead", "review", "retries", "scheduled", "runs", "ids"]
"""dead: the dead letter; review: the review queue; retries: RETRY_WAIT runs; scheduled: PENDING runs due
later; runs: the runs list's filter; ids: runs ticked on a page."""
Action = Literal["retry", "cancel", "pause", "resume", "restart", "run_now", "delete", "resolve_succeeded",
                 "resolve_failed"]
"""The commands of a bulk action; run_now makes a waiting run due now (one transition, lua/run_now.lua),
delete moves a finished run out of every list into the archive (its history stays), resolve_succeeded /
resolve_failed close review runs (the review list, or ticked review runs)."""
_LISTS = ("dead", "review", "retries", "scheduled")


# -- schemas ------------------------------------------------------------------------------------
class StateGroups(msgspec.Struct, kw_only=True):
    """fencepost.core.states as the dashboard renders with it: every state, every named group and the
    states each command takes."""

    states: list[str]
    groups: dict[str, list[str]]
    commands: dict[str, list[str]]
    lists: dict[str, list[str]]
    """The states each of the dashboard's lists holds (dead, review, retries, scheduled)."""


class OpsPage(msgspec.Struct, kw_only=True):
    """One page of a list, and the cursor of the next one (null: the last page)."""

    runs: list[S.RunSummary]
    next: str | None = None


class Timeline(msgspec.Struct, kw_only=True):
    """A run's timeline recorded since a cursor, and the cursor to ask with next time."""

    run_id: int
    events: list[S.Event]
    cursor: str | None
    """Ask with `after` = this next time (null: nothing recorded yet)."""
    last_id: int | None = None
    """With `more`: ask with `after` = cursor and `from_id` = this for the rest of this answer."""
    more: bool = False


class BulkFilter(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    queue: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")] | None = None
    handler: Annotated[str, meta("handler")] | None = None
    status: Status | None = None
    tenant: Annotated[str, meta("tenant")] | None = None
    concurrency_key: Annotated[str, meta("concurrency_key")] | None = None
    idempotency_key: Annotated[str, meta("idempotency_key")] | None = None
    arg: Annotated[str, meta("name")] | None = None
    since: datetime | None = None
    until: datetime | None = None
    id: Annotated[int, Meta(ge=1, le=_BIGINT)] | None = None


class OpsBulkRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A count (no `handle`) or its confirm (`handle`, and `confirm` equal to the count's `acting`)."""

    action: Action
    source: ListName = msgspec.field(default="runs", name="list")
    """Which list (JSON field `list`)."""
    filter: BulkFilter = msgspec.field(default_factory=BulkFilter)
    ids: Annotated[list[Annotated[int, Meta(ge=1, le=_BIGINT)]], Meta(max_length=1000)] = []
    """With list "ids": exactly these runs (those in the token's scope)."""
    handle: Annotated[str, Meta(pattern="^[0-9a-f]{32}$")] | None = None
    confirm: Annotated[int, Meta(ge=0, le=2**31)] = 0
    reason: S.Reason = ""


class OpsBulkCount(msgspec.Struct, kw_only=True):
    """A counted set (the body of the 428, or of POST /v1/ops/bulk/count's 200)."""

    matched: int
    acting: int
    handle: str
    sample: list[int]
    expires_in_s: float
    action: str
    source: str = msgspec.field(name="list")


class QueueWorker(msgspec.Struct, kw_only=True):
    id: str
    host: str
    busy: int
    """Runs of this queue the worker holds now."""
    held: int
    """Runs the worker holds over all its queues."""
    concurrency: int
    stopping: bool = False


class QueueOps(msgspec.Struct, kw_only=True):
    queue: str
    paused: bool
    due: int
    """Due now, waiting for a worker."""
    overdue: int
    """Delayed or retrying runs whose time has come but that no worker has promoted yet (a queue with no
    workers keeps them here)."""
    scheduled: int
    """Delayed or retrying runs due later."""
    running: int
    latency_s: float
    """Age of the oldest due run (now - its run_at)."""
    max_running: int | None
    workers: list[QueueWorker]
    slots: int
    """Slots of the workers serving the queue (their concurrency, summed)."""


class HandlerTotal(msgspec.Struct, kw_only=True):
    handler: str
    started: int
    succeeded: int
    failed: int
    run_p50_ms: float | None = None
    run_p95_ms: float | None = None


class HandlerPoint(msgspec.Struct, kw_only=True):
    t: datetime
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    run_p50_ms: float | None = None
    run_p95_ms: float | None = None


class HandlerStats(msgspec.Struct, kw_only=True):
    window: str
    step_s: int
    queue: str | None
    handlers: list[HandlerTotal]
    handler: str | None = None
    points: list[HandlerPoint] = []


class BatchSummary(msgspec.Struct, kw_only=True):
    id: str
    name: str | None
    created_at: datetime
    settled_at: datetime | None
    on_complete: int | None
    on_success: int | None
    members: int
    succeeded: int
    failed: int
    cancelled: int
    waiting: int
    archived: int
    queues: list[str]


class BatchPage(msgspec.Struct, kw_only=True):
    batches: list[BatchSummary]
    next: str | None = None
    """The next page's cursor, sent back as `cursor` (null: the end)."""


BulkSkip = S.BulkSkip


class OpsBulkResult(msgspec.Struct, kw_only=True):
    """What a confirmed bulk action did (the queue bulk's shape, docs/api.md)."""

    matched: int
    """How many runs matched when counted."""
    acted: int
    """How many runs the action changed (len(changed))."""
    changed: list[int]
    skipped: list[BulkSkip]
    """Counted runs left alone: they moved (state or version) since the count, or refused."""
    results: dict[str, int]
    """The states the changed runs were left in, counted (ARCHIVED: deleted from the lists)."""
    handle: str


class CountedSet(ApiError):
    status, slug, title = 428, "bulk-not-confirmed", "Confirm the number of runs the bulk action affects"


# -- what the routes share with the others (handed over by fencepost.api.routes) -----------------------
class _Shared:
    """The helpers of fencepost.api.routes these routes use: the run if the caller may see it, a row as
    a Struct, a text query parameter checked."""

    run_for: Callable[..., Awaitable[dict[str, Any]]]
    row: Callable[[Any, type], Any]
    q_text: Callable[[Any, str], str | None]


_h = _Shared()


# -- state groups ------------------------------------------------------------------------------
def _names(group: frozenset[Status]) -> list[str]:
    return sorted(s.value for s in group)


def state_groups() -> StateGroups:
    """The one copy of the states, rendered for the page (its lists used to be typed into app.js)."""
    S_ = Status
    return StateGroups(
        states=[s.value for s in Status],
        groups={k: _names(v) for k, v in states.GROUPS.items()},
        commands={"pause": _names(states.PAUSE_AT_ONCE | {S_.RUNNING}), "stop": [S_.RUNNING.value],
                  "cancel": _names(states.CANCEL_AT_ONCE | states.ACTIVE), "resume": _names(states.RESUMABLE),
                  "restart": _names(states.RESTARTABLE), "retry": _names(states.FAILED_FOR_GOOD),
                  "run_now": _names(states.PAUSE_AT_ONCE), "delete": _names(TERMINAL)},
        lists={"dead": _names(states.DEAD), "review": [S_.FAILED.value], "retries": [S_.RETRY_WAIT.value],
               "scheduled": [S_.PENDING.value]})


async def get_states(ctx: Ctx) -> Any:
    return state_groups()


# -- a run's timeline after a cursor --------------------------------------------------------------
async def run_timeline(ctx: Ctx) -> Any:
    """The run's timeline recorded since the cursor `after` (what the last answer said): the page asks
    for what was recorded since its last look, never the whole history again. Each look reaches back
    TIMELINE_LOOKBACK_S (a recorder batch that began earlier can commit later), so an answer may repeat
    rows the page has: it keeps one per id."""
    run_id = ctx.run_id()
    await _h.run_for(ctx, run_id)
    after = _micros(ctx, "after")
    from_id = ctx.q_int("from_id", 0, -_BIGINT, _BIGINT) if ctx.q("from_id") is not None else None
    if from_id is not None and after is None:
        raise InvalidInput("from_id goes with the after of the same answer", field="from_id")
    limit = ctx.q_int("limit", 500, 1, 1000)
    rows = await ctx.client.stores.db.rows("ops_run_events_after", run_id, after, TIMELINE_LOOKBACK_S, from_id,
                                           limit + 1)
    page = rows[:limit]
    events = [_h.row({**msgspec.structs.asdict(r), "run_id": run_id}, S.Event) for r in page]
    seen = max((r.recorded_at for r in page), default=after)
    more = len(rows) > limit
    return Timeline(run_id=run_id, events=events, cursor=None if seen is None else str(_to_micros(seen)),
                    last_id=page[-1].id if more else None, more=more)


TIMELINE_LOOKBACK_S = 5.0


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _to_micros(t: datetime) -> int:
    return (t - _EPOCH) // timedelta(microseconds=1)


def _micros(ctx: Ctx, name: str) -> datetime | None:
    raw = ctx.q(name)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise InvalidInput(f"{name} must be the cursor of the last answer, not {raw[:40]!r}", field=name)
    return _EPOCH + timedelta(microseconds=int(raw))


# -- lists ---------------------------------------------------------------------------------------
def _cursor(ctx: Ctx) -> tuple[datetime | None, int | None]:
    raw = ctx.q("cursor")
    if raw is None:
        return None, None
    t, _, i = raw.rpartition("_")
    try:
        if not (t.isascii() and t.isdigit() and i.isascii() and i.isdigit() and len(t) <= 18):
            raise ValueError(raw)
        when = _EPOCH + timedelta(microseconds=int(t))
    except (ValueError, OverflowError, OSError):
        raise InvalidInput(f"cursor must be a cursor from the previous page's `next`, not {raw[:40]!r}",
                           field="cursor") from None
    return when, int(i)


def _next_cursor(t: datetime | None, rid: int) -> str:
    return f"{0 if t is None else _to_micros(t)}_{rid}"


async def _waiting(db: Any, name: str, *args: Any) -> list[Any]:
    """The retries-waiting or the scheduled list: two statements, each with its state written out (the
    partial indexes they page by are chosen when the statement is planned)."""
    if name == "retries":
        return list(await db.rows("ops_list_retries", *args))
    return list(await db.rows("ops_list_scheduled", *args))


async def list_page(ctx: Ctx) -> Any:
    """GET /v1/ops/lists/{list}: a page of the dead letter, the review queue, the retries waiting or the
    scheduled runs, filtered by queue and handler, within the token's scope before the limit."""
    name = ctx.path("list")
    if name not in _LISTS:
        raise InvalidInput(f"list must be one of {', '.join(_LISTS)}, not {name[:40]!r}", field="list")
    queue, handler = ctx.q_queue(), _h.q_text(ctx, "handler")
    limit = ctx.q_int("limit", 50, 1, 1000)
    at, rid = _cursor(ctx)
    db = ctx.client.stores.db
    if name in ("dead", "review"):
        rows = await db.rows("ops_list_finished", name, queue, handler, ctx.p.scope, at, rid, limit + 1)
    else:
        rows = await _waiting(db, name, queue, handler, ctx.p.scope, at, rid, limit + 1)
    runs = [_h.row(r, S.RunSummary) for r in rows[:limit]]
    nxt = None
    if len(rows) > limit:
        last = rows[limit - 1]
        nxt = _next_cursor(last.finished_at if name in ("dead", "review") else last.run_at, last.id)
    return OpsPage(runs=runs, next=nxt)


# -- bulk over a list ------------------------------------------------------------------------------
_TAKES = {name: set(states_) for name, states_ in state_groups().commands.items()}
_RESOLVE = {"resolve_succeeded": "succeeded", "resolve_failed": "failed"}
"""Bulk actions that close review runs, and the outcome each records."""
for _a in _RESOLVE:
    _TAKES[_a] = set(state_groups().lists["review"])


async def _select(ctx: Ctx, body: OpsBulkRequest, cap: int) -> list[Any]:
    """The runs the bulk's list and filter select now (at most cap + 1: more is refused)."""
    db, scope, f = ctx.client.stores.db, ctx.p.scope, body.filter
    if f.queue is not None:
        ctx.p.require_queue(f.queue)
    if body.source == "ids":
        if not body.ids:
            raise InvalidInput("list ids needs the ids of the runs", field="ids")
        return list(await db.rows("ops_runs_by_id", sorted(set(body.ids)), scope))
    if body.ids:
        raise InvalidInput(f"ids apply to list ids only, not {body.source}", field="ids")
    if body.source == "runs":
        return list(await db.rows("ops_select_runs", f.queue, f.status, f.handler, f.since, f.until, scope, f.id,
                                  f.tenant, f.concurrency_key, f.idempotency_key, f.arg, cap + 1))
    for extra in ("status", "tenant", "concurrency_key", "idempotency_key", "arg", "since", "until", "id"):
        if getattr(f, extra) is not None:
            raise InvalidInput(f"the {body.source} list filters by queue and handler, not {extra}", field=extra)
    if body.source in ("dead", "review"):
        return list(await db.rows("ops_list_finished", body.source, f.queue, f.handler, scope, None, None, cap + 1))
    return list(await _waiting(db, body.source, f.queue, f.handler, scope, None, None, cap + 1))


def _selection(body: OpsBulkRequest) -> dict[str, Any]:
    f = msgspec.to_builtins(body.filter)
    return {"list": body.source, "filter": {k: v for k, v in f.items() if v is not None}}


def _allowed(ctx: Ctx, body: OpsBulkRequest) -> None:
    """Operators act on the lists and on ticked runs, as they do run by run; a filter over the whole runs
    list (as the queue bulk) and deleting runs are for admins."""
    if body.source == "runs" or body.action == "delete":
        ctx.p.require("admin")


async def _count(ctx: Ctx, body: OpsBulkRequest) -> OpsBulkCount:
    _allowed(ctx, body)
    cap = ctx.api.config.bulk_cap
    rows = await _select(ctx, body, cap)
    if len(rows) > cap:
        raise BulkTooLarge(f"more than {cap} runs match; the server acts on at most {cap} at once. Narrow the "
                           "selection (queue, handler); nothing changed", matched=len(rows), limit=cap, field="filter")
    resolving = body.action in _RESOLVE
    if resolving and body.source not in ("review", "ids"):
        raise InvalidInput(f"{body.action} closes review runs: list review or ids, not {body.source}", field="list")
    now = await bulk_.live(ctx.client, [(r.id, r.queue) for r in rows])
    takes = _TAKES[body.action]
    chosen = []
    for r in rows:
        got = now.get(r.id) or bulk_.Live(state=r.status, version=int(r.version))
        if got.state in takes and (not resolving or r.reason == "review"):  # Redis is ahead: it decides
            chosen.append((r.id, r.queue, got))
    handle = await bulk_.store(ctx.client, ctx.p, action=body.action, source=body.source, queue=None,
                               selection=_selection(body), matched=len(rows), chosen=chosen, ttl=BULK_TTL_S)
    return OpsBulkCount(matched=len(rows), acting=len(chosen), handle=handle,
                        sample=[i for i, _, _ in chosen[:SAMPLE]], expires_in_s=BULK_TTL_S, action=body.action,
                        source=body.source)


async def bulk_count(ctx: Ctx) -> Any:
    """POST /v1/ops/bulk/count: the count, answered 200 (for pages)."""
    body: OpsBulkRequest = ctx.body
    if body.handle is not None:
        raise InvalidInput("a count takes no handle (confirm with POST /v1/ops/bulk)", field="handle")
    validate.text("reason", body.reason)
    return await _count(ctx, body)


async def run_now(ctx: Ctx) -> Any:
    """POST /v1/runs/{run_id}/run_now: a scheduled or retry-waiting run due now, in one transition (event
    `run_now`, with the token and the reason: the audit view lists it); compare-and-set on
    `expected_version` when given."""
    run_id = ctx.run_id()
    await _h.run_for(ctx, run_id, act=True)
    body: S.CommandRequest = ctx.body or S.CommandRequest()
    state = await ctx.client.control.run_now(run_id, reason=body.reason, expected_version=body.expected_version)
    return S.CommandResult(id=run_id, command="run_now", state=state)


async def _delete(ctx: Ctx, rid: int, version: int) -> str:
    row = await ctx.client.stores.db.row("ops_archive_run", rid, version)
    if row is None:
        raise InvalidInput(f"run {rid} moved (or is part of a workflow) since it was counted; not deleted", field="ids")
    return "ARCHIVED"


async def _act(ctx: Ctx, action: str, rid: int, version: int, reason: str) -> str:
    if action == "run_now":
        return await ctx.client.control.run_now(rid, reason=reason, expected_version=version)
    if action == "delete":
        return await _delete(ctx, rid, version)
    if action in _RESOLVE:
        return await ctx.client.resolve(rid, as_=_RESOLVE[action], reason=reason, expected_version=version)
    state: str = await getattr(ctx.client, action)(rid, reason=reason, expected_version=version)
    return state


async def bulk(ctx: Ctx) -> Any:
    """POST /v1/ops/bulk: without a handle, the count (428 with the handle); with one, its confirm."""
    body: OpsBulkRequest = ctx.body
    validate.text("reason", body.reason)
    p = ctx.p
    if body.handle is None:
        count = await _count(ctx, body)
        raise CountedSet(f"{count.acting} runs are counted under handle {count.handle} ({count.matched} match); "
                         f"nothing changed. Send handle and confirm={count.acting} to {body.action} exactly them "
                         "(those that have not moved by then)", **msgspec.to_builtins(count), confirm=body.confirm)
    _allowed(ctx, body)
    counted = await bulk_.load(ctx.client, p, body.handle, BULK_TTL_S)
    if counted.source == "queue":
        raise InvalidInput(f"handle {body.handle} counts a queue bulk (POST /v1/queues/{counted.queue}/bulk), not a "
                           "list", field="handle")
    if counted.action != body.action:
        raise InvalidInput(f"handle {body.handle} was counted for {counted.action}, not {body.action}", field="action")
    ids = counted.ids
    if body.confirm != len(ids):
        raise CountedSet(f"handle {body.handle} holds {len(ids)} runs, confirm was {body.confirm}; nothing changed",
                         matched=counted.matched, acting=len(ids), handle=body.handle, sample=ids[:SAMPLE],
                         expires_in_s=bulk_.seconds_left(counted), action=counted.action, confirm=body.confirm,
                         list=counted.source)

    async def act(rid: int, ver: int) -> str:
        return await _act(ctx, body.action, rid, ver, body.reason)

    out = await bulk_.confirm(ctx.client, p, counted, reason=body.reason, act=act)
    return OpsBulkResult(matched=counted.matched, acted=len(out.changed), changed=out.changed, skipped=out.skipped,
                         results=out.results, handle=body.handle)


# -- queues: workers, slots, latency -----------------------------------------------------------------
async def queues_ops(ctx: Ctx) -> Any:
    """Per queue in scope: due, overdue and scheduled runs, running, latency (the oldest due run's age),
    the queue-wide concurrency limit, and the workers serving it with their busy slots. The queues are
    read at once (their Redis round trips overlap): one after the other they were 50 ms at 1M runs."""
    stores, p = ctx.client.stores, ctx.p
    rows, workers = await asyncio.gather(stores.db.rows("ops_queue_rows", p.scope), fleet.list_workers(stores))
    now = time.time()

    async def one(row: Any) -> QueueOps:
        name = row.name
        (due, age), backlog = await asyncio.gather(
            fairness.due_summary(stores, name, now=now),
            hotreads.queue_backlog(stores.redis, stores.keys(name), int(now * 1000)))
        serving = [QueueWorker(id=w.id, host=w.host, busy=sum(1 for r in w.running if r.queue == name),
                               held=len(w.running), concurrency=w.concurrency, stopping=w.stop_requested is not None)
                   for w in workers if name in w.queues]
        return QueueOps(queue=name, paused=row.paused, due=due, overdue=backlog.overdue,
                        scheduled=backlog.scheduled, running=backlog.active,
                        latency_s=round(age, 3), max_running=row.max_running, workers=serving,
                        slots=sum(w.concurrency for w in serving))

    return list(await asyncio.gather(*(one(row) for row in rows)))  # the queues' round trips overlap


# -- per-handler charts ------------------------------------------------------------------------------
_WINDOWS = {"1h": (3600, 60), "24h": (86400, 900), "7d": (604800, 7200)}


_BUCKET_S = 900
"""The rollup's bucket (handler_buckets, 039): the 24 h chart's step; the 7 d chart's 2 h are 8 of them."""
_SETTLE_S = 1800
"""A bucket is rolled up this long after its end (the recorder has written its attempts, most have finished)."""
_GIVE_UP_S = 6 * 3600
"""A bucket with an attempt still running is rolled up anyway once it is this old (counted as started)."""


def _ts(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _merged(rows: Iterable[Any], key: Callable[[Any], Any]) -> dict[Any, list[Any]]:
    """Rows of (handler, t, started, succeeded, failed) and either run_hist (rolled up) or h (live: the
    run-time bucket of those attempts, None while they run), the rolled-up and the live part of a window,
    summed by key(row): {key: [started, succeeded, failed, hist]}."""
    out: dict[Any, list[Any]] = {}
    for r in rows:
        acc = out.setdefault(key(r), [0, 0, 0, [0] * (len(stats.BOUNDS_MS) + 1)])
        acc[0] += r.started
        acc[1] += r.succeeded
        acc[2] += r.failed
        hist, h = getattr(r, "run_hist", None), getattr(r, "h", None)  # a rolled-up row has run_hist, a live one h
        if hist is not None:
            acc[3] = [a + int(b) for a, b in zip(acc[3], hist, strict=True)]
        elif h is not None:
            acc[3][h] += r.started
    return out


def _figures(acc: list[Any]) -> dict[str, Any]:
    return {"started": acc[0], "succeeded": acc[1], "failed": acc[2], "run_p50_ms": stats.percentile(acc[3], 0.5),
            "run_p95_ms": stats.percentile(acc[3], 0.95)}


async def handler_stats(ctx: Ctx) -> Any:
    """Per handler over the window: started, succeeded, failed and run-time percentiles; with `handler`,
    that handler's points per step too (the same steps as the queue charts). The 24 h and 7 d windows
    read their closed 15-minute buckets from the rollup (rolling up those not rolled up yet on the way)
    and only the rest from the attempts; the 1 h window reads the attempts."""
    window = ctx.q("window", "1h") or "1h"
    if window not in _WINDOWS:
        raise InvalidInput(f"window must be one of {', '.join(_WINDOWS)}, not {window[:20]!r}", field="window")
    span, step = _WINDOWS[window]
    queue, handler = ctx.q_queue(), _h.q_text(ctx, "handler")
    now = time.time()
    first = int((now - span) // step + 1) * step
    since = live_from = _ts(first)
    db, scope = ctx.client.stores.db, ctx.p.scope
    if step % _BUCKET_S == 0:
        end = _ts((int(now) - _SETTLE_S) // _BUCKET_S * _BUCKET_S)
        if end > since:
            await db.rows("ops_handler_rollup", since, end, _ts(now - _GIVE_UP_S))
            row = await db.row("ops_handler_live_from", since, end)
            live_from = row.live_from if row is not None else since
    every = timedelta(seconds=step if handler is not None else span)  # totals only: one step, not the chart's
    rows = list(await db.rows("ops_handler_live", live_from, every, scope, queue))
    if live_from > since:
        rows += await db.rows("ops_handler_rolled", since, every, scope, queue, live_from)
    totals = sorted((HandlerTotal(handler=h, **_figures(acc)) for h, acc in _merged(rows, lambda r: r.handler).items()),
                    key=lambda t: (-t.started, t.handler))[:200]
    points: list[HandlerPoint] = []
    if handler is not None:
        by_t = _merged((r for r in rows if r.handler == handler), lambda r: int(r.t.timestamp()))
        for t in range(first, int(now) + 1, step):
            acc = by_t.get(t)
            points.append(HandlerPoint(t=_ts(t)) if acc is None else HandlerPoint(t=_ts(t), **_figures(acc)))
    return HandlerStats(window=window, step_s=step, queue=queue, handlers=totals, handler=handler, points=points)


# -- batches ---------------------------------------------------------------------------------------
async def list_batches(ctx: Ctx) -> Any:
    """Batches, newest first, whose members are all in the token's scope, each counted by state; `next`
    (null: the end) is the cursor of the next page, sent back as `cursor` (`before`, a time, is still taken:
    it pages by time alone, which skips batches created in the same instant as a page's last)."""
    key = cursors.decode("batches", ctx.q("cursor"))
    at, bid = (key[0], _uuid_of(key[1])) if key is not None else (ctx.q_time("before"), _NIL)
    limit = ctx.q_int("limit", 50, 1, 1000)
    db, scope = ctx.client.stores.db, ctx.p.scope
    scan = limit + 1 if scope is None else max(limit + 1, BATCH_SCAN)
    rows = await db.rows("ops_batches_page", scope, at, bid, limit + 1, scan)
    out = [BatchSummary(**{**msgspec.structs.asdict(r), "id": str(r.id), "queues": sorted(r.queues)})
           for r in rows[:limit]]
    nxt = [out[-1].created_at, out[-1].id] if len(rows) > limit else None
    if nxt is None and scope is not None:  # a short page: more may be older than the bounded scan reached
        reached = await db.row("ops_batches_page_scanned", at, bid, scan)
        if reached is not None and reached.n == scan:
            nxt = [reached.created_at, str(reached.id)]
    return BatchPage(batches=out, next=None if nxt is None else cursors.encode("batches", nxt))


_NIL = uuid.UUID(int=0)
"""With `before` (a time): every batch created before it, whatever its id (no id is below this one)."""


def _uuid_of(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise InvalidInput(f"cursor {raw[:60]!r} is not a cursor of the batches (not a batch id); send back `next` "
                           "unchanged", field="cursor") from None


BATCH_SCAN = 200
"""How many batches one page of a scoped token's batches reads at most (each batch's members are read to
know its queues): a page may hold fewer than asked, with `next` to read on."""


_Q = ("queue", "string", None, "Only this queue")
_H = ("handler", "string", None, "Only this handler")

def routes(spec: Callable[..., Any], *, run_for: Callable[..., Awaitable[dict[str, Any]]],
           row: Callable[[Any, type], Any], q_text: Callable[[Any, str], str | None]) -> list[Any]:
    """The routes, each made by `spec` (fencepost.api.routes.RouteSpec), with that module's helpers."""
    _h.run_for, _h.row, _h.q_text = run_for, row, q_text
    return [
        spec("GET", "/v1/states", get_states, "Run states, their named groups and the states each command takes "
                 "(fencepost.core.states)", response=StateGroups, tag="health", auth=False),
        spec("GET", "/v1/runs/{run_id}/timeline", run_timeline,
                 "The run's timeline recorded since the cursor `after` (the last answer's), in the order recorded",
                 response=Timeline, params=[("after", "string", None, "The last answer's cursor"),
                                            ("from_id", "integer", None, "With `more`: the last answer's last_id"),
                                            ("limit", "integer", 500, "At most this many (1-1000)")]),
        spec("GET", "/v1/ops/lists/{list}", list_page,
                 "dead (dead letter), review, retries (RETRY_WAIT) or scheduled (PENDING, due later): a page, scoped "
                 "before it is limited, with the next page's cursor", roles=READ, response=OpsPage,
                 params=[_Q, _H, ("cursor", "string", None, "The previous page's `next`"),
                         ("limit", "integer", 50, "At most this many (1-1000)")], tag="queues"),
        spec("POST", "/v1/runs/{run_id}/run_now", run_now,
                 "A scheduled or retry-waiting run due now: one transition (event run_now), audited with the reason",
                 roles=READ, body=S.CommandRequest, response=S.CommandResult, tag="commands"),
        spec("POST", "/v1/ops/bulk", bulk,
                 "A bulk action on a list (or the runs list's filter, or ticked ids): count (428 with a handle), then "
                 "confirm {handle, confirm}: exactly the runs counted that have not moved", roles=READ,
                 body=OpsBulkRequest, response=OpsBulkResult, tag="queues"),
        spec("POST", "/v1/ops/bulk/count", bulk_count, "The same count, answered 200 (for pages)", roles=READ,
                 body=OpsBulkRequest, response=OpsBulkCount, tag="queues"),
        spec("GET", "/v1/ops/queues", queues_ops,
                 "Per queue: due, overdue and scheduled runs, latency, concurrency limit, workers with busy slots",
                 roles=READ, response=list[QueueOps], tag="queues"),
        spec("GET", "/v1/ops/handlers", handler_stats,
                 "Per handler: started, succeeded, failed, run-time p50 / p95 (with handler: per step)", roles=READ,
                 response=HandlerStats, params=[("window", "string", "1h", "1h, 24h or 7d"), _Q, _H], tag="queues"),
        spec("GET", "/v1/batches", list_batches, "Batches, newest first, counted by state", roles=READ,
                 response=BatchPage, params=[("cursor", "string", None, "The previous page's `next`"),
                                             ("before", "string", None, "Created before (ISO 8601; ties are skipped: "
                                              "page with `cursor`)"),
                                             ("limit", "integer", 50, "At most this many (1-1000)")], tag="batches"),
    ]
