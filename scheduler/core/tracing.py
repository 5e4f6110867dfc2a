"""W3C trace context: taken at submit, carried with the run, handed to the handler.

A producer passes `trace=` (a traceparent) or sets `traceparent_var` around its code;
otherwise each submit starts a new trace. Inside a handler `traceparent_var` holds the
run's traceparent, so runs submitted from a job continue its trace.
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar

__all__ = ["new_traceparent", "trace_id", "traceparent_var", "valid_traceparent"]

traceparent_var: ContextVar[str | None] = ContextVar("fencepost_traceparent", default=None)
_TP = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


def new_traceparent() -> str:
    return f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"


def valid_traceparent(value: str) -> bool:
    m = _TP.match(value)
    return m is not None and m.group(1) != "0" * 32


def trace_id(traceparent: str | None) -> str | None:
    if not traceparent:
        return None
    m = _TP.match(traceparent)
    return m.group(1) if m else None
