"""Drift between Redis (the hot copy) and PostgreSQL (the record): found incrementally,
repaired with compare-and-set scripts, counted (reconciler/metrics.py) and written as
'drift_repaired' events.

Kinds (the `kind` label and the event's reason):

    missing         PostgreSQL has the run waiting (PENDING, RETRY_WAIT, PAUSED), Redis has
                    no hash                                  -> enqueue it from PostgreSQL
                    (a BLOCKED workflow step is not drift: it lives in PostgreSQL only
                    until its upstreams release it)
    lost_lease      PostgreSQL has it leased, Redis has no hash -> attempt interrupted,
                    run re-queued (at least once)
    unqueued        the hash says PENDING / RETRY_WAIT / leased but no sorted set holds it
                                                             -> put it back in its set
    unrecorded      Redis has a terminal state PostgreSQL lacks and the stream entry that
                    would record it is gone                  -> record it in PostgreSQL
    terminal_in_pg  PostgreSQL terminal, Redis still active and not newer -> fix Redis
    stale_hash      the hash is behind PostgreSQL (lower version) -> restore from PostgreSQL
    corrupt         the hash cannot be read as a run         -> restore from PostgreSQL
    orphan_hash     a run hash PostgreSQL has no row for     -> delete
    orphan_member   a due/delayed/active member with no hash -> remove

Races: Redis is read before PostgreSQL, so a run committed before its Redis write is
always seen; runs PostgreSQL changed within `grace_s` are left alone (a submit or command
between its commit and its Redis write); every Redis repair is conditional on the version
read; a run found missing is re-read from PostgreSQL just before it is enqueued (the
recorder may have committed a terminal state and expired the hash in between).

Isolation: a run Redis cannot hold (values an older version accepted, e.g. an infinite
timeout) is quarantined, not retried every tick: cancelled in PostgreSQL with reason
'quarantined', counted in fencepost_quarantined_total{loop="drift"|"rebuild",kind="run"}
and alerted (FencepostQuarantined); the other runs of the queue are repaired as usual.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import msgspec

from fencepost.core import hotrepair, metrics, states
from fencepost.core.bulkread import read_queue
from fencepost.core.errors import InvalidInput
from fencepost.core.fairness import due_and_held_sets, scan_queue
from fencepost.core.hot import Drop, Inspected, Sync, TtlArgs, Versioned
from fencepost.core.models import RunRow, run_row
from fencepost.core.states import ACTIVE, TERMINAL, Status
from fencepost.core.stores import Stores
from fencepost.reconciler.metrics import DRIFT_FOUND, DRIFT_REPAIRED

log = logging.getLogger("fencepost.reconciler")

__all__ = ["KINDS", "Drift", "DriftRepair"]

KINDS = ("missing", "lost_lease", "unqueued", "unrecorded", "terminal_in_pg", "stale_hash", "corrupt",
         "orphan_hash", "orphan_member")
WAITING = frozenset(s.value for s in states.WAITING)
HELD = WAITING - {"BLOCKED"}
"""Waiting runs Redis holds (a BLOCKED workflow step is not in Redis until it is released)."""
LEASED = frozenset(s.value for s in ACTIVE)
DONE = frozenset({s.value for s in TERMINAL})
KNOWN = frozenset(s.value for s in Status)
INSPECT_BATCH = 1000
"""Runs read per repair_inspect call (about a millisecond inside Redis)."""
STREAM_SCAN_LIMIT = 200_000
"""Above this many unrecorded stream entries the `unrecorded` check waits for the recorder."""


POISON = (ValueError, ArithmeticError, TypeError, KeyError, msgspec.ValidationError, asyncpg.DataError)
"""Errors that say a run's own data cannot be held by Redis (not that a store is down)."""


def holdable(row: RunRow) -> RunRow:
    """The row if Redis can hold it, else a typed InvalidInput. Looser than fencepost.core.validate's
    ranges on purpose: a run an older version accepted within what Redis can hold still runs."""
    holdable_timeout(row.timeout_s)
    return row


def holdable_timeout(timeout_s: Any) -> None:
    """`holdable`'s check of the one value Redis cannot hold whatever PostgreSQL has (InvalidInput)."""
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and 0 < timeout_s < 2**40):
        raise InvalidInput(f"timeout_s {timeout_s!r} cannot be held (not a finite positive number)", field="timeout")


