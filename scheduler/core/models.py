"""msgspec Structs at the boundaries: submit requests, run rows, run views, claimed runs, events."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import msgspec

__all__ = [
    "Claimed",
    "JobSpec",
    "Model",
    "Outcome",
    "RunRow",
    "Submit",
    "decode_payload",
    "decode_result",
    "encode_payload",
    "encode_result",
    "run_columns",
    "run_row",
]

Model = Literal["async", "thread", "process"]


class Submit(msgspec.Struct, kw_only=True, frozen=True):
    """One run to submit. Unset options fall back to the handler's declared defaults."""

    handler: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    queue: str | None = None
    priority: int | None = None
    run_at: datetime | None = None
    delay: float | None = None
    timeout: float | None = None
    max_retries: int | None = None
    idempotency_key: str | None = None
    trace: str | None = None
    """W3C traceparent of the producer, carried into the handler's context."""
    tenant: str | None = None
    """Who the run is for: a queue's tenants share dispatch by weight (fencepost queue weight)."""
    concurrency_key: str | None = None
    """Runs sharing a key are limited to `concurrency_limit` leased at once; by default the
    handler's declared key (`handler:<argument value>`) and limit."""
    concurrency_limit: int | None = None
    rate_key: str | None = None
    """Runs sharing a rate key start at most `rate_limit` times per interval (over all workers);
    by default the handler's declared key (`handler:<argument value>`) and rate."""
    rate_limit: str | None = None
    """'N/interval', e.g. '100/1s' or '5/250ms' (fencepost.core.rates.parse)."""


class JobSpec(msgspec.Struct, kw_only=True, frozen=True):
    """What a handler declares; stored in job_definitions so producers can validate."""

    name: str
    model: Model = "async"
    queue: str = "default"
    priority: int = 0
    timeout_s: float = 300.0
    max_retries: int = 3
    version: int = 1
    """Checkpoint schema version: resume refuses a checkpoint of another version unless
    the handler declares a migration."""
    resumable: bool = True
    owner: str | None = None
    stop_grace_s: float | None = None
    """Seconds a stop waits for the handler before escalating (None: the worker's default)."""
    side_effects: bool = False
    """Irreversible side effects: a run cancelled mid-way is flagged needs_compensation."""
    compensate: str | None = None
    """Handler enqueued with the cancelled run's id when it needs compensation."""
    migrates: bool = False
    """The handler can migrate older checkpoint schema versions to `version`."""
    service: str | None = None
    """The downstream dependency whose circuit breaker gates this handler's runs."""
    concurrency_key: str | None = None
    """Name of the argument whose value keys the concurrency limit (e.g. 'customer')."""
    concurrency_arg: int | None = None
    """Its position among the positional arguments (after ctx), for submits that pass it so."""
    concurrency_limit: int | None = None
    """At most this many runs per key value leased at once."""
    rate_key: str | None = None
    """Name of the argument whose value keys the rate limit (e.g. 'customer'); '' when the rate is
    the handler's own (every run shares the key `<handler>`)."""
    rate_arg: int | None = None
    """Its position among the positional arguments (after ctx)."""
    rate_limit: str | None = None
    """At most N starts per interval per key value, canonical 'N/ms' (fencepost.core.rates)."""
    params: list[dict[str, Any]] | None = None
    """The handler's parameters after ctx (fencepost.core.validate.describe_params), so a producer that
    does not import the handler (the API, `fencepost submit`) checks a call as binding it would."""

    def options(self) -> dict[str, object]:
        return {"stop_grace_s": self.stop_grace_s, "side_effects": self.side_effects,
                "compensate": self.compensate, "migrates": self.migrates, "service": self.service,
                "concurrency_key": self.concurrency_key, "concurrency_arg": self.concurrency_arg,
                "concurrency_limit": self.concurrency_limit, "rate_key": self.rate_key,
                "rate_arg": self.rate_arg, "rate_limit": self.rate_limit, "params": self.params}


