"""Bulk actions that act on exactly the runs that were counted (issue 24 item 1).

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
from datetime import UTC, datetime
from typing import Any

import msgspec

from fencepost.api import schemas as S
from fencepost.api.auth import Principal
from fencepost.api.problems import ApiError, BulkTooLarge
from fencepost.client import Client
from fencepost.core import audit, validate
from fencepost.core.errors import BulkNotConfirmed, InvalidInput, UnknownQueue

__all__ = ["SAMPLE", "UnknownBulkHandle", "bulk"]

SAMPLE = 20
"""How many of the counted ids a 428 shows."""
_INSPECT_CHUNK = 500


class UnknownBulkHandle(ApiError):
    status, slug, title = 404, "unknown-bulk-handle", "No such bulk handle (unknown, expired, used or another token's)"


class _Live(msgspec.Struct, frozen=True):
    state: str
    version: int


async def _live(client: Client, queue: str, ids: list[int]) -> dict[int, _Live]:
    """Each run's state and version as they are now: Redis's when it holds the run, else PostgreSQL's."""
    out: dict[int, _Live] = {}
    keys = client.stores.keys(queue)
    for i in range(0, len(ids), _INSPECT_CHUNK):
        chunk = ids[i:i + _INSPECT_CHUNK]
        for rid, got in zip(chunk, await client.stores.scripts.repair_inspect(keys, chunk), strict=True):
            if got.exists and got.state and got.version and got.version.isdigit():
                out[rid] = _Live(state=got.state, version=int(got.version))
    missing = [rid for rid in ids if rid not in out]
    if missing:
        for r in await client.stores.db.fetch("bulk_live_rows", missing):
            out[r["id"]] = _Live(state=r["status"], version=int(r["version"]))
    return out


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
    counted = await db.fetchrow("bulk_count", queue, body.status, body.handler, body.until_id)
    assert counted is not None  # an aggregate answers one row
    matched = int(counted["matched"])
    if body.limit is None and matched > cap:
        return BulkTooLarge(f"{matched} runs match; the server acts on at most {cap} at once. Narrow the selection "
                            "(status, handler) or count in chunks with limit; nothing changed", matched=matched,
                            limit=cap, field="limit")
    rows = await db.fetch("bulk_candidates", queue, body.status, body.handler, body.until_id,
                          min(matched, body.limit or cap))
    live = await _live(client, queue, [r["id"] for r in rows])
    chosen: list[tuple[int, _Live]] = []
    for r in rows:
        now = live.get(r["id"]) or _Live(state=r["status"], version=int(r["version"]))
        if body.status is None or now.state == body.status:  # Redis is ahead of the record: it decides
            chosen.append((r["id"], now))
    handle = secrets.token_hex(16)
    selection = {"status": body.status, "handler": body.handler, "limit": body.limit, "until_id": body.until_id}
    await db.fetchrow("bulk_handle_insert", handle, p.id, queue, body.command, msgspec.json.encode(selection).decode(),
                      matched, [i for i, _ in chosen], [v.state for _, v in chosen], [v.version for _, v in chosen],
                      ttl)
    bound = chosen[-1][0] if chosen else None
    return _not_confirmed(matched, len(chosen), handle, cap, body.confirm, [i for i, _ in chosen[:SAMPLE]], ttl,
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
    if await db.fetchrow("queue_row", queue) is None:
        raise UnknownQueue(queue)
    if body.handle is None:
        counted = await _count(client, p, queue, body, cap, ttl)
        if body.count and isinstance(counted, BulkNotConfirmed):
            f = vars(counted)
            return S.BulkCount(matched=f["matched"], acting=f["acting"], handle=f["handle"], sample=f["sample"],
                               expires_in_s=f["expires_in_s"], limit=f["limit"], until_id=f["until_id"])
        raise counted
    row = await db.fetchrow("bulk_handle_get", body.handle, p.id)
    if row is None:
        raise UnknownBulkHandle(f"no live bulk handle {body.handle} of this token (unknown, expired after "
                                f"{ttl:g} s, already used, or another token's); count again", field="handle",
                                handle=body.handle)
    if row["queue"] != queue:
        raise InvalidInput(f"handle {body.handle} counts runs of queue {row['queue']!r}, not {queue!r}", field="queue")
    if row["command"] != body.command:
        raise InvalidInput(f"handle {body.handle} was counted for {row['command']}, not {body.command}",
                           field="command")
    stored = msgspec.json.decode(row["selection"])
    _same_selection(stored, body)
    ids, states, versions = list(row["ids"]), list(row["states"]), list(row["versions"])
    if body.confirm != len(ids):
        left = max(0.0, (row["expires_at"] - datetime.now(UTC)).total_seconds())  # display only
        raise _not_confirmed(int(row["matched"]), len(ids), body.handle, cap, body.confirm, ids[:SAMPLE],
                             round(left, 3), ids[-1] if ids else None)
    live = await _live(client, queue, ids)
    acting: list[tuple[int, int]] = []
    skipped: list[S.BulkSkip] = []
    for rid, st, ver in zip(ids, states, versions, strict=True):
        now = live.get(rid)
        if now is None:
            skipped.append(S.BulkSkip(id=rid, reason=f"gone: counted {st} v{ver}, no longer a hot run"))
        elif now.state != st or now.version != ver:
            skipped.append(S.BulkSkip(id=rid, reason=f"moved: counted {st} v{ver}, now {now.state} v{now.version}"))
        else:
            acting.append((rid, ver))
    async with db.transaction() as tx:  # the handle is used once, with the audit row of what is acted on
        if await db.fetchrow("bulk_handle_take", body.handle, p.id, conn=tx) is None:
            raise UnknownBulkHandle(f"bulk handle {body.handle} was used or expired meanwhile; count again",
                                    field="handle", handle=body.handle)
        await audit.write(db, tx, client.actor, f"bulk_{body.command}", queue=queue, reason_=body.reason,
                          data={**stored, "matched": int(row["matched"]), "handle": body.handle,
                                "runs": len(acting), "ids": [rid for rid, _ in acting],
                                "skipped": [s.id for s in skipped]})
    changed: list[int] = []
    results: dict[str, int] = {}
    for rid, ver in acting:
        try:
            state = await getattr(client, body.command)(rid, reason=body.reason, expected_version=ver)
        except Exception as exc:  # one run's refusal (it moved in the last moment) never stops the others
            skipped.append(S.BulkSkip(id=rid, reason=f"refused: {exc}"))
            continue
        changed.append(rid)
        results[state] = results.get(state, 0) + 1
    late = [s.id for s in skipped if s.reason.startswith("refused: ")]
    if late:  # moved between the check and its own compare-and-set: the record says so too
        async with db.transaction() as tx:
            await audit.write(db, tx, client.actor, f"bulk_{body.command}_refused", queue=queue, reason_=body.reason,
                              data={"handle": body.handle, "ids": late})
    skipped.sort(key=lambda s: s.id)
    return S.BulkResult(matched=int(row["matched"]), acted=len(changed), changed=changed, skipped=skipped,
                        results=results, refused={str(s.id): s.reason for s in skipped}, handle=body.handle,
                        until_id=stored.get("until_id"))
