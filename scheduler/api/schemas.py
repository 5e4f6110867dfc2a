"""msgspec Structs of the HTTP API: request and response bodies (the OpenAPI document is
generated from these, scheduler/api/openapi.py)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from fencepost.core.keys import QUEUE_NAME_PATTERN
from fencepost.core.rates import PATTERN as RATE_PATTERN
from fencepost.core.schedules import ScheduleSpec
from fencepost.core.states import Status as Status  # the one table's enum: the OpenAPI component `Status`
from fencepost.core.validate import meta
from fencepost.core.views import (
    Attempt,
    Checkpoint,
    Event,
    QueueStats,
    Run,
    RunProgress,
    RunSummary,
    TokenInfo,
    Workflow,
    WorkflowNode,
    WorkflowSummary,
)
from fencepost.core.views import Batch as Batch  # named in the OpenAPI document, as before
from fencepost.core.views import BatchCallback as BatchCallback
from fencepost.core.views import BulkResult as BulkResult  # the same OpenAPI names as when declared here
from fencepost.core.views import BulkSkip as BulkSkip
from fencepost.core.views import Schedule as Schedule
from fencepost.core.views import ScheduleRun as ScheduleRun
from fencepost.core.workers import HeldRun, StopRequest, WorkerInfo
from fencepost.schedules import ScheduleUpdate
from fencepost.workflows import Node

__all__ = [
    "Attempt",
    "AuditEntry",
    "BulkCount",
    "BulkRequest",
    "BulkResult",
    "BulkSkip",
    "Checkpoint",
    "CommandRequest",
    "CommandResult",
    "ConfigCommand",
    "Event",
    "Health",
    "HeldRun",
    "Me",
    "NextFires",
    "Node",
    "Problem",
    "QueueResult",
    "QueueStats",
    "Readiness",
    "ResolveRequest",
    "Role",
    "Run",
    "RunProgress",
    "RunSummary",
    "Schedule",
    "ScheduleCreate",
    "ScheduleEdit",
    "ScheduleRun",
    "ScheduleSpec",
    "Stats",
    "StatsPoint",
    "StopRequest",
    "SubmitBatch",
    "SubmitRequest",
    "Submitted",
    "SubmittedBatch",
    "Token",
    "TokenCreate",
    "TokenCreated",
    "Verb",
    "WorkerInfo",
    "WorkerStopped",
    "Workflow",
    "WorkflowNode",
    "WorkflowRetried",
    "WorkflowRetry",
    "WorkflowSubmit",
    "WorkflowSubmitted",
    "WorkflowSummary",
]

Role = Literal["producer", "operator", "admin"]
Verb = Literal["pause", "stop", "cancel", "resume", "restart", "retry"]
QueueName = Annotated[str, Meta(pattern=QUEUE_NAME_PATTERN, description="1-64 of letters, digits, '_', '-', '.'")]
Reason = Annotated[str, meta("reason", description="Recorded in the run's history with the token that acted")]


class SubmitRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One run to submit. Unset options fall back to the handler's declared defaults."""

    handler: Annotated[str, meta("handler")]
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    queue: QueueName | None = None
    priority: Annotated[int, meta("priority")] | None = None
    run_at: datetime | None = None
    """RFC 3339 with a timezone offset."""
    delay: Annotated[float, meta("delay")] | None = None
    timeout: Annotated[float, meta("timeout")] | None = None
    max_retries: Annotated[int, meta("max_retries")] | None = None
    idempotency_key: Annotated[str, meta("idempotency_key")] | None = None
    trace: Annotated[str, Meta(max_length=55)] | None = None
    """W3C traceparent of the producer."""
    tenant: Annotated[str, meta("tenant")] | None = None
    """Who the run is for: a queue's tenants share dispatch by weight."""
    concurrency_key: Annotated[str, meta("concurrency_key")] | None = None
    concurrency_limit: Annotated[int, meta("concurrency_limit")] | None = None
    rate_key: Annotated[str, meta("rate_key")] | None = None
    """Runs sharing a rate key start at most `rate_limit` times per interval (default: the handler's)."""
    rate_limit: Annotated[str, Meta(max_length=40, pattern=RATE_PATTERN,
                                    description="N starts per interval: 100/1s, 5/250ms (ms, s, m, h, d)")] | None = None


class SubmitBatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    runs: list[SubmitRequest]


class Submitted(msgspec.Struct, kw_only=True):
    """The run as stored: with an idempotency key already used for the same request in this
    scope, the run that request created (its queue, not the one asked for)."""

    id: int
    queue: str


