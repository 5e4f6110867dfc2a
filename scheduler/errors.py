"""Typed errors. Every failure a caller can act on has a class and fields, never a string to match."""

from __future__ import annotations

__all__ = [
    "FencepostError", "InvalidInput", "UnknownHandler", "PayloadTooLarge", "UnknownRun",
    "IllegalTransition", "StaleToken", "StoreUnavailable", "RedisUnavailable",
    "DatabaseUnavailable", "NotStamped", "WaitTimeout", "decode_lua_error",
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


class UnknownRun(FencepostError, LookupError):
    def __init__(self, run_id: int) -> None:
        super().__init__(f"no run with id {run_id}")
        self.run_id = run_id


class IllegalTransition(FencepostError):
    """The run is not in a state that allows the request (compare-and-set lost)."""

    def __init__(self, run_id: int | None, current: str, requested: str) -> None:
        where = f"run {run_id}" if run_id is not None else "run"
        super().__init__(f"{where} is {current}; cannot {requested}")
        self.run_id, self.current, self.requested = run_id, current, requested


class StaleToken(FencepostError):
    """A fencing token older than the run's current one: the caller lost its lease."""

    def __init__(self, run_id: int, token: int) -> None:
        super().__init__(f"token {token} for run {run_id} is stale")
        self.run_id, self.token = run_id, token


class StoreUnavailable(FencepostError, ConnectionError):
    """A store could not be reached; the request may be retried."""


class RedisUnavailable(StoreUnavailable):
    pass


class DatabaseUnavailable(StoreUnavailable):
    pass


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
    return FencepostError(message)
