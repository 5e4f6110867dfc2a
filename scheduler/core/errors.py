"""Typed errors. Every failure a caller can act on has a class and fields, never a string to match."""

from __future__ import annotations

__all__ = [
    "BulkNotConfirmed",
    "ConcurrentModification",
    "DatabaseUnavailable",
    "FencepostError",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidInput",
    "NotStamped",
    "PayloadTooLarge",
    "RedisUnavailable",
    "ResumeRefused",
    "StaleToken",
    "StoreUnavailable",
    "SubmitInDoubt",
    "UnknownHandler",
    "UnknownQueue",
    "UnknownRun",
    "WaitTimeout",
    "decode_lua_error",
]


class FencepostError(Exception):
    """Base of every error Fencepost raises on purpose."""


class InvalidInput(FencepostError, ValueError):
    """The request is malformed; nothing was changed."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnknownHandler(InvalidInput):
    def __init__(self, handler: str) -> None:
        super().__init__(
            f"unknown handler {handler!r}: no worker or client has registered it "
            "(register it with Client.register(registry) or start a worker that has it)",
            field="handler",
        )
        self.handler = handler


class PayloadTooLarge(InvalidInput):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload is {size} bytes, the limit is {limit}", field="payload")
        self.size, self.limit = size, limit


class IdempotencyConflict(FencepostError):
    """The idempotency key was used in this scope for a different request; nothing was written."""

    def __init__(self, key: str, scope: str, run_id: int) -> None:
        super().__init__(f"idempotency key {key!r} was used in {scope!r} for a different request (run {run_id}); "
                         "use a new key for a new request")
        self.key, self.scope, self.run_id = key, scope, run_id


class UnknownRun(FencepostError, LookupError):
    def __init__(self, run_id: int) -> None:
        super().__init__(f"no run with id {run_id}")
        self.run_id = run_id


class IllegalTransition(FencepostError):
    """The run is not in a state that allows the request (compare-and-set lost)."""

    def __init__(self, run_id: int | None, current: str, requested: str) -> None:
        where = f"run {run_id}" if run_id is not None else "run"
        super().__init__(f"{where} is already {current}; cannot {requested}")
        self.run_id, self.current, self.requested = run_id, current, requested


class ResumeRefused(FencepostError):
    """Resuming would not be safe (checkpoint schema, missing input, not resumable); restart instead."""

    def __init__(self, run_id: int, reason: str) -> None:
        super().__init__(f"run {run_id} cannot be resumed: {reason}. Restart it from the beginning "
                         f"instead (`fencepost restart {run_id}`), which discards its checkpoint")
        self.run_id, self.reason, self.offer = run_id, reason, "restart"


class ConcurrentModification(IllegalTransition):
    """The run changed since the caller read it (expected version is stale)."""

    def __init__(self, run_id: int, current: str, requested: str, version: int) -> None:
        FencepostError.__init__(self, f"run {run_id} changed (now {current}, version {version}); cannot {requested} "
                                      "on the version you saw")
        self.run_id, self.current, self.requested, self.version = run_id, current, requested, version


class UnknownQueue(InvalidInput):
    def __init__(self, queue: str) -> None:
        super().__init__(f"no queue named {queue!r}", field="queue")
        self.queue = queue


class BulkNotConfirmed(InvalidInput):
    """A bulk command needs an explicit confirmation; nothing was changed."""

    def __init__(self, matched: int, limit: int) -> None:
        super().__init__(f"{matched} runs match; nothing changed. Confirm with --yes (acts on at most "
                         f"{min(matched, limit)}, --limit {limit})", field="confirm")
        self.matched, self.limit = matched, limit


class StaleToken(FencepostError):
    """A fencing token older than the run's current one: the caller lost its lease."""

    def __init__(self, run_id: int, token: int) -> None:
        super().__init__(f"token {token} for run {run_id} is stale")
        self.run_id, self.token = run_id, token


class StoreUnavailable(FencepostError, ConnectionError):
    """A store could not be reached; the request may be retried."""


