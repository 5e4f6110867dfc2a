"""The recorder: moves transitions from each queue's Redis Stream into PostgreSQL.

Reads with a consumer group, writes a batch in one transaction (events, run
projection, attempts), and acknowledges only after commit. A recorder killed
mid-batch re-reads its pending entries on restart; the unique (stream, stream_id)
index turns a replayed entry into a no-op, so nothing is lost or doubled; a transition Redis
makes twice (a promoted replica that lost the first one's write repeats it at the same version,
under a new stream id) is recorded once per (run, type, version).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from redis.exceptions import ClusterError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fencepost.core import hotrepair, stats
from fencepost.core import release as workflows
from fencepost.core.errors import IdempotencyConflict, InvalidInput, RedisUnavailable
from fencepost.core.hot import TtlArgs, Versioned
from fencepost.core.hotrepair import GROUP, Entry, EventStreams
from fencepost.core.metrics import QUARANTINED, Cached
from fencepost.core.models import Submit
from fencepost.core.record import REFUSED
from fencepost.core.states import ACTIVE, TERMINAL
from fencepost.core.stores import Stores
from fencepost.core.submit import SubmitPath
from fencepost.reconciler import gauges
from fencepost.reconciler.shares import Shares, reconciler_id

__all__ = ["GROUP", "Recorder", "stream_id_int"]

log = logging.getLogger("fencepost.recorder")
RedisUnavailableErrors = (RedisConnectionError, RedisTimeoutError, ClusterError, TryAgainError, OSError, RedisUnavailable)
"""A node of the hot store unreachable (a Redis Cluster shard down or failing over): that queue waits."""

_json = msgspec.json.Encoder()
_UTC = UTC
_TERMINAL = {s.value for s in TERMINAL}
_ACTIVE = {s.value for s in ACTIVE}


def _ts(ms: Any) -> datetime:
    return datetime.fromtimestamp(int(ms) / 1000, _UTC)


_EVENT_COLUMNS = ("run_id", "type", "from_status", "to_status", "version", "attempt", "token", "worker_id", "reason",
                  "error_class", "error_message", "at", "stream", "stream_id", "actor", "queue")
"""The event row as COPY writes it (the positions of insert_events_json, `at` a timestamp). `queue` is
the stream's: each queue has its own stream, so the entry needs no field for it (047)."""


def _queue_of(stream: str) -> str:
    """The queue whose events stream this is: the stream key's hash tag (every key of a queue shares it)."""
    return stream[stream.index("{") + 1: stream.index("}")]


_TEXT_FIELDS = frozenset({b"actor", b"reason", b"error", b"error_class", b"worker"})


def _storable(raw: bytes) -> bytes:
    """Text PostgreSQL accepts: valid UTF-8, no NUL (control characters shown as \\xNN escapes)."""
    text = raw.decode("utf-8", errors="replace")
    return "".join(ch if ch >= " " and ch != "\x7f" else f"\\x{ord(ch):02x}" for ch in text).encode()


def stream_id_int(entry_id: bytes) -> int:
    """Redis entry id 'ms-seq' as one sortable bigint: ms * 2^20 + seq."""
    ms, _, seq = entry_id.partition(b"-")
    return (int(ms) << 20) | int(seq)


_R_ID, _R_STATUS, _R_VERSION, _R_ATTEMPT, _R_TOKEN, _R_WORKER, _R_LEASE, _R_STARTED, _R_FINISHED, _R_RUN_AT, \
    _R_ERROR, _R_ERROR_CLASS, _R_REASON, _R_RESULT, _R_AT, _R_CTL, _R_FORCED, _R_GEN = range(18)
"""Slots of a run's projection row: apply_runs' parameters $1-$18, in order."""

_BUCKETS = len(stats.BOUNDS_MS) + 1
_KIND_SLOT = {"started": 2, "succeeded": 3, "failed": 4, "retried": 5}
_LAG_HIST, _RUN_HIST = 6, 7
"""rollup_minutes' row: queue, minute, the four counts, the start-lag and run-time histograms."""

_A_TOKEN, _A_WORKER, _A_STARTED, _A_FINISHED, _A_OUTCOME, _A_ERROR_CLASS, _A_ERROR, _A_CLAIM_V, _A_CLAIM_SID, \
    _A_FTYPE, _A_FFROM, _A_FTO, _A_FV, _A_FSID, _A_REASON, _A_QUEUE = range(2, 18)
"""Slots of an attempt row (after run id and attempt): apply_attempts' parameters $1-$18, in order."""
_ATTEMPT_WIDTH = 18

_FINISHES = frozenset({b"succeeded", b"failed", b"timed_out", b"paused", b"cancelled", b"stopped", b"released"})
"""Entry types a worker's finish (finish_runs.lua, release_runs.lua) writes when it closes its attempt.
Such an entry without an actor, and every claim, is history as a column of the attempt's row, not an
event row (DESIGN.md invariant 5); an operator's command, a retry scheduled, a lease expiry stays an event."""


class _Recorded(ValueError):
    """A batch read as fresh is in PostgreSQL already (a recorder that lost its consumer name mid-batch):
    recorded again the replay way, which skips what is there."""


