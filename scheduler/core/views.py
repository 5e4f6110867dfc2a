"""Typed reads: what a user, the CLI and the API see of runs, attempts, events, checkpoints and
queues, declared once (the HTTP API's schemas are these Structs), and the rules every reader shares:

- `overlay(record, peek)`: the one rule for a run's live state. PostgreSQL's record is the
  system of record but trails Redis by the recorder's lag; Redis's hash (`Scripts.peek`) wins
  when its version is newer than the recorded one, and then also gives the attempt, token,
  worker and, once the run rests, its outcome.
- `recorder_silence(stores)`: whether a transition has waited in Redis longer than the lag
  alert's threshold for a recorder to take it (no `fencepost reconciler` running, or stuck).
- `queue_stats(stores, window_s)`: every queue's depth counted in the live store (Redis), with
  its throughput from the record.
- `Operator`: the protocol both `fencepost.Client` (the stores) and `fencepost.apiclient.AsyncApiClient`
  (the HTTP API) implement, so a CLI command is written once against it.

Every view is also readable by field name (`run["status"]`, `run.get("reason")`, `dict(run)`),
as the dicts these methods returned before were: existing callers keep working while new code
uses the attributes."""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import msgspec
from redis.exceptions import ResponseError

from fencepost.core.errors import InvalidInput
from fencepost.core.fairness import due_summary
from fencepost.core.hot import RunPeek
from fencepost.core.models import Outcome, Submit, decode_payload, decode_result
from fencepost.core.schedules import ScheduleSpec
from fencepost.core.states import RESTING, Status
from fencepost.core.workers import WorkerInfo

if TYPE_CHECKING:
    from fencepost.core.stores import Stores

__all__ = [
    "Attempt",
    "Batch",
    "BatchCallback",
    "BatchMember",
    "BatchRecord",
    "BulkCount",
    "BulkResult",
    "BulkSkip",
    "Checkpoint",
    "Event",
    "Operator",
    "QueueStats",
    "RecorderSilence",
    "Reply",
    "Run",
    "RunProgress",
    "RunRecord",
    "RunSummary",
    "Schedule",
    "ScheduleRun",
    "View",
    "Workflow",
    "WorkflowNode",
    "WorkflowSummary",
    "live_nodes",
    "live_runs",
    "live_summaries",
    "overlay",
    "queue_stats",
    "recorder_silence",
    "run_view",
    "status_filter",
    "view",
]

V = TypeVar("V", bound="View")
RECORDER_GROUP = "recorder"
"""The consumer group the recorder reads each queue's event stream with (reconciler/recorder.py GROUP)."""


class View(msgspec.Struct, kw_only=True):
    """Base of every typed read: a Struct whose fields can also be read by name, like the dict it replaces."""

    def __getitem__(self, name: str) -> Any:
        if name not in self.__struct_fields__:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default) if name in self.__struct_fields__ else default

    def keys(self) -> tuple[str, ...]:
        return self.__struct_fields__

    def __contains__(self, name: object) -> bool:
        return name in self.__struct_fields__

    def __iter__(self) -> Iterator[str]:
        return iter(self.__struct_fields__)


def view(cls: type[V], row: Any) -> V:
    """A record row as the view CLS: a row Struct of the gateway (`Database.rows` / `row`, read by
    attribute), or a dict; columns the view does not name are left out."""
    if isinstance(row, msgspec.Struct):
        return msgspec.convert(row, cls, from_attributes=True, strict=False)
    return msgspec.convert(dict(row), cls, from_attributes=False, strict=False)


class RunSummary(View, kw_only=True):
    id: int
    handler: str
    queue: str
    status: str
    attempt: int
    priority: int = 0
    version: int | None = None
    run_at: datetime | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_error_class: str | None = None
    last_error: str | None = None
    reason: str | None = None
    workflow_id: uuid.UUID | None = None
    schedule_id: int | None = None


class RunProgress(View, kw_only=True):
    """The latest `ctx.progress()` of the run (advisory, written about once a second by its worker)."""

    done: float
    total: float | None = None
    message: str | None = None
    attempt: int
    updated_at: datetime