class RedisUnavailable(StoreUnavailable):
    pass


class LateClaim(RedisUnavailable):
    """A claim reached Redis after its deadline (its caller had stopped waiting, or would have):
    it claimed nothing (docs/clock.md). Handled as a slow store: claim again."""

    def __init__(self, server_ms: int, deadline_ms: int) -> None:
        super().__init__(f"claim ran at {server_ms} ms on the Redis clock, after its deadline {deadline_ms}; "
                         "nothing was claimed")
        self.server_ms, self.deadline_ms = server_ms, deadline_ms


class DatabaseUnavailable(StoreUnavailable):
    pass


class SubmitInDoubt(DatabaseUnavailable):
    """PostgreSQL went away while committing a batch and could not be asked afterwards whether
    the commit happened: the runs `run_ids` (request order) either all exist or none does.
    Resubmit with idempotency keys, or look the ids up once PostgreSQL is back."""

    def __init__(self, run_ids: list[int], cause: str) -> None:
        super().__init__(f"a batch of {len(run_ids)} runs may or may not have committed ({cause}); "
                         "look up its run ids or resubmit with idempotency keys")
        self.run_ids = run_ids


class NotStamped(FencepostError):
    """Redis holds no epoch stamp for the queue: it may have lost data, so claims wait."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue!r} is not stamped with the current epoch; waiting for the reconciler")
        self.queue = queue


class WaitTimeout(FencepostError, TimeoutError):
    def __init__(self, run_id: int, status: str) -> None:
        super().__init__(f"run {run_id} still {status} when the wait timed out")
        self.run_id, self.status = run_id, status


def decode_lua_error(message: str) -> FencepostError:
    """Map the `CODE arg...` errors raised by lua/ scripts to typed errors (the only place that parses them)."""
    code, _, rest = message.partition(" ")
    args = rest.split(" ")
    if code == "ILLEGAL_TRANSITION":
        # ILLEGAL_TRANSITION <run_id> <from> <to>
        return IllegalTransition(int(args[0]) if args[0].isdigit() else None, args[1], f"move to {args[2]}")
    if code == "UNSTAMPED":
        return NotStamped(rest)
    if code == "STATE":  # STATE <run_id> <current> <verb>
        return IllegalTransition(int(args[0]), args[1], args[2])
    if code == "STALE_VERSION":  # STALE_VERSION <run_id> <current> <verb> <version>
        return ConcurrentModification(int(args[0]), args[1], args[2], int(args[3]))
    if code == "NO_RUN":
        return UnknownRun(int(args[0]))
    if code == "LATE_CLAIM":  # LATE_CLAIM <server now ms> <deadline ms>
        return LateClaim(int(args[0]), int(args[1]))
    return FencepostError(message)


# -- errors a handler raises to say what kind of failure it hit ---------------------------------
class JobError(Exception):
    """Base of the classified failures a handler may raise (or map its own exceptions to with
    `@registry.job(errors={SomeError: "transient", ...})`). Unknown exceptions are transient."""

    kind = "transient"


class Transient(JobError):
    """A dependency timed out or hiccupped: retried with exponential backoff and full jitter."""


class RateLimited(JobError):
    """The dependency said slow down: retried after `retry_after` seconds, and the queue's
    claims are throttled for that long."""

    kind = "rate_limited"

    def __init__(self, message: str = "rate limited", *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class InvalidJobInput(JobError):
    """The input can never succeed: failed at once, never retried."""

    kind = "invalid_input"


class SideEffectFailed(JobError):
    """A non-idempotent side effect may or may not have happened: the run goes to the review
    queue (FAILED, reason 'review') until an operator reconciles it."""

    kind = "side_effect"


class PolicyViolation(JobError):
    """Authorization or policy refused the work: the run stops (FAILED, reason 'policy') and the
    owner / security route is alerted."""

    kind = "policy"


ERROR_KINDS = ("transient", "rate_limited", "invalid_input", "side_effect", "policy")