def _folded(f: dict[bytes, bytes]) -> bool:
    """Whether this entry's transition is recorded in its attempt's row rather than as an event row."""
    typ = f[b"type"]
    if typ == b"claimed":
        return True
    return (typ in _FINISHES and b"actor" not in f and b"attempt" in f and b"token" in f and b"worker" in f
            and (typ == b"succeeded" or b"outcome" in f))


def _count(status: str) -> int:
    """The row count of a statement's status ('UPDATE 12', 'INSERT 0 12')."""
    return int(status.rsplit(" ", 1)[-1])


def _columns(rows: Iterable[Sequence[Any]], width: int) -> list[list[Any]]:
    """Rows to one array per column (the transposition in C). A column that is NULL in every row goes
    as an empty array: the statements read their arrays with multi-argument unnest, which pads a
    shorter array with NULLs, and asyncpg then encodes nothing for it (most error, reason and
    control columns of a batch of successes)."""
    cols = [list(c) for c in zip(*rows, strict=True)] or [[] for _ in range(width)]
    for i, col in enumerate(cols):
        if col.count(None) == len(col):
            cols[i] = []
    return cols


def _rows(entries: list[Entry], at_of: dict[bytes, datetime]) -> list[tuple[Any, ...]]:
    """Each entry parsed once, into its event row (_EVENT_COLUMNS' order; `at` a datetime, made once
    per ts value into `at_of`: the entries of one script call share their ts). The statements and
    `_fold` reuse these rows: no entry is parsed twice."""
    rows = []
    queues: dict[str, str] = {}  # a batch comes from a few streams: each one's queue parsed once
    for stream, entry_id, f in entries:
        queue = queues.get(stream)
        if queue is None:
            queue = queues[stream] = _queue_of(stream)
        g = f.get
        a, t, w, r = g(b"attempt"), g(b"token"), g(b"worker"), g(b"reason") or g(b"outcome")
        ec, em, actor = g(b"error_class"), g(b"error"), g(b"actor")
        ts = f[b"ts"]
        at = at_of.get(ts)
        if at is None:
            at = at_of[ts] = _ts(ts)
        ms, _, seq = entry_id.partition(b"-")
        rows.append((int(f[b"run"]), f[b"type"].decode(), f[b"from"].decode(), f[b"to"].decode(), int(f[b"v"]),
                     int(a) if a else None, int(t) if t else None, w.decode() if w else None,
                     r.decode() if r else None, ec.decode() if ec else None,
                     em.decode(errors="replace") if em else None, at, stream,
                     (int(ms) << 20) | int(seq), actor.decode() if actor else None, queue))
    return rows