class Run(RunSummary, kw_only=True):
    """A run as PostgreSQL records it, with the live state Redis holds when it is newer."""

    max_retries: int = 0
    timeout_s: float = 0.0
    token: int | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    idempotency_key: str | None = None
    trace_id: str | None = None
    fire_time: datetime | None = None
    result: Any = None
    pause_requested: bool = False
    stop_requested: bool = False
    cancel_requested: bool = False
    forced: bool = False
    needs_compensation: bool = False
    tenant: str = ""
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    recorded_status: str | None = None
    """The state PostgreSQL has recorded (status is the live one; they differ for the recorder's lag)."""
    args: list[Any] | None = None
    """The arguments as submitted (absent when over the page's cap: see arguments_preview)."""
    kwargs: dict[str, Any] | None = None
    arguments_bytes: int | None = None
    arguments_truncated: bool = False
    arguments_preview: str | None = None
    progress: RunProgress | None = None


class RunRecord(RunSummary, kw_only=True):
    """A run's row as PostgreSQL stores it (`Client.get`): payload and result still encoded
    (fencepost.core.models.decode_payload / decode_result), the latest progress report attached."""

    payload: bytes | None = None
    result: bytes | None = None
    max_retries: int = 0
    timeout_s: float = 0.0
    idempotency_key: str | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    token: int | None = None
    gen: int = 0
    updated_at: datetime | None = None
    fire_time: datetime | None = None
    trace_id: str | None = None
    pause_requested: bool = False
    stop_requested: bool = False
    cancel_requested: bool = False
    forced: bool = False
    needs_compensation: bool = False
    outbox: bool = False
    tenant: str = ""
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_key: str | None = None
    rate_limit: str | None = None
    progress: RunProgress | None = None


class Attempt(View, kw_only=True):
    attempt: int
    token: int
    worker_id: str
    started_at: datetime
    finished_at: datetime | None = None
    outcome: str | None = None
    error_class: str | None = None
    error_message: str | None = None


class Event(View, kw_only=True):
    id: int
    type: str
    at: datetime
    run_id: int | None = None
    queue: str | None = None
    from_status: str | None = None
    to_status: str | None = None
    version: int | None = None
    attempt: int | None = None
    token: int | None = None
    worker_id: str | None = None
    actor: str | None = None
    reason: str | None = None
    error_class: str | None = None
    error_message: str | None = None
    trace_id: str | None = None
    handler: str | None = None
    recorded_at: datetime | None = None
    stream_id: int | None = None
    """The stream entry it was recorded from (null: written by PostgreSQL); orders ties on `at` (cursors)."""


class Checkpoint(View, kw_only=True):
    run_id: int
    gen: int
    attempt: int
    version: int
    schema_version: int
    processed: int | None = None
    updated_at: datetime | None = None
    state: Any = None


class QueueStats(View, kw_only=True):
    """A queue now: its depth in the live store (Redis) and its recent throughput from the record."""

    queue: str
    paused: bool
    due: int
    delayed: int
    active: int
    oldest_due_age_s: float
    finished_last_window: int
    throughput_per_min: float
    schedule_lag_s: float | None
    window_s: int


class WorkflowNode(View, kw_only=True):
    name: str
    id: int
    status: str
    handler: str
    queue: str
    attempt: int
    depends_on: list[str]
    reason: str | None = None
    version: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_error_class: str | None = None


class Workflow(View, kw_only=True):
    id: uuid.UUID
    name: str | None
    created_at: datetime
    nodes: list[WorkflowNode]


class WorkflowSummary(View, kw_only=True):
    id: uuid.UUID
    name: str | None
    created_at: datetime
    nodes: int


class BatchCallback(View, kw_only=True):
    id: int
    status: str
    """BLOCKED until the batch settles; CANCELLED (reason batch_failed) for an on_success whose batch failed."""
    reason: str | None = None


class Batch(View, kw_only=True):
    id: uuid.UUID
    name: str | None
    created_at: datetime
    settled_at: datetime | None
    """When the last member became terminal (null: members still running)."""
    total: int
    counts: dict[str, int]
    """Members by state (PostgreSQL's record; PURGED: the run left the record, e.g. a dropped archive partition)."""
    on_complete: BatchCallback | None = None
    on_success: BatchCallback | None = None


Reply = enum.StrEnum("Reply", [*((s.name, s.value) for s in Status), ("REQUESTED", "REQUESTED")])  # type: ignore[misc]
Reply.__doc__ = """What an operator command answers: the state the run is in now (every Status, taken from
states.py), or REQUESTED (a pause of a RUNNING run, taken at its next safe boundary). Equal to its text
(`reply == "PAUSED"`)."""


