"""Turn what a handler raised into the action the seeds prescribe for its class."""

from __future__ import annotations

from typing import Any

from fencepost.core.errors import ERROR_KINDS, JobError

__all__ = ["OUTCOME_OF_KIND", "classify"]

# error kind -> finish_runs outcome
OUTCOME_OF_KIND = {
    "transient": "error",         # retry with backoff + full jitter, bounded by max_retries
    "rate_limited": "error",      # retry after retry_after; the queue is throttled meanwhile
    "invalid_input": "fatal",     # fail fast, never retried
    "side_effect": "review",      # FAILED, reason review: an operator must reconcile
    "policy": "policy",           # FAILED, reason policy: alert the owner / security route
}


def classify(exc: BaseException, mapping: dict[type, str] | None = None) -> tuple[str, float | None]:
    """(error kind, retry_after seconds or None) for an exception raised by a handler."""
    if isinstance(exc, JobError):
        return exc.kind, getattr(exc, "retry_after", None)
    for etype, kind in (mapping or {}).items():
        if isinstance(exc, etype):
            return kind, None
    return "transient", None


def validate_mapping(mapping: dict[Any, str]) -> dict[type, str]:
    for etype, kind in mapping.items():
        if not (isinstance(etype, type) and issubclass(etype, BaseException)):
            raise TypeError(f"errors= keys must be exception types, not {etype!r}")
        if kind not in ERROR_KINDS:
            raise ValueError(f"errors= value {kind!r} must be one of {', '.join(ERROR_KINDS)}")
    return dict(mapping)