@dataclass(slots=True)
class Drift:
    queue: str
    kind: str
    run_id: int
    detail: str
    seen_version: str = ""
    """The hash's version field as read (compare-and-set for the Redis repairs)."""
    pg: Any = None
    """The run's PostgreSQL row as read (a drift_runs_brief or, once restored, a drift_runs row;
    None: none read)."""
    hot: Inspected | None = None
    """The run's hash as repair_inspect read it (None: not read, or no hash)."""

    def line(self) -> str:
        return f"{self.queue}\t{self.kind}\t{self.run_id}\t{self.detail}"


@dataclass
class _Cursor:
    pg_last: int = 0
    zsets: dict[str, int] = field(default_factory=dict)
    scan: int = 0


_LOOKUP_PAGE = 50_000
"""Run ids per reconcile_check_lookup."""


class DriftRepair:
    """Finds and repairs drift of one store pair. `tick` does one incremental step per
    queue (a keyset page of PostgreSQL's active runs, the newest active runs, and one
    cursor step over each Redis sorted set and the run hashes); `full_pass` compares
    everything once in bulk reads (the `fencepost reconcile` commands)."""

    def __init__(self, stores: Stores, *, page: int = 500, recent: int = 200, grace_s: float = 5.0,
                 loop: str = "drift") -> None:
        self.stores = stores
        self.loop = loop
        """The loop this instance serves (drift, rebuild or outbox), the label of what it quarantines."""
        self.page = page
        self.recent = recent
        self.grace_s = grace_s
        self._cursors: dict[str, _Cursor] = {}
        self._unrecorded_seen: dict[tuple[str, int, str], float] = {}
        """(queue, run, hash version) of `unrecorded` candidates -> when a tick first saw them."""

    # -- finding ---------------------------------------------------------------------------------
    async def examine(self, queue: str, ids: Iterable[int], *, grace_s: float | None = None,
                      rebuild: bool = False) -> list[Drift]:
        """Compare the given runs in Redis (read first) with PostgreSQL (read second)."""
        ids = sorted(set(ids))
        if not ids:
            return []
        seen: list[Inspected] = []
        for i in range(0, len(ids), INSPECT_BATCH):  # bounded time inside Redis per call
            seen += await self.stores.scripts.repair_inspect(self.stores.keys(queue), ids[i:i + INSPECT_BATCH])
        grace = self.grace_s if grace_s is None else grace_s
        rows = {r.id: r for r in await self.stores.db.rows("drift_runs_brief", ids, float(grace))}
        out: list[Drift] = []
        for rid, f in zip(ids, seen):
            members = [n for n in ("due", "delayed", "active") if getattr(f, n)]
            d = self._classify(queue, rid, f if f.exists else None, members, rows.get(rid), rebuild)
            if d is not None:
                out.append(d)
        return out

    def _classify(self, queue: str, rid: int, h: Inspected | None, members: list[str],
                  p: Any, rebuild: bool) -> Drift | None:
        """`p`: the run's drift_runs_brief row (None: PostgreSQL has no row for it)."""
        settled = p is not None and (p.settled or rebuild)
        if h is None:
            if p is not None and p.queue == queue and settled:
                if p.status in HELD:
                    return Drift(queue, "missing", rid, f"PostgreSQL {p.status} v{p.version}, no Redis hash", pg=p)
                if p.status in LEASED:
                    return Drift(queue, "lost_lease", rid, f"PostgreSQL {p.status}, no Redis hash", pg=p)
            if members and (p is None or p.status not in WAITING | LEASED or settled):
                return Drift(queue, "orphan_member", rid, f"member of {','.join(members)} without a hash")
            return None
        seen = h.version or ""
        if p is None or p.queue != queue:
            return Drift(queue, "orphan_hash", rid, f"hash in state {h.state} without a PostgreSQL row",
                         seen_version=seen, hot=h)
        state = h.state
        corrupt = (state not in KNOWN or not seen.isdigit()
                   or (state in WAITING | LEASED and (not h.handler or not h.payload_len or h.priority is None)))
        if corrupt:
            return Drift(queue, "corrupt", rid, f"hash unreadable (state={state!r}, version={h.version!r})",
                         seen_version=seen, pg=p, hot=h)
        vr, vp, ps = int(seen), p.version, p.status
        if settled and (vr < vp or (vr == vp and ps in DONE and (state != ps or members))):
            if ps in DONE or ps == "STOPPED":
                if state == ps and not members:
                    return None
                return Drift(queue, "terminal_in_pg", rid, f"PostgreSQL {ps} v{vp}, Redis {state} v{vr}",
                             seen_version=seen, pg=p, hot=h)
            return Drift(queue, "stale_hash", rid, f"Redis {state} v{vr} is behind PostgreSQL {ps} v{vp}",
                         seen_version=seen, pg=p, hot=h)
        if state in DONE and vr > vp:
            return Drift(queue, "unrecorded", rid, f"Redis {state} v{vr}, PostgreSQL {ps} v{vp}",
                         seen_version=seen, pg=p, hot=h)
        if rebuild and state in LEASED:
            return Drift(queue, "untrusted_lease", rid, f"leased in an untrusted dataset (token {h.token})",
                         seen_version=seen, pg=p, hot=h)
        if ((state == "PENDING" and not members) or (state == "RETRY_WAIT" and "delayed" not in members)
                or (state in LEASED and "active" not in members)):
            return Drift(queue, "unqueued", rid, f"{state} but in no sorted set for it", seen_version=seen, hot=h)
        return None

    async def unrecorded_confirmed(self, queue: str, cands: list[Drift]) -> list[Drift]:
        """Keep candidates with no entry left in the queue's stream (those the recorder will
        never see), then re-read PostgreSQL: the recorder may have caught up meanwhile."""
        if not cands:
            return []
        pending = await self.stream_runs(queue)
        if pending is None:
            return []
        cands = [d for d in cands if d.run_id not in pending]
        if not cands:
            return []
        fresh = {r.id: r for r in await self.stores.db.rows("drift_runs_brief", [d.run_id for d in cands], 0.0)}
        return [d for d in cands if d.run_id in fresh and fresh[d.run_id].version < int(d.seen_version)]

    async def stream_runs(self, queue: str) -> set[int] | None:
        """The runs with an entry left in the queue's stream (None: too long a stream to read)."""
        return await hotrepair.stream_run_ids(self.stores, self.stores.keys(queue), limit=STREAM_SCAN_LIMIT)

    async def interrupt_lost(self, queue: str, ids: list[int]) -> list[Any]:
        """drift_interrupt_lost: interrupt in PostgreSQL leases Redis no longer holds. A run whose
        stream still has an entry (the reaper's or repair_interrupt's lease_expired the recorder has
        not read yet) is closed without an event row here: the recorder writes that one, so the
        expiry is in the history once, not once from the stream and once written directly."""
        if not ids:
            return []
        pending = await self.stream_runs(queue) or set()
        return await self.stores.db.rows("drift_interrupt_lost", ids, [i for i in ids if i in pending])

    async def tick(self, queue: str, *, repair: bool = True) -> list[Drift]:
        """One incremental step for one queue: bounded work whatever the queue's size."""
        c = self._cursors.setdefault(queue, _Cursor())
        db, keys = self.stores.db, self.stores.keys(queue)
        ids: set[int] = set()
        page = [x.id for x in await db.rows("drift_active_ids", queue, c.pg_last, self.page)]
        c.pg_last = page[-1] if len(page) == self.page else 0
        ids.update(page)
        ids.update(x.id for x in await db.rows("drift_recent_ids", queue, self.recent))
        for z in [*await due_and_held_sets(self.stores, queue), keys.delayed, keys.active]:
            step = await hotrepair.member_page(self.stores, z, c.zsets.get(z, 0), self.page)
            c.zsets[z] = step.cursor
            ids.update(step.ids)
        c.scan, orphans = await self._scan_hashes(queue, c.scan)
        ids.update(orphans)
        found = await self.examine(queue, ids)
        return await self._finish(queue, found, repair, defer=True)

    async def full_pass(self, queue: str, *, repair: bool, grace_s: float | None = None) -> list[Drift]:
        """Compare everything of one queue once (the `fencepost reconcile` commands): `suspects` finds
        the runs whose two sides differ in bulk reads, `examine` classifies those."""
        return await self._finish(queue, await self.examine(queue, await self.suspects(queue), grace_s=grace_s),
                                  repair)

    async def suspects(self, queue: str) -> list[int]:
        """The runs of `queue` whose Redis side may not match PostgreSQL, found in bulk: every run hash
        and sorted-set member of the queue is read (SORT_RO ... GET, 5,000 runs a call) as the line
        `id state version tenant` (the tenant of the due set the run waits in, else its hash's), kept
        only if its hash has a handler and it sits in a set its state may sit in (PENDING: a waiting set
        claims read, its own tenant's or its own key's held set, or delayed; RETRY_WAIT: delayed;
        leased: active; any other state: none); PostgreSQL's runs are read as the same lines (one COPY),
        and a run whose lines differ, or that was not kept, is a suspect. `examine` decides which are
        drift (a hash ahead of PostgreSQL is the recorder's lag). Not read in bulk: the payload and the
        priority (a hash that lost only one of them, which no script does; the incremental walk, `tick`,
        reads both for every run in turn). Redis and PostgreSQL are read at once: a run that changes in
        between is a suspect, which `examine` reads again, Redis first."""
        seen, pg = await asyncio.gather(read_queue(self.stores, queue), self._pg_lines(queue))
        extra = seen.lines - pg
        if extra:  # hashes PostgreSQL's waiting and leased runs do not account for: look their rows up
            ids = [x for x in (t.split(b"\t", 1)[0] for t in extra) if x.isdigit()]
            for i in range(0, len(ids), _LOOKUP_PAGE):
                extra -= await self._pg_lines(queue, [int(x) for x in ids[i:i + _LOOKUP_PAGE]])
        out = seen.odd
        out.update(t.split(b"\t", 1)[0] for t in extra)
        out.update(t.split(b"\t", 1)[0] for t in pg - seen.lines)
        return sorted(int(x) for x in out if x.isdigit())  # a member that is no run id is nothing to read

    async def _pg_lines(self, queue: str, ids: list[int] | None = None) -> set[bytes]:
        """PostgreSQL's `id status version tenant` lines: the queue's runs Redis must hold, or these ids' rows."""
        chunks: list[bytes] = []

        async def sink(chunk: bytes) -> None:
            chunks.append(chunk)

        async with self.stores.db.session() as s:
            if ids is None:
                await s.copy_query("reconcile_check_runs", queue, output=sink)
            else:
                await s.copy_query("reconcile_check_lookup", queue, ids, output=sink)
        lines = set(b"".join(chunks).split(b"\n"))
        lines.discard(b"")
        return lines

    async def _scan_hashes(self, queue: str, cursor: int, count: int | None = None) -> tuple[int, list[int]]:
        """One SCAN step over the queue's run hashes (SCAN walks the whole keyspace: a shared
        Redis with many other keys makes a full pass slower, never a tick longer)."""
        base = self.stores.keys(queue).base
        cursor, names = await scan_queue(self.stores, queue, "run:*", cursor, count or self.page)
        ids = []
        for n in names:
            tail = n[len(base) + 4:]
            if tail.isdigit():
                ids.append(int(tail))
        return cursor, ids

    def _unrecorded_due(self, queue: str, cands: list[Drift]) -> list[Drift]:
        """The `unrecorded` candidates a tick first saw at least `grace_s` ago (same hash version).
        On first sight a run finished in Redis and not yet in PostgreSQL is nearly always one the
        recorder is about to record, and proving its entry gone reads the whole stream: on every
        tick of a busy queue that cost the reconciler ~18 % of its CPU during a drain (issue 18)."""
        if self.grace_s <= 0:
            return cands
        now, seen = time.monotonic(), self._unrecorded_seen
        if len(seen) > 50_000:  # recorded long since, or repaired: forget what is far past the grace
            for key in [k for k, t in seen.items() if now - t > 10 * self.grace_s + 60]:
                del seen[key]
        return [d for d in cands if now - seen.setdefault((queue, d.run_id, d.seen_version), now) >= self.grace_s]

    async def _finish(self, queue: str, found: list[Drift], repair: bool, *, defer: bool = False) -> list[Drift]:
        """`defer` (the incremental tick): an `unrecorded` candidate is confirmed only once it has
        stayed one for the grace period (`_unrecorded_due`); a full pass confirms at once."""
        cands = [d for d in found if d.kind == "unrecorded"]
        if cands:
            due = self._unrecorded_due(queue, cands) if defer else cands
            ok = {d.run_id for d in await self.unrecorded_confirmed(queue, due)}
            found = [d for d in found if d.kind != "unrecorded" or d.run_id in ok]
        found = [d for d in found if d.kind != "untrusted_lease"]
        for d in found:
            DRIFT_FOUND.labels(d.kind, queue).inc()
        if not repair or not found:
            return found
        return await self.repair(queue, found)

    # -- repairing -------------------------------------------------------------------------------
    async def repair(self, queue: str, found: list[Drift], *, record: bool = True) -> list[Drift]:
        """Apply the repairs; returns the drifts actually repaired (each compare-and-set may
        find that the run moved on, which is not drift any more)."""
        stores, keys = self.stores, self.stores.keys(queue)
        hot = stores.scripts
        done: list[Drift] = []
        by_kind: dict[str, list[Drift]] = {}
        for d in found:
            by_kind.setdefault(d.kind, []).append(d)

        drops = [Drop(d.run_id, "member", "") for d in by_kind.get("orphan_member", [])]
        for k in ("orphan_hash", "corrupt", "stale_hash"):
            drops += [Drop(d.run_id, "hash", d.seen_version) for d in by_kind.get(k, [])]
        dropped: set[int] = set()
        if drops:
            dropped = set(await hot.repair_drop(keys, drops))
        for k in ("orphan_member", "orphan_hash"):
            done += [d for d in by_kind.get(k, []) if d.run_id in dropped]

        sync = by_kind.get("terminal_in_pg", [])
        if sync:
            items: list[Sync] = []
            for d in sync:
                assert d.pg is not None
                items.append(Sync(d.run_id, d.seen_version, d.pg.status, d.pg.version))
            synced = set(await hot.repair_sync(keys, TtlArgs(stores.settings.terminal_ttl_s * 1000), items))
            done += [d for d in sync if d.run_id in synced]

        requeue = by_kind.get("unqueued", [])
        if requeue:
            back = set(await hot.repair_requeue(keys,
                                                [Versioned(d.run_id, d.seen_version) for d in requeue]))
            done += [d for d in requeue if d.run_id in back]

        # Runs to restore from PostgreSQL: missing, lost leases, and dropped corrupt/stale hashes.
        restore = by_kind.get("missing", []) + by_kind.get("lost_lease", []) + [
            d for k in ("corrupt", "stale_hash") for d in by_kind.get(k, []) if d.run_id in dropped]
        if restore:
            done += await self._restore(queue, restore)

        unrec = by_kind.get("unrecorded", [])
        if unrec:
            done += await self._record(queue, unrec)

        if record and done:
            await self._write_events(queue, done)
        return done

    async def _restore(self, queue: str, drifts: list[Drift]) -> list[Drift]:
        """Re-read PostgreSQL (the recorder may have moved the run on), interrupt lost leases
        there, and enqueue what is still waiting. enqueue_runs never overwrites a hash."""
        db = self.stores.db
        ids = [d.run_id for d in drifts]
        fresh = {r.id: r for r in await db.rows("drift_runs", ids, 0.0)}
        leased = [i for i in ids if i in fresh and fresh[i].status in LEASED]
        if leased:
            await self.quarantine_values(queue, leased)  # a row outside the bounds cannot be interrupted
            for r in await self.interrupt_lost(queue, leased):
                fresh[r.id] = msgspec.structs.replace(fresh[r.id], status=r.status, version=r.version)
        rows: list[RunRow] = []
        bad: dict[int, str] = {}
        for i in ids:
            if i in fresh and fresh[i].status in HELD:
                try:
                    rows.append(holdable(run_row(fresh[i])))
                except POISON as exc:
                    bad[i] = f"{type(exc).__name__}: {exc}"
        rows = await self.enqueue_isolated(queue, rows, bad)
        if bad:
            await self.quarantine(queue, bad)
        ok = {r.id for r in rows} | {i for i in leased if fresh[i].status == "STOPPED"}
        out = []
        for d in drifts:
            if d.run_id in ok:
                d.pg = fresh[d.run_id]
                out.append(d)
            elif d.kind in ("corrupt", "stale_hash"):  # hash dropped; PostgreSQL has it terminal: nothing to restore
                out.append(d)
        return out

    async def enqueue_isolated(self, queue: str, rows: list[RunRow], bad: dict[int, str]) -> list[RunRow]:
        """enqueue_runs for the batch; if a run's own data breaks it, one run at a time, and the
        runs that fail alone go to `bad` (a store being down is raised, never blamed on a run)."""
        keys = self.stores.keys(queue)
        try:
            await self.stores.scripts.enqueue_runs(keys, rows)
            return rows
        except POISON:
            pass
        ok = []
        for r in rows:
            try:
                await self.stores.scripts.enqueue_runs(keys, [r])
                ok.append(r)
            except POISON as exc:
                bad[r.id] = f"{type(exc).__name__}: {exc}"
        return ok

    async def quarantine(self, queue: str, bad: dict[int, str]) -> list[int]:
        """Cancel runs Redis cannot hold (reason 'quarantined', the error kept), count and log them."""
        ids = sorted(bad)
        done = [r.id for r in await self.stores.db.rows("quarantine_runs", ids, [bad[i][:1000] for i in ids],
                                                         self.loop)]
        if done:
            metrics.QUARANTINED.labels(self.loop, "run").inc(len(done))
        for i in done:
            log.error("run %s quarantined (cancelled, reason quarantined): Redis cannot hold it: %s", i, bad[i],
                      extra={"event": "run_quarantined", "run_id": i, "queue": queue})
        return done

    async def quarantine_values(self, queue: str, ids: list[int]) -> list[int]:
        """Put back inside 010's bounds the values of those runs an older version stored outside
        them (any state: the run goes on), so their rows can be updated again; the stored values
        are kept in a 'quarantined' event (sql/017_quarantine_any_row.sql). Counted and logged."""
        rows = await self.stores.db.rows("quarantine_run_values", ids, self.loop) if ids else []
        if rows:
            metrics.QUARANTINED.labels(self.loop, "run_value").inc(len(rows))
        for r in rows:
            log.error("run %s had values an older version stored outside the bounds (timeout_s %s, max_retries %s); "
                      "put back inside them, the stored values kept in its 'quarantined' event", r.id,
                      r.timeout_s, r.max_retries,
                      extra={"event": "run_values_quarantined", "run_id": r.id, "queue": queue})
        return [r.id for r in rows]

    async def screen(self, queue: str, ids: list[int]) -> None:
        """Before a loop updates these runs' rows: quarantine (cancel) the waiting ones Redis cannot
        hold, and put the stored values of the others back inside the bounds (an UPDATE of a row
        outside a NOT VALID constraint is refused, and would fail the whole batch)."""
        rows = await self.stores.db.rows("unbounded_runs", ids) if ids else []
        if not rows:  # nearly always: a row outside the bounds is one an older version wrote
            return
        bad: dict[int, str] = {}
        for r in rows:
            if r.status in HELD:
                try:
                    holdable_timeout(r.timeout_s)
                except POISON as exc:
                    bad[r.id] = f"{type(exc).__name__}: {exc}"
        if bad:
            await self.quarantine(queue, bad)
        await self.quarantine_values(queue, [r.id for r in rows if r.id not in bad])

    async def _record(self, queue: str, drifts: list[Drift]) -> list[Drift]:
        """Record in PostgreSQL the terminal states only Redis saw (`unrecorded`: their stream entries
        are gone), with the result each hash holds, then let those hashes expire."""
        keys = self.stores.keys(queue)
        results = await hotrepair.run_results(self.stores, keys, [d.run_id for d in drifts])
        cols: list[list[Any]] = [[] for _ in range(9)]
        for d, res in zip(drifts, results, strict=True):
            h = d.hot
            assert h is not None  # an `unrecorded` drift is classified from its hash
            for i, v in enumerate((d.run_id, h.state, int(d.seen_version), int(h.attempt or 0),
                                   int(h.token) if h.token else None, res, h.error_class,
                                   (h.error or None) and h.error[:4000], h.reason or None)):
                cols[i].append(v)
        written = {r.id: r.from_status for r in await self.stores.db.rows("drift_record_terminal", *cols)}
        out = [d for d in drifts if d.run_id in written]
        if out:
            ttl = TtlArgs(self.stores.settings.terminal_ttl_s * 1000)
            await self.stores.scripts.expire_finished(keys, ttl, [Versioned(d.run_id, d.seen_version) for d in out])
        return out

    async def _write_events(self, queue: str, done: list[Drift]) -> None:
        cols: list[list[Any]] = [[] for _ in range(6)]
        for d in done:
            pg_status, pg_version = (d.pg.status, d.pg.version) if d.pg is not None else (None, None)
            state = d.hot.state if d.hot is not None else None
            frm, to, ver = state, pg_status, pg_version
            if d.kind == "unrecorded":
                frm, to, ver = pg_status, state, int(d.seen_version)
            elif d.kind in ("orphan_hash", "orphan_member", "unqueued"):
                to = None if d.kind != "unqueued" else state
            for i, v in enumerate((d.run_id, frm, to, ver, d.kind,
                                   json.dumps({"queue": queue, "detail": d.detail}))):
                cols[i].append(v)
            DRIFT_REPAIRED.labels(d.kind, queue).inc()
            log.warning("repaired drift %s of run %s: %s", d.kind, d.run_id, d.detail,
                        extra={"event": "drift_repaired", "run_id": d.run_id, "queue": queue})
        await self.stores.db.execute("drift_events", *cols)