class AuditEntry(View, kw_only=True):
    """Who did what: a configuration change (source 'config') or a command on a run (source 'run',
    action = the event type, target = the run id)."""

    source: str
    id: int
    at: datetime
    actor: str
    action: str
    address: str | None = None
    queue: str | None = None
    target: str | None = None
    reason: str | None = None
    data: Any = None
    """The change's details (decoded JSON)."""


class TokenInfo(View, kw_only=True):
    """An API token as `token ls` shows it (never its secret: only its sha256 is stored)."""

    id: int
    role: str
    queues: list[str]
    name: str | None = None
    created_by: str | None = None
    created_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None
    expires_at: datetime | None = None
    parent_id: int | None = None
    """The token that made this one through the API (revoking or expiring it ends this one too)."""


class BulkCount(View, kw_only=True):
    """What a bulk command would act on, counted and nothing changed: `Operator.bulk_confirm` acts on
    exactly this set (the runs at most `until_id` through the stores, the counted `handle` over HTTP)."""

    command: str
    queue: str
    status: str | None = None
    handler: str | None = None
    matched: int
    limit: int
    acting: int
    """How many the confirm acts on (at most `limit` of those matched)."""
    until_id: int | None = None
    handle: str | None = None


class BulkSkip(View, kw_only=True):
    id: int
    reason: str


class BulkResult(View, kw_only=True):
    matched: int
    """How many runs matched the filter when counted."""
    acted: int
    """How many runs the command changed (len(changed))."""
    changed: list[int] = []
    """The counted runs the command was applied to."""
    skipped: list[BulkSkip] = []
    """The counted runs left alone: they moved (state or version) since the count, or refused."""
    results: dict[str, int] = {}
    """The states the changed runs were left in, counted."""
    refused: dict[str, str] = {}
    """`skipped` as {id: reason} (what older clients read)."""
    handle: str | None = None
    until_id: int | None = None


class Schedule(View, kw_only=True):
    id: int
    name: str
    handler: str
    timezone: str
    next_fire_time: datetime
    cron: str | None = None
    interval_s: float | None = None
    queue: str | None = None
    priority: int | None = None
    spread_s: float = 0.0
    offset_ms: int = 0
    catchup: bool = False
    allow_overlap: bool = False
    paused: bool = False
    last_fire_time: datetime | None = None
    last_run_id: int | None = None
    last_status: str | None = None
    fires: int = 0
    skipped: int = 0
    args_json: Any = None
    """The arguments as given: {"args": [...], "kwargs": {...}} (one schedule only, not in listings)."""
    catchup_window_s: float | None = None
    created_at: datetime | None = None
    quarantined: str | None = None
    """Why the trigger paused it: it could not fire (null: not quarantined); an update that checks lifts it."""

    def decoded(self) -> Schedule:
        """This schedule with `args_json` as the object (PostgreSQL's jsonb arrives as its text)."""
        if not isinstance(self.args_json, str):
            return self
        return msgspec.structs.replace(self, args_json=msgspec.json.decode(self.args_json))


class ScheduleRun(View, kw_only=True):
    """A run a schedule fired."""

    id: int
    status: str
    attempt: int
    fire_time: datetime | None = None
    run_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    queue: str | None = None
    """The queue it was submitted to."""


class BatchMember(View, kw_only=True):
    run_id: int
    status: str | None
    """As recorded (the hot row, else the archived one); null: the run left the record."""


class BatchRecord(View, kw_only=True):
    """A batch as PostgreSQL records it (`Client.batch`): its callbacks' run ids and every member's state
    (`Client.batch_view` counts them)."""

    id: uuid.UUID
    name: str | None
    created_at: datetime
    settled_at: datetime | None
    on_complete: int | None = None
    on_success: int | None = None
    members: list[BatchMember]


class RecorderSilence(View, kw_only=True):
    """A transition has waited in Redis for a recorder longer than the lag alert allows."""

    queue: str
    waiting_s: float
    """Age of the oldest transition of QUEUE no recorder has committed (on the Redis server's clock)."""
    threshold_s: int
    recorder_seen: bool
    """A recorder has read this queue's stream before (False: none ever has)."""

    @property
    def message(self) -> str:
        """One line for an operator."""
        who = "no recorder has recorded" if self.recorder_seen else "no recorder has ever read"
        return (f"warning: {who} queue {self.queue}'s transitions for {self.waiting_s:.0f} s (over "
                f"{self.threshold_s} s): PostgreSQL's history and the dead-letter / review views are behind "
                "Redis; is `fencepost reconciler` running?")


