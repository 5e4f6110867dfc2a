"""Endpoints of the fleet and its operators: health, readiness, metrics, the OpenAPI document,
tokens, audit, stats, workers and queue dispatch settings."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.responses import Response

from fencepost.api import schemas as S
from fencepost.api.auth import create_token, revoke_token
from fencepost.api.problems import (
    NotFound,
)
from fencepost.api.routing import (
    _BIGINT,
    _UTC,
    Ctx,
    _digits,
    _enc,
    _json,
    _page,
    _q_text,
    _reason_q,
    _row,
    _valid_queue,
)
from fencepost.client import Client
from fencepost.core import cursors, fairness, hotreads, rates, stats, validate
from fencepost.core import workers as fleet
from fencepost.core.errors import InvalidInput


# -- health ------------------------------------------------------------------------------------
async def health(ctx: Ctx) -> Any:
    return S.Health(status="ok")


async def ready(ctx: Ctx) -> Any:
    redis_ok, pg_ok = "ok", "ok"
    try:
        await hotreads.ping(ctx.client.stores.redis)
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


# -- tokens ------------------------------------------------------------------------------------
async def list_tokens(ctx: Ctx) -> Any:
    """Every token for an unscoped admin; a scoped admin sees the tokens within its queues."""
    return [_row(r, S.Token) for r in await ctx.client.stores.db.rows("api_token_list_scoped", ctx.p.scope)]


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
    found = await db.row("api_token_get", int(raw))
    if found is None or (p.queues and not (found.queues and set(found.queues) <= set(p.queues))):
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
    rows = await ctx.client.stores.db.rows("audit_list", actor, ctx.q_queue(), ctx.q_time("since"),
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
    rows = await ctx.client.stores.db.rows("queue_stats", queue, datetime.fromtimestamp(first, _UTC),
                                           timedelta(seconds=step), ctx.p.scope)
    by_t = {int(r.t.timestamp()): r for r in rows}
    points = []
    for t in range(first, int(now) + 1, step):
        r = by_t.get(t)
        if r is None:
            points.append(S.StatsPoint(t=datetime.fromtimestamp(t, _UTC)))
            continue
        lag, run = list(r.lag_hist), list(r.run_hist)
        points.append(S.StatsPoint(t=r.t, started=r.started, succeeded=r.succeeded, failed=r.failed,
                                   retried=r.retried, lag_p50_ms=stats.percentile(lag, 0.5),
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
