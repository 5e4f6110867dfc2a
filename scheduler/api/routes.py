"""The API's endpoints, declared once in ROUTES: Starlette routing and the OpenAPI document
(fencepost.api.openapi, which imports this module; /openapi.json asks the app for it, see
`Api.openapi_document`) are both built from this table, so they cannot disagree.

Every endpoint runs the same steps (`_wrap`): authenticate the bearer token (401), check the
role (403), count the request against the token's rate limit (429), read the body within the
size limit (413) and decode it into its msgspec Struct (400 / 422), then act with a Client whose
actor is `token:<id>@<source address>`, so every control action names its token in the history.
"""

from __future__ import annotations

import copy
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import asyncpg
import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from fencepost.api import schemas as S
from fencepost.api import stream
from fencepost.api.auth import Principal, create_token, revoke_token
from fencepost.api.bulk import bulk as bulk_action
from fencepost.api.metrics import LATENCY, REFUSED, REQUESTS
from fencepost.api.problems import (
    BadRequest,
    NotFound,
    TooLarge,
    problem_response,
)
from fencepost.client import Client
from fencepost.core import cursors, fairness, rates, stats, validate
from fencepost.core import workers as fleet
from fencepost.core.errors import InvalidInput, UnknownRun
from fencepost.core.fairness import due_summary
from fencepost.core.keys import valid_queue_name
from fencepost.core.models import Submit, decode_payload, decode_result
from fencepost.core.schedules import UnknownSchedule
from fencepost.core.states import RESTING, Status
from fencepost.schedules import Schedules, ScheduleUpdate
from fencepost.workflows import PURGED, UnknownBatch, UnknownWorkflow

__all__ = ["ROUTES", "Ctx", "RouteSpec"]

log = logging.getLogger("fencepost.api")
_UTC = UTC
_enc = msgspec.json.Encoder()
_BIGINT = 2**63 - 1
READ = ("operator", "admin")
ANY = ("producer", "operator", "admin")


@dataclass
class RouteSpec:
    method: str
    path: str
    fn: Callable[[Ctx], Awaitable[Any]]
    summary: str
    roles: tuple[str, ...] = ANY
    body: type | None = None
    response: Any = None
    status: int = 200
    params: list[tuple[str, str, Any, str]] = field(default_factory=list)
    """Query parameters: (name, json type, default, description)."""
    tag: str = "runs"
    auth: bool = True


class Ctx:
    """One request: the caller, a Client acting as the caller, the decoded body."""

    def __init__(self, request: Request, principal: Principal | None, client: Client, body: Any) -> None:
        self.request, self.principal, self.client, self.body = request, principal, client, body

    @property
    def p(self) -> Principal:
        assert self.principal is not None
        return self.principal

    @property
    def api(self) -> Any:
        return self.request.app.state.api

    # -- path and query parameters ------------------------------------------------------------
    def run_id(self) -> int:
        raw = self.request.path_params["run_id"]
        if not _digits(raw) or not 0 < int(raw) <= _BIGINT:
            raise InvalidInput(f"run id must be a positive integer, not {raw!r}", field="run_id")
        return int(raw)

    def path(self, name: str) -> str:
        value: str = self.request.path_params[name]  # every route's path parameter is a plain {name}: text
        return value

    def q(self, name: str, default: str | None = None) -> str | None:
        v = self.request.query_params.get(name)
        return default if v in (None, "") else v

    def q_int(self, name: str, default: int, lo: int, hi: int) -> int:
        raw = self.request.query_params.get(name)
        if raw in (None, ""):
            return default
        digits = raw[1:] if raw[:1] == "-" else raw
        if not (digits.isascii() and digits.isdigit()):  # int() also takes "1_0", " 5 " and other scripts' digits
            raise InvalidInput(f"{name} must be an integer, not {raw!r}", field=name)
        v = int(raw)
        if not lo <= v <= hi:
            raise InvalidInput(f"{name} must be between {lo} and {hi}, not {v}", field=name)
        return v

    def q_time(self, name: str) -> datetime | None:
        raw = self.q(name)
        if raw is None:
            return None
        try:
            t = datetime.fromisoformat(raw)
        except ValueError:
            raise InvalidInput(f"{name} must be an ISO 8601 time, not {raw!r}", field=name) from None
        return t if t.tzinfo else t.replace(tzinfo=_UTC)

    def q_status(self) -> str | None:
        s = self.q("status")
        if s is None:
            return None
        s = s.upper()
        if s not in Status.__members__:
            raise InvalidInput(f"unknown status {s!r}; one of {', '.join(Status)}", field="status")
        return s

    def q_queue(self) -> str | None:
        """An optional queue filter; a scoped token may only name one of its queues."""
        q = self.q("queue")
        if q is not None:
            if not valid_queue_name(q):
                raise InvalidInput(f"queue must be a queue name (letters, digits, '_', '.', '-', 1-64), not {q[:70]!r}",
                                   field="queue")
            self.p.require_queue(q)
        return q