# -- the one overlay rule ------------------------------------------------------------------------
def overlay(record: Run, peek: RunPeek | None) -> Run:
    """RECORD with the live state PEEK (its Redis hash) holds, when PEEK's version is newer than
    the recorded one: status, version, attempt, token and worker, and once it rests its result and
    error. `recorded_status` keeps what PostgreSQL says. A PEEK of None (the hash expired after the
    recorder committed the run, or Redis lost it) leaves the record as it is."""
    out = msgspec.structs.replace(record, recorded_status=record.status)
    if peek is None or peek.version is None or (record.version is not None and peek.version <= record.version):
        return out
    out.status, out.version = peek.state, peek.version
    if peek.attempt is not None:
        out.attempt = peek.attempt
    if peek.token:
        out.token = peek.token
    if peek.worker:
        out.lease_owner = peek.worker
    if peek.state in _RESTING:  # its outcome too, as Client.wait reads it
        if peek.result is not None:
            out.result = decode_result(peek.result)
        if peek.error:
            out.last_error = peek.error
        if peek.error_class:
            out.last_error_class = peek.error_class
    return out


_RESTING = frozenset(s.value for s in RESTING)


def run_view(record: RunRecord) -> Run:
    """The record as a Run: result and arguments decoded."""
    fields = {f: getattr(record, f) for f in record.__struct_fields__ if f not in ("payload", "result") and
              f in Run.__struct_fields__}
    run = Run(**fields, result=decode_result(record.result) if record.result is not None else None)
    if record.payload is not None:
        args, kwargs = decode_payload(record.payload)
        run.args, run.kwargs = list(args), dict(kwargs)
    return run


async def live_runs(stores: Stores, runs: Sequence[Run]) -> list[Run]:
    """RUNS overlaid with their hot state, one pipeline per queue."""
    by_queue: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        by_queue.setdefault(r.queue, []).append(i)
    out = list(runs)
    for queue, idx in by_queue.items():
        peeks = await stores.scripts.peek(stores.keys(queue), [runs[i].id for i in idx])
        for i, p in zip(idx, peeks, strict=True):
            out[i] = overlay(runs[i], p)
    return out


async def live_summaries(stores: Stores, rows: Sequence[RunSummary]) -> list[RunSummary]:
    """Summaries overlaid with their hot state (status, version, attempt, the outcome's error)."""
    runs = await live_runs(stores, [Run(**msgspec.structs.asdict(r)) for r in rows])
    keep = RunSummary.__struct_fields__
    return [RunSummary(**{f: getattr(r, f) for f in keep}) for r in runs]


async def live_nodes(stores: Stores, nodes: Sequence[WorkflowNode]) -> list[WorkflowNode]:
    """Workflow nodes with their runs' live state (status, version, attempt) by the same overlay rule."""
    runs = await live_runs(stores, [Run(id=n.id, handler=n.handler, queue=n.queue, status=n.status,
                                        attempt=n.attempt, version=n.version, reason=n.reason) for n in nodes])
    return [msgspec.structs.replace(n, status=r.status, version=r.version, attempt=r.attempt)
            for n, r in zip(nodes, runs, strict=True)]


# -- the recorder's silence ------------------------------------------------------------------------
_ENDING_PAGE, _ENDING_SCAN = 500, 10_000
"""ending_event looks for a run's ending event this far back in its queue's stream, a page at a time."""


