"""Bulk actions that act on exactly the runs that were counted (issue 24 item 1).

One code path for every bulk action: the API's queue bulk (`bulk`, below) and the dashboard's lists
(fencepost.api.routes_ops) count with `live` and `store` and confirm with `load` and `confirm`, into one
table (`bulk_handles`, migration 036).

A count (a BulkRequest without `handle`) selects the matching runs, reads each one's live state
and version (Redis, or PostgreSQL for a run Redis no longer holds) and stores them under a random
handle bound to the counting token, the queue and the command (`bulk_handles`, short-lived); the
answer is 428 with the handle. The confirm names the handle: each counted run is acted on only if
it is still in the state and at the version it was counted at (the command's compare-and-set, with
that version, backs the check), so a run that moved since is skipped and reported, and a run
submitted after the count is never touched. The audit row, written with the handle's consumption
before any run changes, lists exactly the runs acted on.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec

from fencepost.api import schemas as S
from fencepost.api.auth import Principal
from fencepost.api.problems import ApiError, BulkTooLarge
from fencepost.client import Client
from fencepost.core import audit, validate
from fencepost.core.errors import BulkNotConfirmed, InvalidInput, UnknownQueue

__all__ = ["SAMPLE", "Counted", "Live", "Outcome", "UnknownBulkHandle", "bulk", "confirm", "live", "load", "seconds_left",
           "store"]

SAMPLE = 20
"""How many of the counted ids a 428 shows."""
_INSPECT_CHUNK = 500


class UnknownBulkHandle(ApiError):
    status, slug, title = 404, "unknown-bulk-handle", "No such bulk handle (unknown, expired, used or another token's)"


class Live(msgspec.Struct, frozen=True):
    state: str
    version: int


async def live(client: Client, runs: Iterable[tuple[int, str]]) -> dict[int, Live]:
    """Each run's (id, queue) state and version as they are now: Redis's when it holds the run (it is
    ahead of the record), else PostgreSQL's; a run in neither is absent (gone from the hot table)."""
    out: dict[int, Live] = {}
    by_queue: dict[str, list[int]] = {}
    for rid, queue in runs:
        by_queue.setdefault(queue, []).append(rid)
    for queue, ids in by_queue.items():
        keys = client.stores.keys(queue)
        for i in range(0, len(ids), _INSPECT_CHUNK):
            chunk = ids[i:i + _INSPECT_CHUNK]
            for rid, got in zip(chunk, await client.stores.scripts.repair_inspect(keys, chunk), strict=True):
                if got.exists and got.state and got.version and got.version.isdigit():
                    out[rid] = Live(state=got.state, version=int(got.version))
    missing = [rid for ids in by_queue.values() for rid in ids if rid not in out]
    if missing:
        for r in await client.stores.db.rows("bulk_live_rows", missing):
            out[r.id] = Live(state=r.status, version=int(r.version))
    return out


class Counted(msgspec.Struct, kw_only=True):
    """A counted set as stored under its handle (bulk_handles, 036): one shape for every bulk action."""

    handle: str
    action: str
    source: str
    """'queue' (the API's queue bulk) or the dashboard list it was counted from."""
    queue: str | None
    selection: dict[str, Any]
    matched: int
    ids: list[int]
    queues: list[str]
    states: list[str]
    versions: list[int]
    expires_at: datetime


async def store(client: Client, p: Principal, *, action: str, source: str, queue: str | None,
                selection: dict[str, Any], matched: int, chosen: list[tuple[int, str, Live]], ttl: float) -> str:
    """Store the runs a count chose ((id, queue, live state) each) under a new handle of this token."""
    handle = secrets.token_hex(16)
    await client.stores.db.row(
        "bulk_handle_insert", handle, p.id, queue, action, source, msgspec.json.encode(selection).decode(), matched,
        [i for i, _, _ in chosen], [q for _, q, _ in chosen], [v.state for _, _, v in chosen],
        [v.version for _, _, v in chosen], ttl)
    return handle


