"""The run state machine: the one place that says which transitions exist.

Lua scripts do not carry their own copy: `scripts.py` renders `TRANSITIONS` into
`lua/includes/common.lua` (at `-- @states`) at load time, so a script can only take an edge listed
here (anything else raises `ILLEGAL_TRANSITION` inside Redis, before any write).
"""

from __future__ import annotations

import enum

__all__ = ["Status", "TRANSITIONS", "TERMINAL", "RESTING", "ACTIVE", "is_legal", "edges"]


class Status(enum.StrEnum):
    BLOCKED = "BLOCKED"
    """Waiting for upstream runs of its workflow; never dispatched until released."""
    PENDING = "PENDING"
    """Durable and claimable once run_at is due."""
    RUNNING = "RUNNING"
    """Leased to one worker; the fencing token in the run says which attempt owns it."""
    RETRY_WAIT = "RETRY_WAIT"
    """Failed an attempt; due again at run_at (backoff with full jitter)."""
    PAUSED = "PAUSED"
    """Parked by an operator; keeps its checkpoint; dispatched only after resume."""
    STOPPING = "STOPPING"
    """Stop requested while running; the handler is expected to checkpoint and return."""
    STOPPED = "STOPPED"
    """Stopped gracefully (or forced after the grace period); resumable."""
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    """Terminal failure: retries exhausted, fatal error, quarantined (dead-letter view)."""
    TIMED_OUT = "TIMED_OUT"
    """Terminal: the last allowed attempt exceeded its timeout."""
    CANCELLED = "CANCELLED"


S = Status

# (from, to) -> the events that may take that edge. `None` as `from` is creation.
TRANSITIONS: dict[tuple[Status | None, Status], frozenset[str]] = {
    (None, S.PENDING): frozenset({"submitted"}),
    (None, S.BLOCKED): frozenset({"submitted"}),
    (S.BLOCKED, S.PENDING): frozenset({"released"}),
    (S.BLOCKED, S.CANCELLED): frozenset({"cancelled", "upstream_failed"}),
    (S.PENDING, S.RUNNING): frozenset({"claimed"}),
    (S.PENDING, S.PAUSED): frozenset({"paused"}),
    (S.PENDING, S.CANCELLED): frozenset({"cancelled", "upstream_failed"}),
    (S.RETRY_WAIT, S.PENDING): frozenset({"due"}),
    (S.RETRY_WAIT, S.PAUSED): frozenset({"paused"}),
    (S.RETRY_WAIT, S.CANCELLED): frozenset({"cancelled", "upstream_failed"}),
    (S.RUNNING, S.SUCCEEDED): frozenset({"succeeded"}),
    (S.RUNNING, S.RETRY_WAIT): frozenset({"retry_scheduled"}),
    (S.RUNNING, S.FAILED): frozenset({"failed", "lease_expired"}),
    (S.RUNNING, S.TIMED_OUT): frozenset({"timed_out"}),
    (S.RUNNING, S.PENDING): frozenset({"lease_expired", "released"}),
    (S.RUNNING, S.PAUSED): frozenset({"paused", "lease_expired"}),
    (S.RUNNING, S.STOPPING): frozenset({"stop_requested"}),
    (S.STOPPING, S.STOPPED): frozenset({"stopped", "lease_expired"}),
    (S.STOPPING, S.CANCELLED): frozenset({"cancelled", "lease_expired"}),
    (S.STOPPING, S.SUCCEEDED): frozenset({"succeeded"}),
    (S.STOPPING, S.FAILED): frozenset({"failed"}),
    # Control requests that keep the state: the flag is for the worker holding the lease.
    (S.RUNNING, S.RUNNING): frozenset({"pause_requested"}),
    (S.STOPPING, S.STOPPING): frozenset({"cancel_requested", "stop_escalated"}),
    (S.PAUSED, S.PENDING): frozenset({"resumed", "restarted"}),
    (S.PAUSED, S.CANCELLED): frozenset({"cancelled"}),
    (S.STOPPED, S.PENDING): frozenset({"resumed", "restarted"}),
    (S.STOPPED, S.CANCELLED): frozenset({"cancelled"}),
    (S.FAILED, S.PENDING): frozenset({"retried", "restarted"}),
    # the review queue: an operator reconciled a non-idempotent side effect by hand
    (S.FAILED, S.SUCCEEDED): frozenset({"resolved"}),
    (S.FAILED, S.FAILED): frozenset({"resolved"}),
    (S.TIMED_OUT, S.PENDING): frozenset({"retried", "restarted"}),
    (S.CANCELLED, S.PENDING): frozenset({"retried", "restarted"}),
    (S.CANCELLED, S.BLOCKED): frozenset({"retried"}),  # workflow retry of an upstream_failed node
}

TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED})
"""States a run stays in unless an operator retries or restarts it."""
RESTING = TERMINAL | {S.PAUSED, S.STOPPED}
"""States in which nothing more happens to a run until an operator acts (what wait() waits for)."""
ACTIVE = frozenset({S.RUNNING, S.STOPPING})
"""States that hold a lease."""


def is_legal(frm: Status | None, to: Status, event: str | None = None) -> bool:
    events = TRANSITIONS.get((frm, to))
    return events is not None and (event is None or event in events)


def edges() -> set[tuple[str, str, str]]:
    """Every (from, to, event) triple, with creation written as from=''."""
    return {(f.value if f else "", t.value, e) for (f, t), evs in TRANSITIONS.items() for e in evs}
