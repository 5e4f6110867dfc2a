"""The stream entry: what one transition carries from a Lua script to the recorder.

`transition()` in lua/includes/common.lua appends one entry per transition to the queue's
events stream (`Keys.events`); the recorder folds entries into history and the projection.
The fields are declared here once: the scripts get the set rendered into them (`-- @event_fields`,
`EVENT_FIELD`) and `transition()` refuses a field the set lacks (UNDECLARED_EVENT_FIELD), and
tests/test_stream_contract.py fails when a reader in Python asks for one. Values are strings
(Redis stream values); times are the Redis server's clock in ms.
"""

from __future__ import annotations

import msgspec

__all__ = ["EVENT_FIELDS", "EventField", "field_names", "lua_source"]


class EventField(msgspec.Struct, frozen=True):
    name: str
    doc: str
    always: bool = False
    """Written by transition() on every entry (the rest come with some events only)."""


EVENT_FIELDS: tuple[EventField, ...] = (
    EventField("run", "the run's id", always=True),
    EventField("type", "the event (claimed, succeeded, lease_expired, paused, ...)", always=True),
    EventField("from", "the state before", always=True),
    EventField("to", "the state after", always=True),
    EventField("v", "the run's version after the transition: (run, v) names one transition", always=True),
    EventField("ts", "when, on the Redis server's clock (ms)", always=True),
    EventField("attempt", "the attempt the transition belongs to"),
    EventField("token", "the attempt's fencing token"),
    EventField("worker", "the worker holding (or that held) the attempt"),
    EventField("lease", "claimed: the lease's expiry (ms)"),
    EventField("due", "claimed: when the run became due (ms), for submit-to-start latency"),
    EventField("rts", "claimed: the start as its rate window counts it (ms)"),
    EventField("started", "a finish: the attempt's start (ms), so the recorder prunes to its partition"),
    EventField("outcome", "a finish: succeeded, failed, error, interrupted, released, paused, cancelled, stopped"),
    EventField("result", "succeeded: the encoded result"),
    EventField("error_class", "a failed attempt: the error's class"),
    EventField("error", "a failed attempt: the error's text"),
    EventField("forced", "a finish forced by the worker (escalation)"),
    EventField("compensate", "cancelled: the compensation handler to run"),
    EventField("run_at", "retry_scheduled: when the retry is due (ms)"),
    EventField("reason", "why (an operator's reason, retry_budget_exhausted, interrupted_too_often, ...)"),
    EventField("actor", "an operator command: who asked"),
    EventField("ctl", "an operator command pending on a running attempt (pause, cancel)"),
    EventField("interrupts", "lease_expired: interruptions of the run so far"),
    EventField("gen", "the run's generation (restart/retry from an operator)"),
    EventField("sanitized", "added by the recorder: an operator's text made storable before it was recorded"),
)


def field_names() -> frozenset[str]:
    return frozenset(f.name for f in EVENT_FIELDS)


def lua_source() -> str:
    """The declared fields as a Lua set, rendered into lua/includes/common.lua."""
    body = ", ".join(f"['{f.name}'] = true" for f in EVENT_FIELDS)
    return f"local EVENT_FIELD = {{{body}}}"
