"""How many worker replicas a queue needs: Little's law, sized the way the HLD sizes the fleet.

    L = lambda x W        runs in flight = arrival rate x mean run time
                          (HLD: 6K dispatches/s x 2 s = 12K in flight at peak)

Measured from PostgreSQL (the system of record) over a window:

    lambda   runs created in the queue per second
    W        mean duration of the attempts that finished in the window (executions only:
             released / paused / deferred attempts did not run the handler to an end)
    B        backlog: runs PENDING and due now

The fleet must keep up with arrivals and also drain the backlog within the target lag:

    mu       = lambda + B / target_lag                 runs to start per second
    L        = mu x W                                  runs in flight (Little's law)
    replicas = ceil(L / (concurrency x utilisation))   worker processes (>= min_replicas)

`utilisation` (< 1) is headroom: a pool run at 100 % has unbounded queueing delay. The
recommendation is what to run now, not a forecast: autoscalers (docs/deploy/k8s-worker.yaml)
should also act on the lag metric itself.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from fencepost.core.record import Database

__all__ = ["Measured", "ScaleHint", "explain", "measure", "recommend", "scale_hint"]

EXECUTED = ("succeeded", "error", "fatal", "timeout", "crash", "review", "policy", "stopped", "cancelled")
"""Attempt outcomes that ran the handler to an end (their duration is a run time)."""

@dataclass(frozen=True, slots=True)
class Measured:
    queue: str
    window_s: float
    created: int
    attempts: int
    mean_run_s: float | None
    backlog: int

    @property
    def arrival_per_s(self) -> float:
        return self.created / self.window_s if self.window_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ScaleHint:
    queue: str
    window_s: float
    created: int
    arrival_per_s: float
    attempts: int
    mean_run_s: float
    run_time_source: str
    backlog: int
    target_lag_s: float
    concurrency: int
    utilisation: float
    required_per_s: float
    in_flight: float
    exact_replicas: float
    replicas: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def recommend(*, arrival_per_s: float, mean_run_s: float, backlog: int, target_lag_s: float, concurrency: int,
              utilisation: float = 0.8, min_replicas: int = 1) -> tuple[float, float, float, int]:
    """(required starts/s, runs in flight, exact replicas, replicas) by Little's law."""
    if target_lag_s <= 0:
        raise ValueError("target lag must be > 0 seconds")
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if not 0 < utilisation <= 1:
        raise ValueError("utilisation must be in (0, 1]")
    required = arrival_per_s + backlog / target_lag_s
    in_flight = required * mean_run_s
    exact = in_flight / (concurrency * utilisation)
    return required, in_flight, exact, max(min_replicas, math.ceil(exact - 1e-9))


async def measure(db: Database, queue: str, window_s: float) -> Measured:
    """Arrival rate, mean run time and backlog of one queue from PostgreSQL (query scale_measure)."""
    row = await db.row("scale_measure", queue, float(window_s), list(EXECUTED))
    assert row is not None  # one row of aggregates, always
    return Measured(queue, float(window_s), int(row.created), int(row.attempts), row.mean_run_s,
                    int(row.backlog))


def hint_from(m: Measured, *, target_lag_s: float, concurrency: int, utilisation: float = 0.8,
              min_replicas: int = 1, run_time_s: float | None = None, default_run_s: float = 1.0) -> ScaleHint:
    """The recommendation for measured figures (`run_time_s` overrides the measured mean)."""
    if run_time_s is not None:
        w, src = run_time_s, "given"
    elif m.mean_run_s is not None:
        w, src = m.mean_run_s, "measured"
    else:
        w, src = default_run_s, "default (no finished attempts in the window)"
    required, in_flight, exact, n = recommend(arrival_per_s=m.arrival_per_s, mean_run_s=w, backlog=m.backlog,
                                              target_lag_s=target_lag_s, concurrency=concurrency,
                                              utilisation=utilisation, min_replicas=min_replicas)
    return ScaleHint(m.queue, m.window_s, m.created, m.arrival_per_s, m.attempts, w, src, m.backlog, target_lag_s,
                     concurrency, utilisation, required, in_flight, exact, n)


async def scale_hint(db: Database, queue: str, *, window_s: float = 300.0, **kw: Any) -> ScaleHint:
    return hint_from(await measure(db, queue, window_s), **kw)


def explain(h: ScaleHint) -> list[str]:
    """The arithmetic, one step a line."""
    return [
        f"queue {h.queue!r}, window {h.window_s:g} s",
        f"arrival rate    lambda = {h.created} runs / {h.window_s:g} s = {h.arrival_per_s:.3f} runs/s",
        f"mean run time   W      = {h.mean_run_s:.3f} s ({h.run_time_source}; {h.attempts} attempts finished)",
        f"backlog         B      = {h.backlog} runs due now",
        f"needed rate     mu     = lambda + B / target_lag = {h.arrival_per_s:.3f} + {h.backlog} / {h.target_lag_s:g}"
        f" = {h.required_per_s:.3f} runs/s",
        f"in flight       L      = mu x W = {h.required_per_s:.3f} x {h.mean_run_s:.3f} = {h.in_flight:.2f} runs"
        "  (Little's law)",
        f"replicas        N      = ceil(L / (concurrency x utilisation)) = ceil({h.in_flight:.2f} / "
        f"({h.concurrency} x {h.utilisation:g})) = ceil({h.exact_replicas:.3f}) -> {h.replicas}"
        + ("  (the minimum)" if h.replicas > math.ceil(h.exact_replicas - 1e-9) else ""),
    ]