async def load(client: Client, p: Principal, handle: str, ttl: float) -> Counted:
    """The live counted set `handle` of this token; UnknownBulkHandle when it is not (any more)."""
    row = await client.stores.db.row("bulk_handle_get", handle, p.id)
    if row is None:
        raise UnknownBulkHandle(f"no live bulk handle {handle} of this token (unknown, expired after "
                                f"{ttl:g} s, already used, or another token's); count again", field="handle",
                                handle=handle)
    return Counted(handle=handle, action=row.action, source=row.list, queue=row.queue,
                   selection=msgspec.json.decode(row.selection), matched=int(row.matched), ids=list(row.ids),
                   queues=list(row.queues), states=list(row.states), versions=list(row.versions),
                   expires_at=row.expires_at)


def seconds_left(counted: Counted) -> float:
    return round(max(0.0, (counted.expires_at - datetime.now(UTC)).total_seconds()), 3)  # display only


class Outcome(msgspec.Struct, kw_only=True):
    changed: list[int]
    skipped: list[S.BulkSkip]
    results: dict[str, int]


Act = Callable[[int, int], Awaitable[str]]
"""One run's action, (run id, counted version) -> the state it left the run in; raises to refuse."""


async def confirm(client: Client, p: Principal, counted: Counted, *, reason: str, act: Act) -> Outcome:
    """Act on exactly the counted runs that have not moved: each run is checked against the state and
    version it was counted at (Redis's, else PostgreSQL's), the handle is used once in the transaction
    of the audit row listing what is acted on and what was skipped, then each run is acted on with its
    counted version (the command's own compare-and-set backs the check). A run refused in the last
    moment is skipped, and a second audit row names it."""
    for q in set(counted.queues):  # the scope may have been checked at count time only by the filter
        p.require_queue(q)
    db = client.stores.db
    now = await live(client, zip(counted.ids, counted.queues, strict=True))
    acting: list[tuple[int, int]] = []
    skipped: list[S.BulkSkip] = []
    for rid, st, ver in zip(counted.ids, counted.states, counted.versions, strict=True):
        got = now.get(rid)
        if got is None:
            skipped.append(S.BulkSkip(id=rid, reason=f"gone: counted {st} v{ver}, no longer a hot run"))
        elif got.state != st or got.version != ver:
            skipped.append(S.BulkSkip(id=rid, reason=f"moved: counted {st} v{ver}, now {got.state} v{got.version}"))
        else:
            acting.append((rid, ver))
    queues = sorted(set(counted.queues))
    one = counted.queue or (queues[0] if len(queues) == 1 else None)
    async with db.transaction() as tx:  # the handle is used once, with the audit row of what is acted on
        if await db.row("bulk_handle_take", counted.handle, p.id, conn=tx) is None:
            raise UnknownBulkHandle(f"bulk handle {counted.handle} was used or expired meanwhile; count again",
                                    field="handle", handle=counted.handle)
        await audit.write(db, tx, client.actor, f"bulk_{counted.action}", queue=one, reason_=reason,
                          data={**counted.selection, "matched": counted.matched, "handle": counted.handle,
                                "runs": len(acting), "ids": [rid for rid, _ in acting],
                                "skipped": [s.id for s in skipped], "queues": queues})
    changed: list[int] = []
    results: dict[str, int] = {}
    late: list[int] = []
    for rid, ver in acting:
        try:
            state = await act(rid, ver)
        except Exception as exc:  # one run's refusal (it moved in the last moment) never stops the others
            skipped.append(S.BulkSkip(id=rid, reason=f"refused: {exc}"))
            late.append(rid)
            continue
        changed.append(rid)
        results[state] = results.get(state, 0) + 1
    if late:  # moved between the check and its own compare-and-set: the record says so too
        async with db.transaction() as tx:
            await audit.write(db, tx, client.actor, f"bulk_{counted.action}_refused", queue=one, reason_=reason,
                              data={"handle": counted.handle, "ids": late})
    skipped.sort(key=lambda s: s.id)
    return Outcome(changed=changed, skipped=skipped, results=results)


def _not_confirmed(matched: int, acting: int, handle: str, cap: int, confirm: int, sample: list[int],
                   ttl: float, until_id: int | None) -> BulkNotConfirmed:
    exc = BulkNotConfirmed(matched, cap)
    exc.args = (f"{acting} runs are counted under handle {handle} ({matched} match); nothing changed. Send "
                f"handle and confirm={acting} to act on exactly them (those that have not moved by then)",)
    extra = {"acting": acting, "handle": handle, "sample": sample, "expires_in_s": ttl, "confirm": confirm,
             "until_id": until_id}
    for k, v in extra.items():
        setattr(exc, k, v)
    return exc