class RunRow(msgspec.Struct, kw_only=True, frozen=True):
    """One run on its way into the stores: the submit path inserts it into PostgreSQL
    (`run_columns` -> insert_runs) and the hot-store gateway makes it claimable
    (`enqueue_runs`); the outbox relay, drift repair and commands re-enqueue rows read back
    from PostgreSQL (`run_row`). The first 19 fields are insert_runs' unnest columns, in order."""

    handler: str
    queue: str
    priority: int
    payload: bytes
    run_at: datetime
    max_retries: int
    timeout_s: float
    idempotency_key: str | None = None
    trace_id: str | None = None
    status: str = "PENDING"
    workflow_id: uuid.UUID | None = None
    schedule_id: int | None = None
    fire_time: datetime | None = None
    outbox: bool = False
    """Written inside a producer's transaction (or by the trigger): the outbox relay moves it to Redis."""
    tenant: str = ""
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_key: str | None = None
    rate_limit: str | None = None
    """The rate the run declares for its key, canonical 'N/ms' (fencepost.core.rates)."""
    # known once PostgreSQL holds the run
    id: int = 0
    attempt: int = 0
    version: int = 0
    gen: int = 0
    delay_ms: int | None = None
    """Redis only (not a column): due this long after the Redis server's clock now (a submit with a
    delay, 0 for one due at once), so a submitting host's skewed clock does not move it; None: due at
    `run_at`, a wall-clock instant (a user's run_at, or a row read back from PostgreSQL)."""


_ROW_FIELDS = RunRow.__struct_fields__
_ROW_NAMES = frozenset(_ROW_FIELDS)
_SQL_WIDTH = _ROW_FIELDS.index("rate_limit") + 1
_TENANT, _CKEY, _RKEY = _ROW_FIELDS.index("tenant"), _ROW_FIELDS.index("concurrency_key"), _ROW_FIELDS.index("rate_key")


def run_row(record: msgspec.Struct | Mapping[str, Any], **fields: Any) -> RunRow:
    """A RunRow from a PostgreSQL row, the gateway's row Struct or a mapping (drift_runs, outbox_runs,
    get_hot_run: columns it lacks take their defaults, columns RunRow lacks are ignored), with `fields`
    on top."""
    if isinstance(record, msgspec.Struct):
        data = {name: getattr(record, name) for name in record.__struct_fields__ if name in _ROW_NAMES}
    else:
        data = {name: record[name] for name in record.keys() if name in _ROW_NAMES}
    data.update(fields)
    if data.get("tenant") is None:
        data["tenant"] = ""
    return RunRow(**data)


def run_columns(rows: Sequence[RunRow]) -> list[list[Any]]:
    """insert_runs' 19 column arrays ($1-$19). With no rate key in the batch the last two are
    empty, and with no tenant or concurrency key either the last five (unnest pads them with
    NULLs, the column defaults): full arrays would cost PostgreSQL ~7 % of the insert."""
    if not rows:
        return [[] for _ in range(_SQL_WIDTH)]
    cols = [list(c) for c in zip(*map(msgspec.structs.astuple, rows))][:_SQL_WIDTH]
    if not any(cols[_RKEY]):
        cols[_RKEY:] = [[], []]
        if not any(cols[_TENANT]) and not any(cols[_CKEY]):
            cols[_TENANT:] = [[] for _ in range(_SQL_WIDTH - _TENANT)]
    return cols


class Claimed(msgspec.Struct, frozen=True):
    """A run a worker holds a lease on: claim_due's reply (queue filled in by the gateway)."""

    id: int
    token: int
    attempt: int
    handler: str
    payload: bytes
    timeout_ms: int
    max_retries: int
    queue: str
    fire_time: int | None
    trace: str | None
    gen: int = 0


class Outcome(msgspec.Struct, frozen=True):
    """What wait() returns: the state the run rests in, the handler's decoded return value, and
    why it ended there. `error` / `error_class` belong to the transition that ended the run (the
    final attempt's failure), never to an earlier attempt: a run that SUCCEEDED after a failed
    attempt has none."""

    run_id: int
    status: str
    result: Any = None
    error: str | None = None
    error_class: str | None = None
    reason: str | None = None
    """Why the run rests where it does: fatal, review, policy, quarantined, retries_exhausted,
    interrupted_too_often (interrupted by lease expiry or worker death more than max_interruptions times),
    timeout, paused_after_error, upstream_failed, ... or the operator's reason for a command
    (None when none was given, and for SUCCEEDED)."""


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()


def encode_payload(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    return _enc.encode((args, kwargs))


def decode_payload(raw: bytes) -> tuple[list[Any], dict[str, Any]]:
    args, kwargs = _dec.decode(raw)
    return args, kwargs


def encode_result(value: Any) -> bytes:
    return _enc.encode(value)


def decode_result(raw: bytes | None) -> Any:
    return None if raw is None or raw == b"" else _dec.decode(raw)