async def ending_event(stores: Stores, queue: str, run_id: int, status: str, version: bytes | None
                       ) -> dict[bytes, bytes] | None:
    """The stream entry of the transition that put the run in STATUS at VERSION while it is still in its
    queue's stream, newest first, at most `_ENDING_SCAN` entries back; None once the recorder took it
    (Client.wait reads the outcome from it: its error is that transition's own)."""
    events = stores.keys(queue).events
    rid, to = str(run_id).encode(), status.encode()
    top = "+"
    for _ in range(_ENDING_SCAN // _ENDING_PAGE):
        entries = cast("list[tuple[bytes, dict[bytes, bytes]]]",  # bytes: decode_responses=False
                       await stores.redis.xrevrange(events, max=top, min="-", count=_ENDING_PAGE))
        for _, f in entries:
            if f.get(b"run") == rid and f.get(b"to") == to and (version is None or f.get(b"v") == version):
                return f
        if len(entries) < _ENDING_PAGE:
            return None
        top = "(" + entries[-1][0].decode()
    return None


def _ms(entry_id: bytes | str | None) -> int:
    """The Redis server's milliseconds an entry id ('ms-seq') was written at."""
    raw = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return int(raw.split("-", 1)[0])


async def recorder_silence(stores: Stores, *, threshold_s: int | None = None) -> RecorderSilence | None:
    """The queue whose oldest transition not yet committed by a recorder (pending in the recorder
    group, or not delivered to it) is older than THRESHOLD_S (default: Settings.recorder_silence_s,
    the FencepostRecorderLagHigh alert's 60 s), on the Redis server's clock; None when every
    queue's transitions are recorded within it."""
    threshold = stores.settings.recorder_silence_s if threshold_s is None else threshold_s
    r = stores.redis
    queues = sorted(q.decode() for q in cast("set[bytes]", await r.smembers(stores.queues_key)))
    sec, usec = await r.time()
    now_ms = int(sec) * 1000 + int(usec) // 1000
    worst: RecorderSilence | None = None
    for queue in queues:
        stream = stores.keys(queue).events
        try:
            groups: list[dict[str, Any]] = await r.xinfo_groups(stream)
        except ResponseError:  # no stream yet: nothing was ever written for this queue
            continue
        group = next((g for g in groups if g.get("name") in (RECORDER_GROUP, RECORDER_GROUP.encode())), None)
        oldest: list[int] = []
        if group is None:
            first = await r.xrange(stream, "-", "+", count=1)
            if first:
                oldest.append(_ms(first[0][0]))
        else:
            pending = await r.xpending(stream, RECORDER_GROUP)
            if pending and pending.get("pending") and pending.get("min"):
                oldest.append(_ms(pending["min"]))
            last = group.get("last-delivered-id")
            start = "-" if last in (None, b"0-0", "0-0") else f"({last.decode() if isinstance(last, bytes) else last}"
            after = await r.xrange(stream, start, "+", count=1)
            if after:
                oldest.append(_ms(after[0][0]))
        if not oldest:
            continue
        waiting_s = max(0.0, (now_ms - min(oldest)) / 1000)
        if waiting_s > threshold and (worst is None or waiting_s > worst.waiting_s):
            worst = RecorderSilence(queue=queue, waiting_s=waiting_s, threshold_s=threshold,
                                    recorder_seen=group is not None)
    return worst


# -- queues, counted in the live store ---------------------------------------------------------------
async def queue_stats(stores: Stores, *, window_s: int = 300, scope: list[str] | None = None) -> list[QueueStats]:
    """Every queue (of SCOPE, when given): due, delayed and active runs as Redis holds them now,
    the age of the oldest due run, and finished runs and schedule lag over the last WINDOW_S
    seconds from the record."""
    from_record = await stores.db.rows("api_queue_figures", float(window_s), scope)
    r = stores.redis
    now = time.time()
    out = []
    for row in from_record:
        k = stores.keys(row.queue)
        due, age = await due_summary(stores, row.queue, now=now)
        pipe = r.pipeline(transaction=False)
        pipe.zcard(k.delayed)
        pipe.zcard(k.active)
        delayed, active = await pipe.execute()
        out.append(QueueStats(queue=row.queue, paused=row.paused, due=due, delayed=delayed, active=active,
                              oldest_due_age_s=round(age, 3), finished_last_window=row.finished,
                              throughput_per_min=round(row.finished * 60 / window_s, 3),
                              schedule_lag_s=None if row.lag_s is None else round(float(row.lag_s), 3),
                              window_s=window_s))
    return out


# -- the operator protocol -------------------------------------------------------------------------
class Operator(Protocol):
    """What an operator's tool needs, from the stores (`fencepost.Client`) or over HTTP
    (`fencepost.apiclient.AsyncApiClient`): each CLI command is written once against it."""

    async def submit_many(self, requests: Sequence[Submit]) -> list[int]: ...

    async def wait(self, run_id: int, timeout: float | None = None) -> Outcome: ...

    async def run(self, run_id: int) -> Run: ...

    async def attempts(self, run_id: int) -> list[Attempt]: ...

    async def checkpoint(self, run_id: int) -> Checkpoint | None: ...

    async def events(self, run_id: int, *, limit: int | None = None, cursor: str | None = None) -> list[Event]:
        """All of the run's timeline, or LIMIT events after CURSOR (fencepost.core.cursors, `run_events`)."""

    async def fleet_events(self, since: datetime, type_: str | None, queue: str | None, limit: int, *,
                           cursor: str | None = None) -> list[Event]:
        """Newest first, after CURSOR (`events`: the key of the previous page's last event) when given."""

    async def list_runs(self, *, queue: str | None = None, status: str | None = None, handler: str | None = None,
                        limit: int = 50, cursor: str | None = None) -> list[RunSummary]:
        """Newest first, after CURSOR (`runs/id/desc`) when given."""

    async def dead_letter(self, *, queue: str | None = None, limit: int = 50) -> list[RunSummary]: ...

    async def queues(self, *, window_s: int = 300) -> list[QueueStats]: ...

    async def known_queue(self, queue: str) -> None:
        """UnknownQueue unless QUEUE exists."""

    async def command(self, verb: str, run_id: int, *, reason: str = "",
                      expected_version: int | None = None) -> Reply: ...

    async def pause_queue(self, queue: str, *, reason: str = "") -> None: ...

    async def resume_queue(self, queue: str, *, reason: str = "") -> None: ...

    async def recorder_silence(self) -> RecorderSilence | None: ...

    async def workflows(self, *, limit: int = 50) -> list[WorkflowSummary]: ...

    async def workflow_id(self, prefix: str) -> str:
        """The full id of the one workflow whose id starts with PREFIX (at least 4 hex digits)."""

    async def workflow(self, workflow_id: str) -> Workflow: ...

    async def retry_workflow(self, workflow_id: str, *, recompute: Sequence[str] = (),
                             reason: str = "") -> dict[str, list[str]]: ...

    async def batch_view(self, batch_id: str) -> Batch: ...

    async def workers(self, *, queue: str | None = None) -> list[WorkerInfo]:
        """Live workers (of QUEUE when given): identity, queues, concurrency, the runs each holds."""

    async def stop_worker(self, worker_id: str, *, reason: str = "") -> None:
        """Ask WORKER_ID to stop claiming, drain within its grace period and exit (audited)."""

    # schedules
    async def add_schedule(self, spec: ScheduleSpec) -> Schedule: ...

    async def update_schedule(self, name: str, fields: dict[str, Any], *, reason: str = "") -> Schedule: ...

    async def run_schedule_now(self, name: str, *, reason: str = "") -> int: ...

    async def schedules(self, *, limit: int = 100) -> list[Schedule]: ...

    async def schedule(self, name: str) -> Schedule: ...

    async def schedule_fires(self, name: str, n: int) -> tuple[list[datetime], str]:
        """The schedule's next N fire times and its timezone."""

    async def schedule_runs(self, name: str, limit: int = 10) -> list[ScheduleRun]: ...

    async def set_schedule_paused(self, name: str, paused: bool) -> None: ...

    async def remove_schedule(self, name: str) -> None: ...

    # the review queue, bulk commands, the audit log and tokens
    async def review_queue(self, *, queue: str | None = None, limit: int = 50) -> list[RunSummary]: ...

    async def resolve(self, run_id: int, *, as_: str, reason: str = "") -> Reply:
        """Close a review-queue run as 'succeeded' or 'failed', or 'retry' it."""

    async def bulk_count(self, command: str, *, queue: str, status: str | None = None, handler: str | None = None,
                         limit: int = 100) -> BulkCount:
        """Count what a bulk command would act on; nothing changes."""

    async def bulk_confirm(self, count: BulkCount, *, reason: str = "") -> BulkResult:
        """Act on exactly the runs COUNT counted: matched, acted (changed), results (by state), skipped and
        refused (the runs left alone, with why)."""

    async def audit(self, *, actor: str | None = None, queue: str | None = None, since: datetime | None = None,
                    until: datetime | None = None, limit: int = 100, cursor: str | None = None) -> list[AuditEntry]:
        """Who did what, newest first; after CURSOR (fencepost.core.cursors, `audit`) when given."""

    async def tokens(self) -> list[TokenInfo]: ...

    async def create_token(self, role: str, queues: Sequence[str] = (), *, name: str | None = None,
                           expires_in: float | None = None) -> tuple[TokenInfo, str]:
        """A new token and its secret (shown only now)."""

    async def revoke_token(self, token_id: int, *, reason: str = "") -> None: ...


def status_filter(status: str | None) -> str | None:
    """A --status / ?status= filter, upper-cased and checked against the state table."""
    if status is None:
        return None
    s = status.upper()
    if s not in Status.__members__:
        raise InvalidInput(f"unknown status {s!r}; one of {', '.join(Status)}", field="status")
    return s