# -- helpers -----------------------------------------------------------------------------------
def _digits(raw: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '١' and '²', which int() reads or refuses."""
    return raw.isascii() and raw.isdigit()


def _valid_queue(name: str, field: str = "queue") -> str:
    """A queue named in a path: a valid name (a%20b is refused, not looked up)."""
    if not valid_queue_name(name):
        raise InvalidInput(f"queue must be a queue name (letters, digits, '_', '.', '-', 1-64), not {name[:70]!r}",
                           field=field)
    return name


def _json(obj: Any, status: int = 200) -> Response:
    return Response(_enc.encode(obj), status_code=status, media_type="application/json")


def _row(row: Any, typ: type) -> Any:
    d = {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in dict(row).items()}
    return msgspec.convert(d, typ)


async def _run_for(ctx: Ctx, run_id: int, *, act: bool = False) -> dict[str, Any]:
    """The run, if the caller may see it (and, with act, command it)."""
    p = ctx.p
    if act and p.role == "producer":
        p.require(*READ)
    run = dict(await ctx.client.get(run_id))  # the record as a dict: _live overlays it
    if p.role == "producer":
        row = await ctx.client.stores.db.fetchrow("api_submitted_by", run_id)
        actor = (row["actor"] if row else None) or ""
        if actor != p.owner and not actor.startswith(p.owner + "@"):
            raise UnknownRun(run_id)  # a producer sees only its own runs; another's is as good as missing
    if not p.in_scope(run["queue"]):
        raise UnknownRun(run_id)  # the same answer as a missing run: a scope does not reveal what exists
    return run


async def _live(ctx: Ctx, run: dict[str, Any]) -> dict[str, Any]:
    """Overlay the hot state Redis holds when it is newer than what PostgreSQL recorded."""
    out = dict(run)
    out["recorded_status"] = run["status"]
    key = ctx.client.stores.keys(run["queue"]).run(run["id"])
    # Stores opens Redis with decode_responses=False: replies are bytes (redis-py types them bytes | str).
    fields = await ctx.client.stores.redis.hmget(
        key, "state", "attempt", "version", "token", "worker", "result", "error", "error_class")
    state, attempt, version, token, worker, result, error, eclass = cast("list[bytes | None]", fields)
    out["result"] = decode_result(run.get("result"))
    if state is not None and version is not None and int(version) > int(run["version"]):
        out["status"] = state.decode()
        out["version"] = int(version)
        if attempt is not None:
            out["attempt"] = int(attempt)
        if token:
            out["token"] = int(token)
        if worker:
            out["lease_owner"] = worker.decode()
        if out["status"] in RESTING:  # its outcome too, as Client.wait reads it (`submit --wait` over the API)
            if result is not None:
                out["result"] = decode_result(result)
            if error:
                out["last_error"] = error.decode()
            if eclass:
                out["last_error_class"] = eclass.decode()
    return out


async def _queue_of(client: Client, handler: str, queue: str | None) -> str:
    if queue is not None:
        return queue
    await client._load_definitions({handler})
    return client._defs[handler].queue


def _canonical(value: Any) -> Any:
    """JSON as a canonical form: object keys sorted at every level, so the same arguments in another key
    order are the same request (the idempotency fingerprint hashes the encoded arguments)."""
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _idem_key(body_key: str | None, header_key: str | None) -> str | None:
    """The request's idempotency key: the body's or the header's; both given and different is a mistake."""
    if body_key is not None and header_key is not None and body_key != header_key:
        exc = InvalidInput(f"the body's idempotency_key {body_key[:60]!r} and the Idempotency-Key header "
                           f"{header_key[:60]!r} disagree; send one, or the same in both", field="idempotency_key")
        exc.fields = ["idempotency_key", "Idempotency-Key"]  # type: ignore[attr-defined]
        raise exc
    return body_key if body_key is not None else header_key


def _submit(req: S.SubmitRequest, key: str | None) -> Submit:
    return Submit(handler=req.handler, args=tuple(_canonical(list(req.args))), kwargs=_canonical(dict(req.kwargs)),
                  queue=req.queue, priority=req.priority, run_at=req.run_at, delay=req.delay, timeout=req.timeout,
                  max_retries=req.max_retries, idempotency_key=_idem_key(req.idempotency_key, key), trace=req.trace,
                  tenant=req.tenant, concurrency_key=req.concurrency_key, concurrency_limit=req.concurrency_limit,
                  rate_key=req.rate_key, rate_limit=req.rate_limit)


def _idem_header(ctx: Ctx) -> str | None:
    key = ctx.request.headers.get("idempotency-key")
    if key is not None:
        try:
            validate.text("idempotency_key", key)
        except InvalidInput as exc:
            raise InvalidInput(str(exc).replace("idempotency_key", "Idempotency-Key", 1),
                               field="Idempotency-Key") from None
    return key


# -- health ------------------------------------------------------------------------------------
async def health(ctx: Ctx) -> Any:
    return S.Health(status="ok")


async def ready(ctx: Ctx) -> Any:
    redis_ok, pg_ok = "ok", "ok"
    try:
        await ctx.client.stores.redis.ping()
    except Exception as exc:
        redis_ok = f"unreachable: {type(exc).__name__}"
    try:
        await ctx.client.stores.db.fetchval("ping")
    except Exception as exc:
        pg_ok = f"unreachable: {type(exc).__name__}"
    ok = redis_ok == "ok" and pg_ok == "ok"
    return _json(S.Readiness(status="ready" if ok else "not ready", redis=redis_ok, postgres=pg_ok),
                 200 if ok else 503)


async def metrics(ctx: Ctx) -> Any:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


async def openapi_doc(ctx: Ctx) -> Any:
    return Response(ctx.api.openapi_document(), media_type="application/json")


async def me(ctx: Ctx) -> Any:
    p = ctx.p
    return S.Me(id=p.id, role=p.role, queues=list(p.queues), name=p.name, actor=p.actor)


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


def _within_batch_limit(ctx: Ctx, size: int) -> None:
    """FENCEPOST_API_MAX_BATCH runs per request, for a submit batch and a batch with callbacks alike."""
    limit = ctx.api.config.max_batch
    if size > limit:
        raise TooLarge(f"a batch may hold at most {limit} runs, not {size}", limit=limit, size=size, field="runs")


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


def _q_text(ctx: Ctx, name: str) -> str | None:
    """A text filter: printable, at most 200 characters; the error names the parameter."""
    v = ctx.q(name)
    if v is None:
        return None
    try:
        return validate.text("name", v)
    except InvalidInput as exc:
        raise InvalidInput(str(exc).replace("name", name, 1), field=name) from None


async def list_runs(ctx: Ctx) -> Any:
    """Filtered, sorted, paged by keyset cursor in every sort (`cursor`, the previous page's X-Next-Cursor),
    by `offset`, or below an id (`before`); the count of matches, up to COUNT_CAP, in X-Total-Count so a
    page can say "51-100 of 734"."""
    p = ctx.p
    sort, order = ctx.q("sort", "id"), ctx.q("order", "desc")
    if sort not in _SORTS:
        raise InvalidInput(f"sort must be one of {', '.join(_SORTS)}, not {sort!r}", field="sort")
    if order not in ("asc", "desc"):
        raise InvalidInput(f"order must be asc or desc, not {order!r}", field="order")
    rid = ctx.q_int("id", 0, 1, _BIGINT) or None
    before = ctx.q_int("before", _BIGINT, 1, _BIGINT)
    filters = [ctx.q_queue(), ctx.q_status(), _q_text(ctx, "handler"), ctx.q_time("since"), ctx.q_time("until")]
    who = [p.scope, p.owner if p.role == "producer" else None, before]
    more = [rid, _q_text(ctx, "tenant"), _q_text(ctx, "concurrency_key"), _q_text(ctx, "idempotency_key"),
            _q_text(ctx, "arg")]
    kind = cursors.run_sort_kind(sort, order)
    key = cursors.decode(kind, ctx.q("cursor"))
    limit, offset = ctx.q_int("limit", 50, 1, 1000), ctx.q_int("offset", 0, 0, COUNT_CAP)
    if key is not None and offset:
        raise InvalidInput("send either cursor or offset, not both", field="cursor")
    db = ctx.client.stores.db
    floor = 0
    if more[-1] is not None:  # the argument search reads the newest ARG_WINDOW runs' payloads, not the table
        floor = max(0, int(await db.fetchval("runs_max_id")) - ARG_WINDOW)
    if offset:
        rows = await db.fetch("dashboard_runs", *filters, limit, *who, *more, sort, order, offset, floor)
    elif sort in ("id", "created_at"):
        at = key[0] if key is not None and sort == "created_at" else None
        rows = await db.fetch("api_runs_page_indexed", *filters, limit, *who, *more, sort, order, floor,
                              key is not None, at, None if key is None else key[-1])
    elif sort == "finished_at":
        rows = await db.fetch("api_runs_page_finished", *filters, limit, *who, *more, order, floor,
                              key is not None, None if key is None else key[0], None if key is None else key[-1])
    else:
        v = key[0] if key is not None else None
        rows = await db.fetch("api_runs_page_other", *filters, limit, *who, *more, sort, order, floor, key is not None,
                              v if sort == "attempt" else None, v if sort in ("handler", "status") else None,
                              None if key is None else key[-1])
    n = await db.fetchval("dashboard_runs_count", *filters, *who, *more, COUNT_CAP + 1, floor)
    headers = {"X-Total-Count": str(min(n, COUNT_CAP)), "X-Total-Count-Exact": "true" if n <= COUNT_CAP else "false"}
    nxt = cursors.after(kind, rows, limit)
    if nxt is not None:
        headers["X-Next-Cursor"] = nxt
    if more[-1] is not None:
        headers["X-Search-Window"] = str(ARG_WINDOW)
    return Response(_enc.encode([_row(r, S.RunSummary) for r in rows]), media_type="application/json", headers=headers)


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
    rows = await ctx.client.stores.db.fetch("run_events_page", run_id, limit, *key)
    return _page(rows, limit, "run_events", S.Event, {"run_id": run_id})


async def run_checkpoint(ctx: Ctx) -> Any:
    run_id = ctx.run_id()
    await _run_for(ctx, run_id)
    row = await ctx.client.stores.db.fetchrow("get_checkpoint", run_id)
    if row is None or row["state"] is None:
        return _json(None)
    d = dict(row)
    d["state"] = decode_result(d["state"])
    return _row(d, S.Checkpoint)


async def fleet_events(ctx: Ctx) -> Any:
    """The fleet's history in the caller's scope, newest first, a page at a time (`cursor`: X-Next-Cursor)."""
    since = ctx.q_time("since") or datetime.now(_UTC) - timedelta(hours=1)
    key = cursors.decode("events", ctx.q("cursor")) or [None, None, None]
    limit = ctx.q_int("limit", 100, 1, 1000)
    rows = await ctx.client.stores.db.fetch("events_since", since, _q_text(ctx, "type"), ctx.q_queue(), limit,
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
    rows = await ctx.client.stores.db.fetch("api_queue_figures", float(window), p.scope)
    r = ctx.client.stores.redis
    now = time.time()
    out = []
    for row in rows:
        k = ctx.client.stores.keys(row["queue"])
        due, age = await due_summary(ctx.client.stores, row["queue"], now=now)
        pipe = r.pipeline(transaction=False)
        pipe.zcard(k.delayed)
        pipe.zcard(k.active)
        delayed, active = await pipe.execute()
        out.append(S.QueueStats(queue=row["queue"], paused=row["paused"], due=due, delayed=delayed, active=active,
                                oldest_due_age_s=round(age, 3), finished_last_window=row["finished"],
                                throughput_per_min=round(row["finished"] * 60 / window, 3),
                                schedule_lag_s=None if row["lag_s"] is None else round(float(row["lag_s"]), 3),
                                window_s=window))
    return out


def _legacy_cursor(raw: str | None) -> list[Any] | None:
    """The dead letter's first cursors were `<time>,<id>` in clear: still taken (None: not one of those)."""
    if raw is None or "," not in raw:
        return None
    at, _, rid = raw.rpartition(",")
    try:
        t = datetime.fromisoformat(at)
    except ValueError:
        return None
    if not _digits(rid) or not 0 < int(rid) <= _BIGINT:
        return None
    return [t if t.tzinfo else t.replace(tzinfo=_UTC), int(rid)]


def _page(rows: list[Any], limit: int, kind: str, typ: type, extra: dict[str, Any] | None = None,
          convert: Callable[[dict[str, Any]], Any] | None = None) -> Response:
    """A page of a listing; when it is full, X-Next-Cursor is the key of its last row (fencepost.core.cursors):
    sent back as `cursor`, the next page starts right after it."""
    items = [convert(dict(r)) if convert else _row({**dict(r), **(extra or {})}, typ) for r in rows]
    headers = {}
    nxt = cursors.after(kind, rows, limit)
    if nxt is not None:
        headers["X-Next-Cursor"] = nxt
    return Response(_enc.encode(items), media_type="application/json", headers=headers)


async def _dead_or_review(ctx: Ctx, review: bool) -> Response:
    """Filtered by the caller's scope before the limit (a scoped token saw [] once newer failures of other
    queues filled the page), newest finished first, paged by cursor."""
    limit = ctx.q_int("limit", 50, 1, 1000)
    kind = "review" if review else "dead"
    raw = ctx.q("cursor")
    at, rid = _legacy_cursor(raw) or cursors.decode(kind, raw) or [None, None]
    rows = await ctx.client.stores.db.fetch("api_dead_letter_page", ctx.q_queue(), ctx.p.scope, limit, at, rid, review)
    return _page(rows, limit, kind, S.RunSummary, {"status": "FAILED", "reason": "review"} if review else None)


async def dead_letter(ctx: Ctx) -> Any:
    return await _dead_or_review(ctx, False)


async def review(ctx: Ctx) -> Any:
    return await _dead_or_review(ctx, True)


# -- schedules ---------------------------------------------------------------------------------
def _schedule(row: dict[str, Any]) -> Any:
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


def _reason_q(ctx: Ctx) -> str:
    """The `reason` query parameter of a DELETE (which has no body)."""
    return validate.text("reason", ctx.q("reason") or "")


async def list_schedules(ctx: Ctx) -> Any:
    """Schedules by name in the caller's scope, a page at a time (`cursor`: X-Next-Cursor)."""
    key = cursors.decode("schedules", ctx.q("cursor")) or [None]
    limit = ctx.q_int("limit", 100, 1, 1000)
    rows = await ctx.client.stores.db.fetch("schedule_page_scoped", limit, ctx.p.scope, *key)
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
    rows = await ctx.client.stores.db.fetch("api_list_workflows_scoped", limit, ctx.p.scope, at, wid)
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


# -- tokens ------------------------------------------------------------------------------------
async def list_tokens(ctx: Ctx) -> Any:
    """Every token for an unscoped admin; a scoped admin sees the tokens within its queues."""
    return [_row(r, S.Token) for r in await ctx.client.stores.db.fetch("api_token_list_scoped", ctx.p.scope)]


async def add_token(ctx: Ctx) -> Any:
    """A token is at most its creator's scope: a scoped admin's tokens get its queues by default,
    and naming a queue outside them (or none, meaning all) is refused."""
    body: S.TokenCreate = ctx.body
    p = ctx.p
    queues = list(body.queues) or list(p.queues)
    for q in queues:
        p.require_queue(q)
    row, secret = await create_token(ctx.client.stores.db, body.role, queues, body.name, p.actor,
                                     expires_in=body.expires_in, parent=p)
    return _json(_row({**row, "secret": secret}, S.TokenCreated), 201)


async def revoke_token_route(ctx: Ctx) -> Any:
    raw = ctx.path("token_id")
    if not _digits(raw) or not 0 < int(raw) <= _BIGINT:
        raise InvalidInput(f"token id must be a positive integer, not {raw!r}", field="token_id")
    db, p = ctx.client.stores.db, ctx.p
    found = await db.fetchrow("api_token_get", int(raw))
    if found is None or (p.queues and not (found["queues"] and set(found["queues"]) <= set(p.queues))):
        raise NotFound(f"no token with id {raw}", token_id=int(raw))  # another scope's token is not revealed
    row = await revoke_token(db, int(raw), p.actor, reason=_reason_q(ctx))
    if row is None:
        raise NotFound(f"no token with id {raw}", token_id=int(raw))
    ctx.api.tokens.forget()
    return _row(row, S.Token)


# -- audit -------------------------------------------------------------------------------------
async def audit_log(ctx: Ctx) -> Any:
    """Who did what, newest first; a scoped token sees its queues' entries only. Paged by `cursor` (the
    previous page's X-Next-Cursor: entries sharing a time are neither lost nor repeated), or `before` a time."""
    actor = _q_text(ctx, "actor")
    key = cursors.decode("audit", ctx.q("cursor"))
    before = ctx.q_time("before")
    if key is None and before is not None:  # every entry before that time: the key (before, lowest id)
        key = [before, -_BIGINT - 1, ""]
    after = None if key is None else _enc.encode([key[0].isoformat(), key[1], key[2]]).decode()
    limit = ctx.q_int("limit", 100, 1, 1000)
    rows = await ctx.client.stores.db.fetch("audit_list", actor, ctx.q_queue(), ctx.q_time("since"),
                                            ctx.q_time("until"), limit, ctx.p.scope, after)

    def entry(d: dict[str, Any]) -> Any:
        d["data"] = msgspec.json.decode(d["data"]) if d["data"] else None
        return _row(d, S.AuditEntry)

    return _page(rows, limit, "audit", S.AuditEntry, convert=entry)


# -- charts ----------------------------------------------------------------------------------
_WINDOWS = {"1h": (3600, 60), "24h": (86400, 900), "7d": (604800, 7200)}
"""window -> (seconds, step seconds): 60, 96 and 84 points."""


async def _stats(ctx: Ctx, queue: str | None) -> S.Stats:
    window = ctx.q("window", "1h")
    if window not in _WINDOWS:
        raise InvalidInput(f"window must be one of {', '.join(_WINDOWS)}, not {window!r}", field="window")
    span, step = _WINDOWS[window]
    now = time.time()
    first = int((now - span) // step + 1) * step
    rows = await ctx.client.stores.db.fetch("queue_stats", queue, datetime.fromtimestamp(first, _UTC),
                                            timedelta(seconds=step), ctx.p.scope)
    by_t = {int(r["t"].timestamp()): r for r in rows}
    points = []
    for t in range(first, int(now) + 1, step):
        r = by_t.get(t)
        if r is None:
            points.append(S.StatsPoint(t=datetime.fromtimestamp(t, _UTC)))
            continue
        lag, run = list(r["lag_hist"]), list(r["run_hist"])
        points.append(S.StatsPoint(t=r["t"], started=r["started"], succeeded=r["succeeded"], failed=r["failed"],
                                   retried=r["retried"], lag_p50_ms=stats.percentile(lag, 0.5),
                                   lag_p95_ms=stats.percentile(lag, 0.95), run_p50_ms=stats.percentile(run, 0.5),
                                   run_p95_ms=stats.percentile(run, 0.95)))
    return S.Stats(queue=queue, window=window, step_s=step, points=points)  # type: ignore[arg-type]


async def queue_stats(ctx: Ctx) -> Any:
    name = _valid_queue(ctx.path("queue"))
    ctx.p.require_queue(name)
    return await _stats(ctx, name)


async def fleet_stats(ctx: Ctx) -> Any:
    """Every queue in the caller's scope, summed."""
    return await _stats(ctx, None)


# -- workers ---------------------------------------------------------------------------------
def _scoped_worker(ctx: Ctx, w: fleet.WorkerInfo) -> fleet.WorkerInfo | None:
    """A worker as the caller may see it: scoped tokens see the workers serving one of their queues,
    with only those queues and the runs held in them."""
    p = ctx.p
    if not p.queues:
        return w
    queues = [q for q in w.queues if p.in_scope(q)]
    if not queues:
        return None
    return msgspec.structs.replace(w, queues=queues, running=[r for r in w.running if p.in_scope(r.queue)])


async def list_workers(ctx: Ctx) -> Any:
    """Live workers: identity, queues, concurrency, the runs each holds, any stop requested."""
    queue = ctx.q_queue()
    out = []
    for w in await fleet.list_workers(ctx.client.stores):
        seen = _scoped_worker(ctx, w)
        if seen is not None and (queue is None or queue in seen.queues):
            out.append(seen)
    return out


async def stop_worker(ctx: Ctx) -> Any:
    """Ask a worker to drain and stop: a token must cover every queue it serves (else 403); a worker
    outside the token's scope is as unknown as a missing one (404)."""
    wid = ctx.path("worker_id")
    body: S.ConfigCommand = ctx.body or S.ConfigCommand()
    w = await fleet.get_worker(ctx.client.stores, wid)
    if _scoped_worker(ctx, w) is None:
        raise fleet.UnknownWorker(wid)
    for q in w.queues:
        ctx.p.require_queue(q)
    req = await fleet.request_stop(ctx.client.stores, wid, actor=ctx.p.actor, reason=body.reason)
    return S.WorkerStopped(id=wid, stop_requested=req)


# -- the table ---------------------------------------------------------------------------------
_LIMIT = ("limit", "integer", 50, "At most this many rows (1-1000)")
_REASON = ("reason", "string", None, "Recorded in the audit log with the token that acted")
_QUEUE = ("queue", "string", None, "Only this queue")
_CURSOR = ("cursor", "string", None, "Where the page starts: the previous page's X-Next-Cursor header")
_RUN = "/v1/runs/{run_id}"
_WINDOW = ("window", "string", "1h", "1h (per minute), 24h (per 15 min) or 7d (per 2 h)")

async def _dispatch_view(client: Client, name: str) -> S.DispatchSettings:
    d = await fairness.describe(client.stores, name)
    st = d["settings"]
    shown = {k: str(r) for k, v in st["rates"].items() if (r := rates.parse_stored(v)) is not None}
    qrate = rates.parse_stored(st["rate"])
    return S.DispatchSettings(queue=name, weights=st["weights"], limits=st["limits"], max_running=st["max_running"],
                              priority_age_ms=st["priority_age_ms"], leased=d["leased"],
                              tenants=[msgspec.convert(t, S.TenantDue) for t in d["tenants"]],
                              keys=[msgspec.convert(k, S.KeyUse) for k in d["keys"]],
                              rate=None if qrate is None else str(qrate), rates=shown,
                              rate_use=[msgspec.convert(r, S.RateUse) for r in d["rates"]])


async def get_dispatch(ctx: Ctx) -> Any:
    name = _valid_queue(ctx.path("queue"))
    ctx.p.require_queue(name)
    return await _dispatch_view(ctx.client, name)


_DISPATCH_FIELDS = {"weight": ("tenant", "value"), "limit": ("key", "value"), "max_running": ("value",),
                    "aging": ("value",), "rate": ("key", "rate")}
"""The fields each dispatch setting takes (DispatchUpdate); any other one given is refused."""


async def set_dispatch(ctx: Ctx) -> Any:
    name = _valid_queue(ctx.path("queue"))
    ctx.p.require_queue(name)
    b: S.DispatchUpdate = ctx.body
    stores, v = ctx.client.stores, b.value
    who = {"actor": ctx.p.actor, "reason": validate.text("reason", b.reason)}
    takes = _DISPATCH_FIELDS[b.setting]
    for f in ("tenant", "key", "value", "rate"):  # a field of another setting is a mistake, never ignored:
        if getattr(b, f) is not None and f not in takes:  # {"setting": "rate", "value": 5} cleared the rate
            raise InvalidInput(f"{f} does not apply to the {b.setting} setting (it takes {' and '.join(takes)})",
                               field=f)
    if b.setting in ("limit", "max_running") and v is not None and v != int(v):
        raise InvalidInput(f"{b.setting} must be a whole number, not {v}", field="value")
    try:
        await _apply_dispatch(stores, name, b, who)
    except InvalidInput as exc:
        if exc.field in ("weight", "limit", "max_running", "aging"):  # the body's field is `value`
            raise InvalidInput(f"value: {exc}", field="value") from None
        raise
    return await _dispatch_view(ctx.client, name)


async def _apply_dispatch(stores: Any, name: str, b: S.DispatchUpdate, who: dict[str, str]) -> None:
    v = b.value
    if b.setting == "weight":
        if b.tenant is None:
            raise InvalidInput("a weight needs the tenant it applies to", field="tenant")
        await fairness.set_weight(stores, name, b.tenant, v, **who)
    elif b.setting == "limit":
        if b.key is None:
            raise InvalidInput("a limit needs the concurrency key it applies to (max_running limits the queue)",
                               field="key")
        await fairness.set_limit(stores, name, b.key, None if v is None else int(v), **who)
    elif b.setting == "max_running":
        await fairness.set_max_running(stores, name, None if v is None else int(v), **who)
    elif b.setting == "rate":
        if b.key is None:
            await fairness.set_rate(stores, name, b.rate, **who)
        else:
            await fairness.set_key_rate(stores, name, b.key, b.rate, **who)
    else:
        await fairness.set_aging(stores, name, v, **who)


ROUTES: list[RouteSpec] = [
    RouteSpec("GET", "/healthz", health, "Liveness: the process answers", response=S.Health, tag="health", auth=False),
    RouteSpec("GET", "/readyz", ready, "Readiness: Redis and PostgreSQL reachable (503 otherwise)",
              response=S.Readiness, tag="health", auth=False),
    RouteSpec("GET", "/metrics", metrics,
              "Prometheus metrics of this API process (any token; public with FENCEPOST_API_METRICS_TOKEN=0)",
              response="text", tag="health"),
    RouteSpec("GET", "/openapi.json", openapi_doc, "This document", response="object", tag="health", auth=False),
    RouteSpec("GET", "/v1/me", me, "The calling token", response=S.Me, tag="tokens"),
    RouteSpec("POST", "/v1/runs", submit, "Submit one run (Idempotency-Key header or body field)",
              roles=("producer", "admin"), body=S.SubmitRequest, response=S.Submitted, status=201),
    RouteSpec("POST", "/v1/runs/batch", submit_batch, "Submit a batch atomically (Idempotency-Key: <key>:<index>)",
              roles=("producer", "admin"), body=S.SubmitBatch, response=S.SubmittedBatch, status=201),
    RouteSpec("GET", "/v1/runs", list_runs, "List runs, newest first (producers see their own)",
              response=list[S.RunSummary],
              params=[_QUEUE, ("status", "string", None, "Only this state"), ("handler", "string", None, "Only this handler"),
                      ("since", "string", None, "Created at or after (ISO 8601)"),
                      ("until", "string", None, "Created before (ISO 8601)"), _LIMIT,
                      ("before", "integer", None, "Only ids below this (paging)"),
                      ("id", "integer", None, "Only this run"), ("tenant", "string", None, "Only this tenant"),
                      ("concurrency_key", "string", None, "Only this concurrency key"),
                      ("idempotency_key", "string", None, "Only this idempotency key"),
                      ("arg", "string", None, "A string argument containing this text (among the newest 20,000 runs)"),
                      ("sort", "string", "id", "id, created_at, finished_at, attempt, handler or status"),
                      ("order", "string", "desc", "asc or desc"),
                      ("offset", "integer", 0, "Skip this many (0-10000); X-Total-Count: the matches"),
                      _CURSOR]),
    RouteSpec("GET", _RUN, get_run, "One run (live state from Redis when newer)", response=S.Run),
    RouteSpec("GET", _RUN + "/attempts", run_attempts, "The run's attempts", response=list[S.Attempt]),
    RouteSpec("GET", _RUN + "/events", run_events, "The run's event history, in the order recorded",
              response=list[S.Event], params=[("limit", "integer", 1000, "At most this many (1-1000)"), _CURSOR]),
    RouteSpec("GET", _RUN + "/checkpoint", run_checkpoint, "The run's latest checkpoint (null: none)",
              response=S.Checkpoint | None),
    *[RouteSpec("POST", f"{_RUN}/{verb}", _command(verb), f"{verb.capitalize()} the run", roles=READ,
                body=S.CommandRequest, response=S.CommandResult, tag="commands") for verb in
      ("pause", "stop", "cancel", "resume", "restart", "retry")],
    RouteSpec("POST", _RUN + "/resolve", resolve, "Close a review-queue run (succeeded / failed / retry)", roles=READ,
              body=S.ResolveRequest, response=S.CommandResult, tag="commands"),
    RouteSpec("GET", "/v1/events", fleet_events, "Fleet history", roles=READ, response=list[S.Event],
              params=[("since", "string", None, "ISO 8601 (default: an hour ago)"),
                      ("type", "string", None, "Only this event type"), _QUEUE, _LIMIT, _CURSOR]),
    RouteSpec("GET", "/v1/events/stream", fleet_events_stream,
              "Fleet history as it is recorded (Server-Sent Events; data: an Event, as /v1/events)", roles=READ,
              response="event-stream", params=[("type", "string", None, "Only this event type"), _QUEUE,
                                               ("duration", "integer", 300,
                                                "Seconds until the server ends the stream (0-3600; clients reconnect)")]),
    RouteSpec("GET", "/v1/queues", list_queues, "Queues: depth, oldest age, schedule lag, throughput", roles=READ,
              response=list[S.QueueStats], params=[("window", "integer", 300, "Seconds of history for rates")],
              tag="queues"),
    RouteSpec("POST", "/v1/queues/{queue}/pause", _queue_command(True), "Pause a queue (nothing new is dispatched)",
              roles=READ, body=S.ConfigCommand, response=S.QueueResult, tag="queues"),
    RouteSpec("POST", "/v1/queues/{queue}/resume", _queue_command(False), "Resume a queue", roles=READ,
              body=S.ConfigCommand, response=S.QueueResult, tag="queues"),
    RouteSpec("GET", "/v1/queues/{queue}/dispatch", get_dispatch,
              "Dispatch settings (tenant weights, concurrency and rate limits, aging) and tenants / keys now", roles=READ,
              response=S.DispatchSettings, tag="queues"),
    RouteSpec("POST", "/v1/queues/{queue}/dispatch", set_dispatch,
              "Change one dispatch setting (value null: back to the default)", roles=("admin",),
              body=S.DispatchUpdate, response=S.DispatchSettings, tag="queues"),
    RouteSpec("POST", "/v1/queues/{queue}/bulk", bulk,
              "Count matching runs (428, or 200 with count: true: a handle for the counted set), or confirm a "
              "handle: act on exactly the counted runs that have not moved", roles=("admin",),
              body=S.BulkRequest, response=S.BulkResult, tag="queues"),
    RouteSpec("GET", "/v1/dead-letter", dead_letter, "Dead-letter view (FAILED / TIMED_OUT)", roles=READ,
              response=list[S.RunSummary], params=[_QUEUE, _LIMIT, _CURSOR], tag="queues"),
    RouteSpec("GET", "/v1/review", review, "Review queue (side effects to reconcile)", roles=READ,
              response=list[S.RunSummary], params=[_QUEUE, _LIMIT, _CURSOR], tag="queues"),
    RouteSpec("GET", "/v1/schedules", list_schedules, "List schedules", roles=READ, response=list[S.Schedule],
              params=[("limit", "integer", 100, "At most this many"), _CURSOR], tag="schedules"),
    RouteSpec("POST", "/v1/schedules", add_schedule, "Add a schedule", roles=("admin",), body=S.ScheduleCreate,
              response=S.Schedule, status=201, tag="schedules"),
    RouteSpec("GET", "/v1/schedules/{name}", get_schedule, "One schedule", roles=READ, response=S.Schedule,
              tag="schedules"),
    RouteSpec("DELETE", "/v1/schedules/{name}", delete_schedule, "Remove a schedule", roles=("admin",),
              response=None, status=204, params=[_REASON], tag="schedules"),
    RouteSpec("POST", "/v1/schedules/{name}/pause", _schedule_paused(True), "Pause a schedule", roles=("admin",),
              body=S.ConfigCommand, response=S.Schedule, tag="schedules"),
    RouteSpec("POST", "/v1/schedules/{name}/resume", _schedule_paused(False), "Resume a schedule", roles=("admin",),
              body=S.ConfigCommand, response=S.Schedule, tag="schedules"),
    RouteSpec("PATCH", "/v1/schedules/{name}", update_schedule, "Edit a schedule in place (the fields given)",
              roles=("admin",), body=S.ScheduleEdit, response=S.Schedule, tag="schedules"),
    RouteSpec("POST", "/v1/schedules/{name}/run-now", run_schedule_now,
              "Fire the schedule once now (its next scheduled fire does not move)", roles=("admin",),
              body=S.ConfigCommand, response=S.Submitted, status=201, tag="schedules"),
    RouteSpec("GET", "/v1/schedules/{name}/next", next_fires, "The next fire times", roles=READ,
              response=S.NextFires, params=[("n", "integer", 5, "How many (1-100)")], tag="schedules"),
    RouteSpec("GET", "/v1/schedules/{name}/runs", schedule_runs, "The schedule's latest runs, newest fire first",
              roles=READ, response=list[S.ScheduleRun], params=[("limit", "integer", 10, "At most this many (1-1000)")],
              tag="schedules"),
    RouteSpec("POST", "/v1/workflows", submit_workflow, "Submit a workflow (DAG) atomically",
              roles=("producer", "admin"), body=S.WorkflowSubmit, response=S.WorkflowSubmitted, status=201,
              tag="workflows"),
    RouteSpec("GET", "/v1/workflows", list_workflows, "Recent workflows", roles=READ,
              response=list[S.WorkflowSummary], params=[_LIMIT, _CURSOR], tag="workflows"),
    RouteSpec("GET", "/v1/workflows/{workflow_id}", get_workflow, "A workflow and its nodes", roles=READ,
              response=S.Workflow, tag="workflows"),
    RouteSpec("POST", "/v1/workflows/{workflow_id}/retry", retry_workflow, "Re-run what did not succeed",
              roles=READ, body=S.WorkflowRetry, response=S.WorkflowRetried, tag="workflows"),
    RouteSpec("POST", "/v1/batches", create_batch,
              "Submit runs as one batch with on_complete / on_success callbacks (run once when all are terminal)",
              roles=("producer", "admin"), body=S.BatchCreate, response=S.BatchCreated, status=201, tag="batches"),
    RouteSpec("GET", "/v1/batches/{batch_id}", get_batch, "A batch: its members counted by state, its callbacks",
              roles=READ, response=S.Batch, tag="batches"),
    RouteSpec("GET", "/v1/tokens", list_tokens, "List API tokens (never their secrets)", roles=("admin",),
              response=list[S.Token], tag="tokens"),
    RouteSpec("POST", "/v1/tokens", add_token, "Create a token; the secret is shown once", roles=("admin",),
              body=S.TokenCreate, response=S.TokenCreated, status=201, tag="tokens"),
    RouteSpec("DELETE", "/v1/tokens/{token_id}", revoke_token_route, "Revoke a token", roles=("admin",),
              response=S.Token, params=[_REASON], tag="tokens"),
    RouteSpec("GET", "/v1/queues/{queue}/stats", queue_stats,
              "Started, succeeded, failed, retried per step, start lag and run time percentiles (per-minute rollup)",
              roles=READ, response=S.Stats, params=[_WINDOW], tag="queues"),
    RouteSpec("GET", "/v1/stats", fleet_stats, "The same, summed over every queue in the token's scope", roles=READ,
              response=S.Stats, params=[_WINDOW], tag="queues"),
    RouteSpec("GET", "/v1/workers", list_workers, "Live workers: host, pid, version, queues, concurrency, held runs",
              roles=READ, response=list[S.WorkerInfo], params=[_QUEUE], tag="workers"),
    RouteSpec("POST", "/v1/workers/{worker_id}/stop", stop_worker,
              "Ask a worker to stop claiming, drain and exit (audited)", roles=READ, body=S.ConfigCommand,
              response=S.WorkerStopped, tag="workers"),
    RouteSpec("GET", "/v1/audit", audit_log, "Who did what: configuration changes and commands, newest first",
              roles=READ, response=list[S.AuditEntry],
              params=[("actor", "string", None, "Only this actor (or a prefix ending in ':' or '@', e.g. token:7@)"),
                      _QUEUE, ("since", "string", None, "At or after (ISO 8601)"),
                      ("until", "string", None, "Before (ISO 8601)"), ("limit", "integer", 100, "At most this many (1-1000)"),
                      ("before", "string", None, "Only entries before this time"), _CURSOR],
              tag="audit"),
]

OPTIONAL_BODY = {S.CommandRequest, S.WorkflowRetry, S.ConfigCommand}
"""Bodies that may be left out entirely (all their fields have defaults)."""


# -- the common steps --------------------------------------------------------------------------
async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the request body is {declared} bytes, the limit is {limit}", size=int(declared),
                       limit=limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the request body exceeds the limit of {limit} bytes", limit=limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(raw: bytes, typ: type) -> Any:
    if not raw.strip():
        if typ in OPTIONAL_BODY:
            return None
        raise BadRequest("a JSON body is required")
    try:
        return msgspec.json.decode(raw, type=typ)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        path = msg.rpartition(" - at `")[2].rstrip("`") if " - at `" in msg else None
        fld = path.removeprefix("$.").split(".")[0].split("[")[0] if path and path.startswith("$.") else None
        unknown = re.search(r"unknown field `([^`]*)`", msg)
        if unknown and (fld is None or path == "$"):
            fld = unknown.group(1)
        if "matching regex" in msg and path is not None:  # name the character, not the pattern
            why = _pattern_refusal(raw, path)
            if why is not None:
                raise InvalidInput(f"invalid body: {why} - at `{path}`", field=fld) from None
        raise InvalidInput(f"invalid body: {msg}", field=fld) from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the body nests too deeply") from None


def _pattern_refusal(raw: bytes, path: str) -> str | None:
    """What is wrong with the text at `path` ($.a.b[0]) of a body a schema pattern refused: the offending
    character and its position (validate.describe_text), instead of the pattern itself."""
    try:
        value: Any = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    steps = re.findall(r"\.([^.\[]+)|\[(\d+)\]", path.removeprefix("$"))
    name = "value"
    for key, index in steps:
        if key and isinstance(value, dict):
            value, name = value.get(key), key
        elif index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return None
    if not isinstance(value, str):
        return None
    return validate.describe_text(name, value, label=True)


def _addr(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def wrap(spec: RouteSpec) -> Callable[[Request], Awaitable[Response]]:
    label = re.sub(r"{(\w+)_id}", r"{\1}", spec.path)  # the route template: bounded, never an id itself

    async def endpoint(request: Request) -> Response:
        api = request.app.state.api
        started = time.perf_counter()
        principal: Principal | None = None
        try:
            if spec.auth and not (spec.fn is metrics and not api.config.metrics_token):
                principal = await api.tokens.authenticate(request.headers.get("authorization"), _addr(request))
                await api.limiter.hit(principal.id)
                principal.require(*spec.roles)
            body = None
            if spec.body is not None:
                body = _decode(await _read_body(request, api.config.max_body_bytes), spec.body)
            client = copy.copy(api.client)
            client.actor = principal.actor if principal else "api"
            client.idempotency_namespace = principal.owner if principal else None  # keys are per token
            out = await spec.fn(Ctx(request, principal, client, body))
            if client._defs is not api.client._defs:
                api.client._defs = client._defs
            resp = out if isinstance(out, Response) else _json(out, spec.status)
        except (asyncpg.DataError, OverflowError) as exc:  # NUL bytes, values PostgreSQL cannot hold
            resp = problem_response(InvalidInput(f"a value cannot be stored: {exc}"), request.url.path)
        except Exception as exc:
            resp = problem_response(exc, request.url.path)
            if resp.status_code >= 500 and resp.status_code not in (503, 504):
                log.exception("unhandled error on %s %s", spec.method, spec.path, extra={"event": "api_error"})
            elif resp.status_code in (401, 403, 413, 429):
                REFUSED.labels(str(resp.status_code)).inc()
        REQUESTS.labels(label, spec.method, f"{resp.status_code // 100}xx").inc()
        LATENCY.labels(label).observe(time.perf_counter() - started)
        return resp

    endpoint.__name__ = spec.fn.__name__
    return endpoint


# The dashboard's operations routes (fencepost.api.routes_ops), made with RouteSpec and the helpers above.
from fencepost.api import routes_ops  # noqa: E402

ROUTES += routes_ops.routes(RouteSpec, run_for=_run_for, row=_row, q_text=_q_text)