class _Fold:
    """One batch folded into the rows PostgreSQL takes in one statement each (`Recorder._fold` walks
    the entries): every entry updates its run's projection row (`project`), a claim opens its
    attempt's row (`claim`), a finish closes it (`close`), and a start or finish counts in its
    queue's minute of the dashboard's rollup (`count`). `columns` hands the rows over as the
    statements' arguments. One method per table, so each rule reads alone; rows are lists indexed by
    the statements' parameter slots (_R_*, _A_*), the cheapest shape to fill and transpose."""

    __slots__ = ("at_of", "atts", "compensations", "groups", "looked", "runs", "started", "unstarted")

    def __init__(self, at_of: dict[bytes, datetime]) -> None:
        self.at_of = at_of
        """Datetimes already made for the batch's ts values (and lease and start times: a claim batch shares them)."""
        self.runs: dict[int, list[Any]] = {}
        """Run id -> apply_runs' row."""
        self.atts: dict[tuple[int, int], list[Any]] = {}
        """(run, attempt) -> apply_attempts' row."""
        self.unstarted: set[tuple[int, int]] = set()
        """Attempts closed with no start known (written by apply_attempts_by_run)."""
        self.compensations: list[tuple[int, str]] = []
        """(cancelled run, compensation handler) for the runs cancelled with a compensation to run."""
        self.groups: dict[tuple[str, int], list[Any]] = {}
        """(queue, minute) -> rollup_minutes' row."""
        self.started: dict[tuple[int, int | None], int] = {}
        """(run, attempt) -> claim ts (ms), from this batch."""
        self.looked: list[tuple[str, datetime, int, int | None]] = []
        """Finishes whose run time PostgreSQL has (their claim was recorded in an earlier batch)."""

    def _at(self, ms: bytes) -> datetime:
        at = self.at_of.get(ms)
        if at is None:
            at = self.at_of[ms] = _ts(ms)
        return at

    def project(self, row: tuple[Any, ...], f: dict[bytes, bytes]) -> list[Any]:
        """The entry applied to its run's projection row: the batch's entries of a run come in order, so
        the last state, version and attempt stand, and a field an entry does not carry keeps what an
        earlier one set (apply_runs keeps PostgreSQL's value where the row holds NULL)."""
        run_id, status, a, at = row[0], row[3], row[5], row[11]
        p = self.runs.get(run_id)
        if p is None:
            p = self.runs[run_id] = [run_id, None, None, None, None, None, None, None, None, None, None, None, None,
                                     None, None, None, None, None]
        p[_R_STATUS] = status
        p[_R_VERSION] = row[4]
        p[_R_AT] = at
        if a is not None:
            p[_R_ATTEMPT] = a
        token = f.get(b"token")
        if token is not None:
            p[_R_TOKEN] = int(token)
        worker = f.get(b"worker")
        if worker is not None:
            p[_R_WORKER] = worker.decode()
        if b"run_at" in f:
            p[_R_RUN_AT] = _ts(f[b"run_at"])
        if b"error" in f:
            p[_R_ERROR] = f[b"error"].decode(errors="replace")[:4000]
            p[_R_ERROR_CLASS] = f[b"error_class"].decode()
        if b"reason" in f:
            p[_R_REASON] = f[b"reason"].decode()
        if b"result" in f:
            p[_R_RESULT] = f[b"result"]
        if b"ctl" in f:
            p[_R_CTL] = f[b"ctl"].decode()
        if b"forced" in f:
            p[_R_FORCED] = True
        if b"gen" in f:
            p[_R_GEN] = int(f[b"gen"])
        if b"compensate" in f and status == "CANCELLED":
            self.compensations.append((run_id, f[b"compensate"].decode()))
        if status in _TERMINAL or status == "STOPPED":
            p[_R_FINISHED] = at
        return p

    def claim(self, p: list[Any], row: tuple[Any, ...], f: dict[bytes, bytes]) -> None:
        """A claim: the run's lease and start, and a new attempt row (its token and worker as `project`
        just set them). A claim always carries attempt, token and worker: one without is malformed."""
        run_id, a, at = row[0], row[5], row[11]
        p[_R_LEASE] = self._at(f[b"lease"])  # a claim batch shares its lease expiry
        p[_R_STARTED] = at
        p[_R_RESULT] = None
        if a is None or b"token" not in f or b"worker" not in f:
            raise KeyError(f"claim of run {run_id} without attempt, token or worker")
        self.atts[(run_id, a)] = [run_id, a, p[_R_TOKEN], p[_R_WORKER], at, None, None, None, None,
                                  row[4], row[13], None, None, None, None, None, None, row[15]]
        self.unstarted.discard((run_id, a))

    def close(self, row: tuple[Any, ...], f: dict[bytes, bytes], folded: bool, outcome: bytes) -> None:
        """A finish: its attempt's outcome and error, on the row the batch's claim opened or on a new
        one (the start from the entry's `started`, which names the attempt's partition; without it the
        row goes by run, `unstarted`). A `folded` finish is a column of the row, not an event row."""
        run_id, a = row[0], row[5]
        att = self.atts.get((run_id, a))
        if att is None:
            begun_ms = f.get(b"started")
            if begun_ms:
                begun_at: datetime | None = self._at(begun_ms)
            else:
                begun_at = None
                self.unstarted.add((run_id, a))
            att = self.atts[(run_id, a)] = [run_id, a, int(f[b"token"]), f[b"worker"].decode(), begun_at,
                                            None, None, None, None, None, None, None, None, None, None, None, None,
                                            row[15]]
        att[_A_FINISHED] = row[11]
        att[_A_OUTCOME] = outcome.decode()
        att[_A_ERROR_CLASS] = f[b"error_class"].decode() if b"error_class" in f else None
        att[_A_ERROR] = f[b"error"].decode(errors="replace")[:4000] if b"error" in f else None
        if folded:
            att[_A_FTYPE], att[_A_FFROM], att[_A_FTO], att[_A_FV], att[_A_FSID], att[_A_REASON] = (
                row[1], row[2], row[3], row[4], row[13], row[8])

    def count(self, row: tuple[Any, ...], f: dict[bytes, bytes], kind: str) -> None:
        """The dashboard's per-minute counts and histograms (stats.BOUNDS_MS buckets): a start counts
        its lag behind the due time, a success or failure its run time (from the batch's claim, else
        the entry's `started`, else left to PostgreSQL: `looked`)."""
        run_id, a = row[0], row[5]
        t = int(f[b"ts"])
        queue = row[15]
        grp = self.groups.get((queue, t // 60_000))
        if grp is None:
            grp = self.groups[(queue, t // 60_000)] = [queue, _ts(t - t % 60_000), 0, 0, 0, 0,
                                                       [0] * _BUCKETS, [0] * _BUCKETS]
        grp[_KIND_SLOT[kind]] += 1
        if kind == "started":
            self.started[(run_id, a)] = t
            due = f.get(b"due")
            if due:
                grp[_LAG_HIST][bisect_right(stats.BOUNDS_MS, max(0, t - int(due)))] += 1
        elif kind != "retried":  # succeeded / failed: the attempt's run time
            begun = self.started.get((run_id, a))
            if begun is None and b"started" in f:
                begun = int(f[b"started"])
            if begun is None:
                self.looked.append((queue, grp[1], run_id, a))
            else:
                grp[_RUN_HIST][bisect_right(stats.BOUNDS_MS, t - begun)] += 1

    def columns(self) -> tuple[list[list[Any]], list[list[Any]], list[list[Any]], list[list[Any]]]:
        """apply_runs' column arrays, the attempt rows whose start is known and those whose start is not
        (apply_attempts / apply_attempts_by_run), and rollup_minutes' arguments, each in key order
        (recorder replicas lock rows in one order: no deadlock between them)."""
        for p in self.runs.values():  # what apply_runs would ignore goes as NULL: fewer values to encode
            if p[_R_STATUS] not in _ACTIVE:  # a lease and its owner are kept only for an active run
                p[_R_WORKER] = p[_R_LEASE] = None
            if p[_R_FINISHED] is not None:  # `at` only stands in for a finish time the fold did not set
                p[_R_AT] = None
        groups = self.groups
        mins = [groups[k] for k in sorted(groups, key=lambda k: (k[1], k[0]))]  # queue_minutes' key order
        rollup = [[g[i] for g in mins] for i in range(_LAG_HIST)]
        rollup += [[n for g in mins for n in g[_LAG_HIST]], [n for g in mins for n in g[_RUN_HIST]]]
        rollup += [list(c) for c in zip(*self.looked, strict=True)] if self.looked else [[], [], [], []]
        atts, unstarted = self.atts, self.unstarted
        pruned = [atts[k] for k in sorted(atts) if k not in unstarted]
        closes = [atts[k] for k in sorted(unstarted)]
        runs = self.runs
        return (_columns([runs[k] for k in sorted(runs)], 18) if runs else []), pruned, closes, rollup


class Recorder:
    def __init__(self, stores: Stores, *, batch: int = 5000, consumer: str | None = None,
                 claim_idle_ms: int = 30_000, shares: Shares | None = None) -> None:
        self.stores = stores
        self.shares = shares
        """The queues whose streams this recorder reads, among reconcilers as replicas (None: every queue)."""
        self.batch = batch
        # Stable across restarts of one host/container, so a restarted recorder re-reads its own pending entries.
        self.consumer = consumer or reconciler_id()
        self.claim_idle_ms = claim_idle_ms
        self._groups: set[str] = set()
        self.recorded = 0
        self._expired_at: dict[int, int] = {}
        self._metrics = Cached()
        self.streams = EventStreams(stores)
        """The consumer group on the queues' events streams (fencepost.core.hotrepair)."""
        self.poison_key = self.streams.poison_key
        """Entries PostgreSQL refused even alone (a bug or corrupt data): kept for an operator."""
        self.last_lag_s = 0.0
        self._pg_queues: set[str] = set()
        self._pg_queues_at = -math.inf
        self._redis_queues: set[str] = set()
        self._stream_warned: dict[str, float] = {}
        self._submit = SubmitPath(stores, actor="recorder")
        """Compensation runs are submitted through the one submit path (its checks), keyed per cancelled
        run in a namespace of their own (no producer's idempotency key can reach theirs)."""
        self._submit.idempotency_namespace = "compensation"
        self._versions: dict[int, tuple[str, int, str]] = {}
        self._compensations: list[tuple[int, str]] = []
        self._new_queues: dict[str, int] = {}

    linger_s = 0.05
    """After a batch of fewer than `linger_batch` entries, wait this long before reading again, so
    the next batch carries more. A batch has a fixed cost (its transaction and statements, the
    acknowledgement: ~5 ms of CPU over the recorder, PostgreSQL and Redis), and a recorder that
    keeps up reads many small batches. Bounds the history lag it adds; 0 turns it off."""

    linger_batch = 1000

    async def _ensure_groups(self, queues: list[str]) -> list[str]:
        """The queues' streams, each with its group. A stream whose group cannot be made (its Redis
        Cluster shard down) is left out of this batch, said once per stream every 10 s, so the other
        queues are recorded; only every stream failing raises. (Before, the dead shard's XGROUP CREATE
        failed the whole batch on every pass: no queue's history was recorded until its failover.)"""
        streams: list[str] = []
        failed: BaseException | None = None
        for q in queues:
            s = self.stores.keys(q).events
            if s not in self._groups:
                try:
                    await self.streams.create_group(s)
                except RedisUnavailableErrors as exc:
                    failed = exc
                    self._stream_failed(s, exc)
                    continue
                self._groups.add(s)
            streams.append(s)
        if not streams and failed is not None:
            raise failed
        return streams

    queues_every_s = 5.0
    """How often the queues PostgreSQL lists are read again (beside Redis's set, read every batch)."""

    async def queues(self) -> list[str]:
        """Every queue whose stream may hold history: Redis's set of queues and PostgreSQL's. Redis's
        alone can miss one: a queue created while the node holding the set was failing over (a
        Redis Cluster shard kill) was used on a healthy shard, but its SADD failed, so its runs ran
        and their history stayed in a stream no recorder read (the cluster soak's untraced execution)."""
        try:
            names = await hotrepair.queue_names(self.stores)
            self._redis_queues = names
        except RedisUnavailableErrors as exc:  # the set's shard is down: the queues known already go on
            if not self._redis_queues and not self._pg_queues:
                raise
            names = self._redis_queues
            self._stream_failed(self.stores.queues_key, exc)
        if time.monotonic() - self._pg_queues_at >= self.queues_every_s:
            try:
                self._pg_queues = {r.name for r in await self.stores.db.rows("queue_epochs")}
                self._pg_queues_at = time.monotonic()
            except Exception as exc:  # PostgreSQL down: record what Redis lists; the batch's write will wait
                log.debug("queue list from PostgreSQL unavailable: %s", exc)
        return sorted(names | self._pg_queues)

    async def run_once(self, *, block_ms: int = 200, pending: bool = False) -> int:
        """Read one batch (own pending entries first if `pending`) and record it. Returns entries handled."""
        queues = await self.queues()
        if self.shares is not None and not pending:  # its own pending entries it replays wherever they are
            await self.shares.refresh()
            queues = self.shares.mine(queues)
        if not queues:
            await asyncio.sleep(block_ms / 1000)
            return 0
        streams = await self._ensure_groups(queues)
        read = await self.streams.read(streams, self.consumer, pending=pending, count=self.batch, block_ms=block_ms)
        for stream, exc in read.failed.items():  # its shard down: its group is made again on the next read
            self._groups.discard(stream)
            self._stream_failed(stream, exc)
        if read.entries:
            await self.record(read.entries, fresh=not pending)
        return len(read.entries)

    def _stream_failed(self, stream: str, exc: BaseException) -> None:
        """One stream unreadable (its shard down): said once per stream every 10 s, the rest go on."""
        now = time.monotonic()
        if now - self._stream_warned.get(stream, -math.inf) >= 10:
            self._stream_warned[stream] = now
            log.warning("recorder cannot read %s (its shard?): %s; the other queues are recorded", stream, exc,
                        extra={"event": "recorder_stream_unreadable"})

    async def adopt_orphans(self) -> int:
        """Take over entries another recorder read but never acknowledged (it died). A queue whose
        stream cannot be read (a Redis Cluster shard down) is skipped until the next pass."""
        handled = 0
        for queue in await self.queues():
            try:
                handled += await self._adopt(queue)
            except RedisUnavailableErrors as exc:
                stream = self.stores.keys(queue).events
                self._groups.discard(stream)
                self._stream_failed(stream, exc)
        return handled

    async def _adopt(self, queue: str) -> int:
        handled = 0
        stream = (await self._ensure_groups([queue]))[0]
        start: bytes | str = "0-0"
        while True:
            page = await self.streams.adopt(stream, self.consumer, min_idle_ms=self.claim_idle_ms, start=start,
                                            count=self.batch)
            if page.entries:
                await self.record(page.entries)
                handled += len(page.entries)
            if page.done:
                return handled
            start = page.next

    async def run(self, stop: asyncio.Event) -> None:
        last_adopt = 0.0
        while not stop.is_set():  # replay what a previous incarnation read but did not acknowledge
            try:
                if await self.run_once(pending=True) == 0:
                    break
            except Exception as exc:
                log.warning("recorder replay failed: %s", exc)
                self._groups.clear()  # Redis may have lost the stream and its group (restart, failover)
                await asyncio.sleep(1)
        replay = False
        while not stop.is_set():
            try:
                if replay:  # a failed batch stays pending to us: retry it until recorded, not after claim_idle_ms
                    replay = await self.run_once(pending=True) > 0
                    continue
                if time.monotonic() - last_adopt > self.claim_idle_ms / 2000:
                    last_adopt = time.monotonic()
                    await self.adopt_orphans()
                if 0 < await self.run_once() < self.linger_batch:
                    await asyncio.sleep(self.linger_s)  # let the next batch fill (bounded extra history lag)
            except Exception as exc:
                log.warning("recorder batch failed, will retry: %s", exc, extra={"event": "recorder_retry"})
                self._groups.clear()  # Redis may have lost the stream and its group (restart, failover)
                replay = True
                await asyncio.sleep(0.5)

    async def record(self, entries: list[Entry], *, fresh: bool = False) -> None:
        """Record a batch; a batch PostgreSQL refuses (not a connection problem: a constraint,
        bad data) is split in halves until the entry at fault is isolated, so one poison entry
        never stalls the history of everything behind it.

        `fresh`: entries read for the first time (XREADGROUP '>'), so none can be in PostgreSQL
        yet: their events are written by binary COPY (half the server's CPU of the jsonb insert).
        Should one be there after all (a recorder that lost its consumer name mid-batch), the
        unique (stream, stream_id, at) index refuses the COPY and the batch is recorded again the
        replay way, skipping what is there; so is a batch refused for any other reason (then split
        below as usual)."""
        if fresh:
            try:
                await self._record(entries, copy=True)
                return
            except (*REFUSED, ValueError, KeyError, UnicodeDecodeError):
                pass
        try:
            await self._record(entries)
        except (*REFUSED, ValueError, KeyError, UnicodeDecodeError) as exc:  # refused by PostgreSQL, or malformed
            if len(entries) > 1:
                mid = len(entries) // 2
                await self.record(entries[:mid])
                await self.record(entries[mid:])
            else:
                await self._quarantine(entries[0], exc)

    async def _quarantine(self, entry: Entry, exc: Exception) -> None:
        """Keep an unrecordable entry where an operator can see it (never drop history), then
        acknowledge it so the stream moves on. An operator's command (an entry with an actor) is
        audited whatever its text: it is recorded with its text made storable first, and only
        quarantined (an alert) if even that is refused."""
        stream, entry_id, fields = entry
        run = int(fields.get(b"run", b"0") or 0)
        if getattr(exc, "sqlstate", None) == "23514" and run:  # check_violation: a row an older version stored?
            fixed = await self.stores.db.rows("quarantine_run_values", [run], "recorder")
            if fixed:  # its values put back inside the bounds (sql/017_quarantine_any_row.sql): record it now
                QUARANTINED.labels("recorder", "run_value").inc()
                log.error("run %s had values an older version stored outside the bounds (timeout_s %s, max_retries "
                          "%s); put back inside them so its history can be recorded", run, fixed[0].timeout_s,
                          fixed[0].max_retries, extra={"event": "run_values_quarantined", "run_id": run})
                try:
                    await self._record([entry])
                    return
                except (*REFUSED, ValueError, KeyError, UnicodeDecodeError) as again:
                    exc = again
        if fields.get(b"actor") and not fields.get(b"sanitized"):
            clean = {k: (_storable(v) if k in _TEXT_FIELDS else v) for k, v in fields.items()}
            clean[b"sanitized"] = b"1"
            try:
                await self._record([(stream, entry_id, clean)])
                log.error("command %s of %s had text PostgreSQL refused (%s); recorded with it escaped", entry_id,
                          stream, exc, extra={"event": "recorder_sanitized",
                                              "run_id": int(fields.get(b"run", b"0") or 0)})
                return
            except (*REFUSED, ValueError, KeyError, UnicodeDecodeError):
                pass  # quarantined below, with the alert
        log.error("transition %s of %s cannot be recorded (%s); kept in %s", entry_id, stream, exc,
                  self.poison_key, extra={"event": "recorder_poison", "run_id": int(fields.get(b"run", b"0") or 0)})
        await self.streams.quarantine(entry, str(exc)[:500])
        gauges.POISON.inc()

    async def _record(self, entries: list[Entry], *, copy: bool = False) -> None:
        """Record one batch in one transaction, then acknowledge it. `copy`: a fresh batch, its event
        rows written by binary COPY (see `record`). Each entry is parsed once (`_rows`); transitions
        PostgreSQL holds already are skipped (`_repeated`); the event rows are written
        (`_copy_events`, or `_unrecorded` for a replay), the rest folded into the runs' and attempts'
        rows and written (`_apply`)."""
        at_of: dict[bytes, datetime] = {}  # the entries of one script call share their ts: one datetime each
        rows = _rows(entries, at_of)
        folded = [_folded(f) for _, _, f in entries]
        self._new_queues = {}
        async with self.stores.db.transaction() as tx:
            repeated = await self._repeated(tx, rows, folded)
            if copy:
                new = await self._copy_events(tx, entries, rows, folded, repeated)
            else:
                new = await self._unrecorded(tx, entries, rows, folded, repeated)
            runs, new = await self._apply(tx, entries, new, at_of, rows, folded, repeated, copy=copy)
        await self._acknowledge(entries, runs)
        if self._new_queues:  # a compensation's queue its insert created: stamped as a submit's would be
            await self._stamp_created(self._new_queues)
        self._observe(entries, new, rows)
        self.recorded += len(entries) if new is None else len(new)
        self.last_lag_s = max(0.0, time.time() - int(entries[-1][2][b"ts"]) / 1000)

    async def _copy_events(self, tx: Any, entries: list[Entry], rows: Sequence[tuple[Any, ...]],
                           folded: Sequence[bool], repeated: set[int]) -> set[tuple[str, int]] | None:
        """A fresh batch's event rows by binary COPY, the `repeated` ones left out: they are neither
        written nor counted, nor folded into the run's or attempt's row. Returns the (stream, stream id)
        of the entries to fold (None: all of them)."""
        events = [row for i, (row, fold) in enumerate(zip(rows, folded, strict=True)) if not fold and i not in repeated]
        if events:
            await tx.copy_in("events", events, _EVENT_COLUMNS)
        if not repeated:
            return None
        return {(stream, row[13]) for i, (row, (stream, _, _)) in enumerate(zip(rows, entries, strict=True))
                if i not in repeated}

    async def _apply(self, tx: Any, entries: list[Entry], new: set[tuple[str, int]] | None,
                     at_of: dict[bytes, datetime], rows: Sequence[tuple[Any, ...]], folded: Sequence[bool],
                     repeated: set[int], *, copy: bool) -> tuple[list[list[Any]], set[tuple[str, int]] | None]:
        """Fold the entries in `new` (None: all) and write what they make: the runs' projection (and the
        workflow steps it releases or cancels), the attempts, the dashboard's rollup, the compensations.
        Returns apply_runs' columns and `new`, narrowed when a fresh batch turns out to be recorded
        before (only what it adds is counted)."""
        runs, attempts, unstarted, rollup = self._fold(entries, new, at_of, rows, folded)
        late = False
        if runs:
            late = _count(await tx.execute("apply_runs", *runs)) < len(runs[_R_ID])
            await workflows.on_recorded(tx, runs[_R_ID], runs[_R_STATUS])  # release / cancel dependents
        if late:  # another batch recorded a newer version of a run: its claims may come after their close
            if copy:  # or this batch was recorded before: count only what it adds (rollup, metrics)
                new = await self._add_folded(tx, entries, rows, folded, {
                    (stream, row[13]) for i, (row, (stream, _, _), fold)
                    in enumerate(zip(rows, entries, folded, strict=True)) if not fold and i not in repeated})
                if new is not None:
                    _, attempts, unstarted, rollup = self._fold(entries, new, at_of, rows, folded)
            attempts, unstarted = [], sorted(attempts + unstarted, key=lambda r: (r[0], r[1]))
        if attempts:
            if _count(await tx.execute("apply_attempts", *_columns(attempts, _ATTEMPT_WIDTH))) < len(attempts) \
                    and copy:
                raise _Recorded("a fresh batch's attempts are in PostgreSQL already")
        if unstarted:
            await tx.execute("apply_attempts_by_run", *_columns(unstarted, _ATTEMPT_WIDTH))
        if rollup[0]:  # the dashboard's per-minute counts, exactly once with the events they count
            await tx.execute("rollup_minutes", *rollup)
        if self._compensations:
            await self._compensate(tx, self._compensations)
        return runs, new

    async def _compensate(self, tx: Any, cancelled: list[tuple[int, str]]) -> None:
        """Flag each cancelled run that needs compensation, and submit its compensation run through the
        one submit path (core/submit.py: the checks of every submit) in this transaction, keyed
        `compensate:<run>` so a cancel recorded twice submits it once. The run goes PENDING with the
        outbox flag: the outbox relay moves it to Redis after the commit, as before. One the submit
        path refuses (its handler unknown, arguments it cannot take, a payload over the limit) is
        logged and counted, and the batch goes on: the cancelled run stays flagged for an operator.
        Handler '!' (no compensation declared) only flags."""
        await tx.execute("flag_compensation", [rid for rid, _ in cancelled])
        path = self._submit
        path.defs = {}  # the declarations as they are now (a recorder runs for months): read once per batch
        for rid, handler in cancelled:
            if handler == "!":
                continue
            req = Submit(handler=handler, args=(rid,), idempotency_key=f"compensate:{rid}")
            try:
                rows = await path.prepare([req], outbox=True)
                _, _, new_queues = await path.insert([req], rows, tx)
            except (InvalidInput, IdempotencyConflict) as exc:  # a store down is raised: the batch is retried
                QUARANTINED.labels("recorder", "compensation").inc()
                log.error("compensation %s of cancelled run %s refused by the submit path (%s: %s); the run "
                          "stays flagged needs_compensation", handler, rid, type(exc).__name__, exc,
                          extra={"event": "compensation_refused", "run_id": rid})
                continue
            self._new_queues.update(new_queues)

    async def _stamp_created(self, new_queues: dict[str, int]) -> None:
        """Stamp the queues a compensation created (SubmitPath.stamp, after the commit). Redis refusing
        leaves them to the rebuild, which stamps every unstamped queue: the batch is recorded."""
        try:
            await self._submit.stamp(new_queues)
        except RedisUnavailableErrors as exc:
            log.warning("queues %s created by a compensation not stamped yet (%s); left to the rebuild",
                        sorted(new_queues), exc)

    async def _repeated(self, tx: Any, rows: Sequence[tuple[Any, ...]], folded: Sequence[bool]) -> set[int]:
        """Positions of the event rows whose transition (run, type, version) is recorded already: in
        PostgreSQL (from another stream entry, or written directly) or by an earlier entry of this
        batch. A Redis that lost a write (a lagging replica promoted) makes the same transition again
        at the same version (a second reap of a lease whose first reap it forgot) under a new stream
        id, which the (stream, stream_id, at) key cannot catch. The run's version is the transition's
        identity (every Redis transition bumps it), so the first record stands: no second event row,
        and the repeat does not touch the run's or the attempt's row. Two statements (the runs' advisory
        locks, so a replica handed the other copy waits for this one; then the check), and none for a
        batch of claims and finishes only (they are attempt columns, found by their stream ids)."""
        first: dict[tuple[int, str, int], int] = {}
        out: set[int] = set()
        for i, (row, fold) in enumerate(zip(rows, folded, strict=True)):
            if not fold:
                if (row[0], row[1], row[4]) in first:
                    out.add(i)
                else:
                    first[(row[0], row[1], row[4])] = i
        if first:
            keys = list(first)
            await tx.fetchval("lock_transitions", sorted({k[0] for k in keys}))  # replicas one at a time per run
            for r in await tx.rows("recorded_transitions", [k[0] for k in keys], [k[1] for k in keys],
                                   [k[2] for k in keys]):
                out.add(first[(r.run_id, r.type, r.version)])
        return out

    async def _unrecorded(self, tx: Any, entries: list[Entry],
                          rows: Sequence[tuple[Any, ...]], folded: Sequence[bool],
                          repeated: set[int]) -> set[tuple[str, int]] | None:
        """A replayed batch (its entries may be committed already): write the event rows PostgreSQL does
        not have (`repeated`: transitions it holds already), and return the (stream, stream id) of every
        entry not recorded before (None: all of them). An attempt's claim or finish is recorded when its
        attempt row holds that entry's stream id."""
        written = await tx.rows("insert_events_json", _json.encode(
            [(*row[:11], int(f[b"ts"]), *row[12:])
             for i, (row, (_, _, f), fold) in enumerate(zip(rows, entries, folded, strict=True))
             if not fold and i not in repeated]).decode())
        return await self._add_folded(tx, entries, rows, folded, {(r.stream, r.stream_id) for r in written})

    async def _add_folded(self, tx: Any, entries: list[Entry],
                          rows: Sequence[tuple[Any, ...]], folded: Sequence[bool],
                          new: set[tuple[str, int]]) -> set[tuple[str, int]] | None:
        """`new` (the event rows written now) with the claims and finishes no attempt row holds yet."""
        runs = sorted({row[0] for row, fold in zip(rows, folded, strict=True) if fold})
        if runs:
            have: set[tuple[int, int | None, int]] = set()
            for r in await tx.rows("recorded_attempt_entries", runs):
                for sid in (r.claim_stream_id, r.finish_stream_id):
                    if sid is not None:
                        have.add((r.run_id, r.attempt, sid))
            for row, (stream, _, _), fold in zip(rows, entries, folded, strict=True):
                if fold and (row[0], row[5], row[13]) not in have:
                    new.add((stream, row[13]))
        return None if len(new) == len(entries) else new

    def _fold(self, entries: list[Entry], only: set[tuple[str, int]] | None, at_of: dict[bytes, datetime],
              rows: Sequence[tuple[Any, ...]], folded: Sequence[bool]
              ) -> tuple[list[list[Any]], list[list[Any]], list[list[Any]], list[list[Any]]]:
        """One projection row per run and one attempt row per (run, attempt) for the whole batch, and
        the dashboard's per-minute rollup of the fresh entries, in one pass (`_Fold` holds the rule of
        each table). `only`: the (stream, stream id) of the entries to fold (None: all); `at_of`:
        datetimes already made for the batch's ts values; `rows`: the entries' event rows (`_rows`);
        `folded`: which entries are columns of their attempt's row. Returns `_Fold.columns()`, and
        keeps the runs to expire (`_acknowledge`) and the compensations to submit (`_compensate`)."""
        fold = _Fold(at_of)
        project, claim, close, count, kinds = fold.project, fold.claim, fold.close, fold.count, stats.KINDS
        for row, (stream, _, f), in_row in zip(rows, entries, folded, strict=True):
            if only is not None and (stream, row[13]) not in only:
                continue
            typ = f[b"type"]
            p = project(row, f)
            if typ == b"claimed":
                claim(p, row, f)
            outcome = f.get(b"outcome") or (b"succeeded" if typ == b"succeeded" else None)
            if outcome and row[5] is not None:
                close(row, f, in_row, outcome)
            kind = kinds.get(typ)
            if kind is not None:
                count(row, f, kind)
        # From every entry, not only fresh ones: a replayed batch was committed by the pass that died
        # before acknowledging it, and its finished runs still need their hashes to expire.
        self._versions = {row[0]: (row[12], row[4], row[3]) for row in rows}
        self._compensations = fold.compensations
        return fold.columns()

    def _observe(self, entries: list[Entry], only: set[tuple[str, int]] | None,
                 rows: Sequence[tuple[Any, ...]]) -> None:
        """Metrics from the transitions just committed (once each: replays are skipped).
        Counts are summed per batch and labelled children cached: per-event labels() cost
        more than the rest of the recorder's Python work."""
        types: dict[str, int] = {}
        m = self._metrics
        for row, (stream, _, f) in zip(rows, entries, strict=True):
            if only is not None and (stream, row[13]) not in only:
                continue
            typ = row[1]
            types[typ] = types.get(typ, 0) + 1
            if typ == "claimed":
                queue = row[15]
                ts = int(f[b"ts"])
                due = f.get(b"due")
                if due:
                    m.observe(gauges.SCHEDULE_LAG, max(0, ts - int(due)) / 1000, queue)
                expired = self._expired_at.pop(row[0], None)
                if expired is not None:
                    m.observe(gauges.RECOVERY, max(0, ts - expired) / 1000, queue)
            elif typ == "lease_expired" and row[3] == "PENDING":
                if len(self._expired_at) > 100_000:
                    self._expired_at.clear()
                self._expired_at[row[0]] = int(f[b"ts"])
        for name, n in types.items():
            m.child(gauges.RECORDED, name).inc(n)
            action = gauges.CONTROL_TYPES.get(name)
            if action is not None:
                m.child(gauges.CONTROL, action).inc(n)
        m.flush()
        gauges.RECORDER_LAG.set(self.last_lag_s)

    async def _acknowledge(self, entries: list[Entry], runs: list[list[Any]]) -> None:
        by_stream: dict[str, list[bytes]] = {}
        for stream, entry_id, _ in entries:
            by_stream.setdefault(stream, []).append(entry_id)
        finished: dict[str, list[Versioned]] = {}
        for rid, (stream, version, status) in self._versions.items():
            if status in _TERMINAL:
                finished.setdefault(stream, []).append(Versioned(rid, version))
        ttl = TtlArgs(self.stores.settings.terminal_ttl_s * 1000)
        for stream, runs_done in finished.items():  # before the ack: a crash in between replays the batch
            queue = _queue_of(stream)
            await self.stores.scripts.expire_finished(self.stores.keys(queue), ttl, runs_done)
        await self.streams.acknowledge(by_stream)  # and trims what is recorded off each stream