async def _count(client: Client, p: Principal, queue: str, body: S.BulkRequest, cap: int, ttl: float) -> Exception:
    db = client.stores.db
    counted = await db.row("bulk_count", queue, body.status, body.handler, body.until_id)
    assert counted is not None  # an aggregate answers one row
    matched = int(counted.matched)
    if body.limit is None and matched > cap:
        return BulkTooLarge(f"{matched} runs match; the server acts on at most {cap} at once. Narrow the selection "
                            "(status, handler) or count in chunks with limit; nothing changed", matched=matched,
                            limit=cap, field="limit")
    rows = await db.rows("bulk_candidates", queue, body.status, body.handler, body.until_id,
                         min(matched, body.limit or cap))
    now = await live(client, [(r.id, queue) for r in rows])
    chosen: list[tuple[int, str, Live]] = []
    for r in rows:
        got = now.get(r.id) or Live(state=r.status, version=int(r.version))
        if body.status is None or got.state == body.status:  # Redis is ahead of the record: it decides
            chosen.append((r.id, queue, got))
    selection = {"status": body.status, "handler": body.handler, "limit": body.limit, "until_id": body.until_id}
    handle = await store(client, p, action=body.command, source="queue", queue=queue, selection=selection,
                         matched=matched, chosen=chosen, ttl=ttl)
    bound = chosen[-1][0] if chosen else None
    return _not_confirmed(matched, len(chosen), handle, cap, body.confirm, [i for i, _, _ in chosen[:SAMPLE]], ttl,
                          bound)


def _same_selection(stored: dict[str, Any], body: S.BulkRequest) -> None:
    """A confirm acts on its handle's selection; a filter that differs from it is a mistake, never ignored."""
    for f in ("status", "handler", "limit", "until_id"):
        given = getattr(body, f)
        if given is not None and given != stored.get(f):
            raise InvalidInput(f"{f} {given!r} is not the selection handle {body.handle} was counted with "
                               f"({stored.get(f)!r}); count again for another selection", field=f)


async def bulk(client: Client, p: Principal, queue: str, body: S.BulkRequest, *, cap: int, ttl: float
               ) -> S.BulkResult | S.BulkCount:
    """POST /v1/queues/{queue}/bulk: a count (raises the 428) or a confirm (acts)."""
    validate.text("reason", body.reason)
    if body.handler is not None:
        validate.text("handler", body.handler)
    if body.limit is not None and body.limit > cap:
        raise BulkTooLarge(f"limit {body.limit} is over the server's cap of {cap}", limit=cap, field="limit")
    db = client.stores.db
    if await db.row("queue_row", queue) is None:
        raise UnknownQueue(queue)
    if body.handle is None:
        refusal = await _count(client, p, queue, body, cap, ttl)
        if body.count and isinstance(refusal, BulkNotConfirmed):
            f = vars(refusal)
            return S.BulkCount(matched=f["matched"], acting=f["acting"], handle=f["handle"], sample=f["sample"],
                               expires_in_s=f["expires_in_s"], limit=f["limit"], until_id=f["until_id"])
        raise refusal
    counted = await load(client, p, body.handle, ttl)
    if counted.queue != queue:
        raise InvalidInput(f"handle {body.handle} counts runs of {counted.queue or 'a dashboard list'!r}, not "
                           f"queue {queue!r}", field="queue")
    if counted.action != body.command:
        raise InvalidInput(f"handle {body.handle} was counted for {counted.action}, not {body.command}",
                           field="command")
    _same_selection(counted.selection, body)
    ids = counted.ids
    if body.confirm != len(ids):
        raise _not_confirmed(counted.matched, len(ids), body.handle, cap, body.confirm, ids[:SAMPLE],
                             seconds_left(counted), ids[-1] if ids else None)

    async def act(rid: int, ver: int) -> str:
        state: str = await getattr(client, body.command)(rid, reason=body.reason, expected_version=ver)
        return state

    out = await confirm(client, p, counted, reason=body.reason, act=act)
    return S.BulkResult(matched=counted.matched, acted=len(out.changed), changed=out.changed, skipped=out.skipped,
                        results=out.results, refused={str(s.id): s.reason for s in out.skipped}, handle=body.handle,
                        until_id=counted.selection.get("until_id"))
