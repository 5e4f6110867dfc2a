"""msgspec Structs at the boundaries: submit requests, run views, claimed runs, events."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec

__all__ = ["Submit", "JobSpec", "Claimed", "Outcome", "encode_payload", "decode_payload",
           "encode_result", "decode_result", "Model"]

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

    def options(self) -> dict[str, object]:
        return {"stop_grace_s": self.stop_grace_s, "side_effects": self.side_effects,
                "compensate": self.compensate, "migrates": self.migrates, "service": self.service,
                "concurrency_key": self.concurrency_key, "concurrency_arg": self.concurrency_arg,
                "concurrency_limit": self.concurrency_limit}


class Claimed(msgspec.Struct, frozen=True):
    """A run a worker holds a lease on."""

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
    """What wait() returns: the final state and the handler's decoded return value."""

    run_id: int
    status: str
    result: Any = None
    error: str | None = None
    error_class: str | None = None


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
