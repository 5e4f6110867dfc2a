"""W3C trace context: taken at submit, carried with the run, handed to the handler; and
OpenTelemetry spans when the `otel` extra is installed and the application set a tracer provider.

A producer passes `trace=` (a traceparent: the run records it as given) or sets
`traceparent_var` around its code; otherwise each submit starts a new trace. Inside a handler
`traceparent_var` holds the run's traceparent, so runs submitted from a job continue its trace,
each with a span id of its own (a child span, never a copy of the parent's).

With OpenTelemetry (`pip install fencepost[otel]` and a TracerProvider set by the application):
  fencepost.submit <handler>   PRODUCER, child of the caller's span / trace; the run carries it
  fencepost.claim <handler>    from the worker's claim to the handler starting (checkpoint load,
                               breaker check)
  fencepost.run <handler>      CONSUMER, child of the run's traceparent: the execution; runs the
                               handler submits are children of it
  fencepost.finish <handler>   the outcome written to Redis
Without the extra (or without a provider) every helper is a branch on a module constant or a
cheap provider check: no span objects, no extra work on the hot path.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

try:  # the `otel` extra
    from opentelemetry import trace as _ot
    from opentelemetry.trace import (
        NonRecordingSpan,
        NoOpTracerProvider,
        ProxyTracerProvider,
        SpanContext,
        SpanKind,
        StatusCode,
        TraceFlags,
    )

    OTEL = os.environ.get("FENCEPOST_OTEL", "1") not in ("0", "false", "no")
except ImportError:  # pragma: no cover - exercised by test_otel in a process without the package
    OTEL = False

__all__ = [
    "OTEL",
    "RunTrace",
    "child_traceparent",
    "new_traceparent",
    "run_tracer",
    "start_run",
    "submit_traceparent",
    "submit_tracer",
    "trace_id",
    "traceparent_var",
    "valid_traceparent",
]

traceparent_var: ContextVar[str | None] = ContextVar("fencepost_traceparent", default=None)
_TP = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def new_traceparent() -> str:
    ids = os.urandom(24).hex()  # trace id (16 bytes) and span id (8): one call
    return f"00-{ids[:32]}-{ids[32:]}-01"


def child_traceparent(parent: str) -> str:
    """The same trace with a new span id: what a run submitted under `parent` carries."""
    m = _TP.match(parent)
    if m is None:
        return new_traceparent()
    return f"00-{m.group(1)}-{os.urandom(8).hex()}-{m.group(3)}"


def valid_traceparent(value: str) -> bool:
    m = _TP.match(value)
    return m is not None and m.group(1) != "0" * 32


def trace_id(traceparent: str | None) -> str | None:
    if not traceparent:
        return None
    m = _TP.match(traceparent)
    return m.group(1) if m else None


# -- OpenTelemetry -------------------------------------------------------------------------------
_TRACER: Any = None
"""The tracer once a provider is set: OpenTelemetry lets an application set its provider only once,
so with tracing on, each job no longer looks the provider up (a lookup reads the environment); while
none is set the lookup stays per job, since the application may set one at any time."""


def _tracer() -> Any:
    """The application's tracer, or None (extra absent, disabled, or no provider set: spans would
    be non-recording, so none are made)."""
    global _TRACER
    if _TRACER is not None or not OTEL:
        return _TRACER
    provider = _ot.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider | NoOpTracerProvider):
        return None
    _TRACER = provider.get_tracer("fencepost")
    return _TRACER


def _parent(tp: str | None) -> Any:
    """An OpenTelemetry context whose current span is the remote parent `tp` (None: the caller's)."""
    m = _TP.match(tp) if tp else None
    if m is None:
        return None
    sc = SpanContext(trace_id=int(m.group(1), 16), span_id=int(m.group(2), 16), is_remote=True,
                     trace_flags=TraceFlags(int(m.group(3), 16)))
    return _ot.set_span_in_context(NonRecordingSpan(sc))


def _traceparent_of(span: Any) -> str:
    sc = span.get_span_context()
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


_LOOKUP: Any = object()


def submit_tracer() -> Any:
    """The tracer submits use now (None: no spans); a batch of submits looks it up once."""
    return _tracer()


def submit_traceparent(explicit: str | None, handler: str, queue: str, tracer: Any = _LOOKUP) -> str:
    """The traceparent a new run carries: `explicit` as given; else a child of the submitting
    job's (or, with OpenTelemetry, of the caller's current span); else a new trace. `tracer`:
    submit_tracer() when the caller looked it up for its batch."""
    parent = explicit or traceparent_var.get()
    if tracer is _LOOKUP:
        tracer = _tracer()
    if tracer is not None:
        span = tracer.start_span(f"fencepost.submit {handler}", context=_parent(parent), kind=SpanKind.PRODUCER,
                                 attributes={"messaging.system": "fencepost", "messaging.destination.name": queue,
                                             "fencepost.handler": handler})
        span.end()
        if explicit is None:
            return _traceparent_of(span)
    if explicit is not None:
        return explicit
    return child_traceparent(parent) if parent else new_traceparent()


class RunTrace:
    """The spans of one execution (made by `start_run` only when a tracer is active)."""

    __slots__ = ("_ctx", "_name", "_tracer", "attrs", "span")

    def __init__(self, tracer: Any, handler: str, parent: str | None, attrs: dict[str, Any], claimed_ns: int) -> None:
        self._tracer, self._name, self.attrs = tracer, handler, attrs
        ctx = _parent(parent)
        tracer.start_span(f"fencepost.claim {handler}", context=ctx, start_time=claimed_ns,
                          attributes=attrs).end()
        self.span = tracer.start_span(f"fencepost.run {handler}", context=ctx, kind=SpanKind.CONSUMER,
                                      attributes=attrs)
        self._ctx = _ot.set_span_in_context(self.span)

    @property
    def traceparent(self) -> str:
        """The execution span's traceparent: runs the handler submits are its children."""
        return _traceparent_of(self.span)

    @contextmanager
    def executing(self) -> Iterator[None]:
        """The execution span is current while the handler runs (its own instrumentation nests)."""
        with _ot.use_span(self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield

    def ended(self, outcome: str, error_class: str | None) -> None:
        self.span.set_attribute("fencepost.outcome", outcome)
        if error_class:
            self.span.set_attribute("error.type", error_class)
            self.span.set_status(StatusCode.ERROR)
        self.span.end()

    def finishing(self) -> AbstractContextManager[Any]:
        cm: AbstractContextManager[Any] = self._tracer.start_as_current_span(
            f"fencepost.finish {self._name}", context=self._ctx, attributes=self.attrs)
        return cm


def run_tracer() -> Any:
    """The tracer executions use now (None: no spans); a worker looks it up once per claimed batch
    (the provider lookup reads os.environ: 3.5 % of a draining worker's samples when done per job)."""
    return _tracer()


def start_run(trace: str | None, handler: str, queue: str, run_id: int, attempt: int,
              claimed_ns: int | None = None, tracer: Any = _LOOKUP) -> RunTrace | None:
    """Spans for one execution, or None when no tracer is active (the common, free case). `tracer`:
    run_tracer() when the caller looked it up for its batch."""
    if tracer is _LOOKUP:
        tracer = _tracer()
    if tracer is None:
        return None
    attrs = {"messaging.system": "fencepost", "messaging.destination.name": queue, "fencepost.handler": handler,
             "fencepost.run_id": run_id, "fencepost.attempt": attempt}
    return RunTrace(tracer, handler, trace, attrs, claimed_ns or time.time_ns())
