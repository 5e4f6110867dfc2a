"""The run state machine: the one place that says which transitions exist.

Lua scripts do not carry their own copy: the Lua gateway (`fencepost.core.hot`) renders
`lua_source()` (the edges of `TRANSITIONS` and every group of `GROUPS`) into
`lua/includes/common.lua` at `-- @states` when it loads the scripts, so a script can only take an
edge listed here (anything else raises `ILLEGAL_TRANSITION` inside Redis, before any write) and
tests a run's state against a group by name (`ACTIVE[st]`), never by a list of its own.
"""

from __future__ import annotations

import enum

__all__ = [
    "ACTIVE",
    "CANCEL_AT_ONCE",
    "DEAD",
    "FAILED_FOR_GOOD",
    "FINISHED",
    "GROUPS",
    "IN_REDIS",
    "LIVE",
    "PAUSE_AT_ONCE",
    "RESTARTABLE",
    "RESTING",
    "RESUMABLE",
    "STOP_ENDS",
    "TERMINAL",
    "TRANSITIONS",
    "UNCLAIMED",
    "UNSUCCESSFUL",
    "WAITING",
    "Status",
    "edges",
    "is_legal",
    "lua_source",
]


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
    (S.PENDING, S.PENDING): frozenset({"run_now"}),  # a delayed run made due now by an operator
    (S.PENDING, S.PAUSED): frozenset({"paused"}),
    (S.PENDING, S.CANCELLED): frozenset({"cancelled", "upstream_failed"}),
    (S.RETRY_WAIT, S.PENDING): frozenset({"due", "run_now"}),
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
FINISHED = TERMINAL | {S.STOPPED}
"""States with `finished_at` set: the run's last attempt is over (SQL `finished_iff_terminal`)."""
RESTING = TERMINAL | {S.PAUSED, S.STOPPED}
"""States in which nothing more happens to a run until an operator acts (what wait() waits for)."""
ACTIVE = frozenset({S.RUNNING, S.STOPPING})
"""States that hold a lease (SQL `leased_iff_active`; the queue's `active` ZSET)."""
LIVE = frozenset(S) - FINISHED
"""States of a run whose story is not over: it is (or will be) in Redis and counts as busy."""
FAILED_FOR_GOOD = frozenset({S.FAILED, S.TIMED_OUT, S.CANCELLED})
"""Terminal without success; `retry` takes them back to PENDING."""
WAITING = LIVE - ACTIVE
"""Live but not leased: due, delayed, held for a concurrency slot, paused or blocked."""
UNSUCCESSFUL = FINISHED - {S.SUCCEEDED}
"""Finished without success: the nodes a workflow retry runs again."""
RESTORED = WAITING - {S.BLOCKED}
"""Waiting states a rebuild restores from PostgreSQL and a lost dataset may already have claimed
(a BLOCKED run never reached Redis): each gets an `unknown` attempt row before it is claimed again."""
IN_REDIS = LIVE - {S.BLOCKED}
"""States of a run Redis must hold (a BLOCKED run reaches Redis when released): what `reconcile --check`
compares with the record."""
DEAD = frozenset({S.FAILED, S.TIMED_OUT})
"""The dead-letter view (minus the review queue, which is FAILED with reason 'review')."""
STOP_ENDS = frozenset({S.STOPPED, S.CANCELLED})
"""States a stop request ends in; only these record whether the stop was forced."""
RESUMABLE = frozenset({S.PAUSED, S.STOPPED})
"""States `resume` continues from the latest checkpoint."""
RESTARTABLE = RESUMABLE | FAILED_FOR_GOOD
"""States `restart` runs again from the beginning."""
CANCEL_AT_ONCE = frozenset({S.BLOCKED, S.PENDING, S.RETRY_WAIT, S.PAUSED, S.STOPPED})
"""States `cancel` ends at once (an active run is stopped first)."""
PAUSE_AT_ONCE = frozenset({S.PENDING, S.RETRY_WAIT})
"""States `pause` parks at once (a RUNNING run pauses at its next safe boundary)."""
UNCLAIMED = frozenset({S.BLOCKED, S.PENDING, S.PAUSED, S.CANCELLED})
"""States a run that was never claimed can be in (SQL `claimed_has_attempt`: every other state has attempt > 0)."""

GROUPS: dict[str, frozenset[Status]] = {
    "TERMINAL": TERMINAL, "FINISHED": FINISHED, "LIVE": LIVE, "RESTING": RESTING, "ACTIVE": ACTIVE,
    "WAITING": WAITING, "RESTORED": RESTORED, "IN_REDIS": IN_REDIS, "UNSUCCESSFUL": UNSUCCESSFUL,
    "FAILED_FOR_GOOD": FAILED_FOR_GOOD, "DEAD": DEAD, "STOP_ENDS": STOP_ENDS, "RESUMABLE": RESUMABLE, "RESTARTABLE": RESTARTABLE,
    "CANCEL_AT_ONCE": CANCEL_AT_ONCE, "PAUSE_AT_ONCE": PAUSE_AT_ONCE, "UNCLAIMED": UNCLAIMED,
}
"""Every named group of states, the one copy: Lua gets them as tables (`ACTIVE[st]`), SQL CHECK
constraints and `status IN (...)` lists in named queries are checked against them by tests."""


def is_legal(frm: Status | None, to: Status, event: str | None = None) -> bool:
    events = TRANSITIONS.get((frm, to))
    return events is not None and (event is None or event in events)


def edges() -> set[tuple[str, str, str]]:
    """Every (from, to, event) triple, with creation written as from=''."""
    return {(f.value if f else "", t.value, e) for (f, t), evs in TRANSITIONS.items() for e in evs}


def lua_source() -> str:
    """The state table as Lua: `LEGAL['FROM>TO>event'] = true` and one set per group."""
    entries = ", ".join(f"['{f}>{t}>{e}'] = true" for f, t, e in sorted(edges()) if f)
    lines = [f"local LEGAL = {{{entries}}}"]
    for name, group in GROUPS.items():
        members = ", ".join(f"{s.value} = true" for s in sorted(group))
        lines.append(f"local {name} = {{{members}}}")
    return "\n".join(lines)