class SubmittedBatch(msgspec.Struct, kw_only=True):
    ids: list[int]


# RunSummary, RunProgress, Run, Attempt, Event, Checkpoint: fencepost.core.views (Client returns them too)


class CommandRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    reason: Reason = ""
    expected_version: Annotated[int, Meta(ge=0, le=2**62)] | None = None
    """Act only if the run is still at this version (compare-and-set)."""


class CommandResult(msgspec.Struct, kw_only=True):
    id: int
    command: str
    state: str
    """PAUSED, PENDING, CANCELLED..., or REQUESTED / STOPPING while the worker lets go."""


class ResolveRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    as_: Literal["succeeded", "failed", "retry"] = msgspec.field(name="as")
    reason: Reason = ""
    expected_version: Annotated[int, Meta(ge=0, le=2**62)] | None = None


class QueueResult(msgspec.Struct, kw_only=True):
    queue: str
    paused: bool


class DispatchUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One change to a queue's dispatch settings; null resets that setting to its default."""

    setting: Literal["weight", "limit", "max_running", "aging", "rate"]
    reason: Reason = ""
    """Recorded in the audit log with the token that changed the setting."""
    tenant: Annotated[str, meta("tenant", min_length=0)] | None = None
    """weight: the tenant ('' = runs without a tenant)."""
    key: Annotated[str, meta("concurrency_key")] | None = None
    """limit: the concurrency key; rate: the rate key (none: the whole queue's rate)."""
    value: Annotated[float, Meta(gt=0, le=1e9)] | None = None
    """weight (0.001-1000), limit or max_running (integer >= 1), aging (seconds per priority level)."""
    rate: Annotated[str, Meta(max_length=40, pattern=RATE_PATTERN,
                              description="N starts per interval: 100/1s, 5/250ms (ms, s, m, h, d)")] | None = None
    """rate: at most N starts per interval over all workers (null: no queue rate / the runs' declared one)."""


class TenantDue(msgspec.Struct, kw_only=True):
    tenant: str
    weight: float
    due: int
    virtual_time: float


class KeyUse(msgspec.Struct, kw_only=True):
    key: str
    limit: int
    leased: int
    held: int


class RateUse(msgspec.Struct, kw_only=True):
    key: str
    """The rate key ('' = the whole queue)."""
    rate: str | None
    """N/interval, e.g. 100/1s (null: unknown, the held runs carry none)."""
    limit: int | None
    window_ms: int | None
    used: int
    """Starts in the window now (the Redis server's clock, as the claim script counts them)."""
    held: int
    """Due runs held until the key's window frees."""
    override: bool
    """Set by an operator (else declared by the runs)."""


class DispatchSettings(msgspec.Struct, kw_only=True):
    queue: str
    weights: dict[str, float]
    limits: dict[str, int]
    max_running: int | None
    priority_age_ms: int | None
    leased: int
    tenants: list[TenantDue]
    keys: list[KeyUse]
    rate: str | None = None
    """The queue-wide rate limit (N/interval), null: none."""
    rates: dict[str, str] = {}
    """Rate key -> the operator's rate."""
    rate_use: list[RateUse] = []


# QueueStats: fencepost.core.views


class BulkRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A bulk count (no `handle`: 428 with the handle of the counted set) or its confirm (`handle`
    and `confirm` equal to the count's `acting`)."""

    command: Verb
    confirm: Annotated[int, Meta(ge=0, le=2**31)] = 0
    """With a handle: must equal the number of runs the handle holds (the count's `acting`)."""
    handle: Annotated[str, Meta(pattern="^[0-9a-f]{32}$", description="from the count's 428")] | None = None
    status: Status | None = None
    handler: Annotated[str, meta("handler")] | None = None
    reason: Reason = ""
    limit: Annotated[int, Meta(ge=1, le=2**31)] | None = None
    """Count at most this many (the lowest ids that match): chunks below the server's cap."""
    until_id: Annotated[int, Meta(ge=1, le=2**63 - 1)] | None = None
    """Count only runs with ids up to this one."""
    count: bool = False
    """Only count, answered 200 with a BulkCount (the same fields as the 428), for callers (a browser)
    that treat a 4xx as an error; ignored with a handle."""


class BulkCount(msgspec.Struct, kw_only=True):
    """A bulk count: what a confirm with `handle` and `confirm` = `acting` acts on."""

    matched: int
    acting: int
    handle: str
    sample: list[int]
    expires_in_s: float
    limit: int
    until_id: int | None = None


# BulkSkip, BulkResult: fencepost.core.views (what Client.bulk_confirm returns too)


# Schedule, ScheduleRun: fencepost.core.views (what Client.schedule / schedule_runs return too)


class NextFires(msgspec.Struct, kw_only=True):
    name: str
    fires: list[datetime]
    timezone: str | None = None
    """The schedule's timezone (cron lines are read in it)."""


class WorkflowSubmit(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    nodes: Annotated[list[Node], Meta(min_length=1)]
    name: Annotated[str, meta("name", min_length=0)] | None = None


class WorkflowSubmitted(msgspec.Struct, kw_only=True):
    id: uuid.UUID


# WorkflowNode, Workflow, WorkflowSummary: fencepost.core.views


class WorkflowRetry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    recompute: list[Annotated[str, Meta(max_length=200)]] = []
    reason: Reason = ""


class WorkflowRetried(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    done: dict[str, list[str]]


class BatchCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Runs submitted as one batch, with the callbacks that run once when all of them are terminal."""

    runs: Annotated[list[SubmitRequest], Meta(min_length=1)]
    """The members (no idempotency keys: a member belongs to one batch)."""
    on_complete: SubmitRequest | None = None
    """Runs once when every member is terminal (SUCCEEDED, FAILED, TIMED_OUT or CANCELLED)."""
    on_success: SubmitRequest | None = None
    """Runs once when every member SUCCEEDED; CANCELLED (reason batch_failed) otherwise."""
    name: Annotated[str, meta("name", min_length=0)] | None = None


class BatchCreated(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    run_ids: list[int]
    """The members, in request order."""
    on_complete: int | None = None
    on_success: int | None = None


# BatchCallback, Batch: fencepost.core.views


class TokenCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    role: Role
    queues: list[QueueName] = []
    """Empty: every queue (a scoped admin's tokens get its own queues, and no more)."""
    name: Annotated[str, meta("name")] | None = None
    expires_in: Annotated[float, Meta(ge=60, le=10 * 365 * 86400)] | None = None
    """Seconds until the token stops working (null: never)."""


class Token(TokenInfo, kw_only=True):
    """An API token (fields: fencepost.core.views.TokenInfo, which `fencepost token ls` reads too)."""


class TokenCreated(Token, kw_only=True):
    secret: str
    """Shown once: only its sha256 is stored."""


class Me(msgspec.Struct, kw_only=True):
    id: int
    role: str
    queues: list[str]
    name: str | None = None
    actor: str


class Problem(msgspec.Struct, kw_only=True, omit_defaults=True):
    """RFC 9457 problem details; the typed error's fields are added as extension members
    (run_id, current, requested, field, reason, offer, matched, limit, ...)."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    error: str | None = None


class Health(msgspec.Struct, kw_only=True):
    status: str


class Readiness(msgspec.Struct, kw_only=True):
    status: str
    redis: str
    postgres: str


class ScheduleCreate(ScheduleSpec, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A schedule to add, with the reason the audit log records."""

    reason: Reason = ""


class ScheduleEdit(ScheduleUpdate, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The fields of a schedule to change (the others keep their values), with the audit reason."""

    reason: Reason = ""


class ConfigCommand(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The optional body of a queue, schedule or worker command: the reason the audit log records."""

    reason: Reason = ""


class AuditEntry(msgspec.Struct, kw_only=True):
    """Who did what: a configuration change (source 'config') or a command on a run (source
    'run', action = the event type, target = the run id)."""

    source: Literal["config", "run"]
    id: int
    at: datetime
    actor: str
    action: str
    address: str | None = None
    queue: str | None = None
    target: str | None = None
    reason: str | None = None
    data: Any = None


class WorkerStopped(msgspec.Struct, kw_only=True):
    """A stop request recorded (audit log) and handed to the worker, which drains at its next heartbeat."""

    id: str
    stop_requested: StopRequest


class StatsPoint(msgspec.Struct, kw_only=True):
    """One step of a chart: transitions counted in it and percentiles (ms) of start lag and run time."""

    t: datetime
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    lag_p50_ms: float | None = None
    lag_p95_ms: float | None = None
    run_p50_ms: float | None = None
    run_p95_ms: float | None = None


class Stats(msgspec.Struct, kw_only=True):
    """A queue's (or, queue null, the caller's fleet's) activity over a window, from the per-minute rollup."""

    queue: str | None
    window: Literal["1h", "24h", "7d"]
    step_s: int
    points: list[StatsPoint]
