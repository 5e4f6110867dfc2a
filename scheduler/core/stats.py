"""The per-minute rollup behind the dashboard's charts (sql/013_queue_minutes.sql): which transitions
it counts, its histogram buckets, and percentiles read back from them. The recorder writes it in the
transaction of the batch it counts; the API sums minutes into a chart's steps."""

from __future__ import annotations

__all__ = ["BOUNDS_MS", "KINDS", "percentile"]

BOUNDS_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 900000, 3600000)
"""Upper bounds of the histogram buckets (ms); one more bucket holds anything longer (16 in all)."""

KINDS = {b"claimed": "started", b"succeeded": "succeeded", b"failed": "failed", b"timed_out": "failed",
         b"retry_scheduled": "retried"}
"""Event type -> the chart's series it counts in."""


def percentile(hist: list[int], q: float) -> float | None:
    """The q-quantile (0 < q < 1) of a bucketed histogram, interpolated inside its bucket; None if empty.
    The open last bucket answers its lower bound (at least that long)."""
    total = sum(hist)
    if total == 0:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(hist):
        if n and seen + n >= rank:
            lo = 0 if i == 0 else BOUNDS_MS[i - 1]
            if i >= len(BOUNDS_MS):
                return float(lo)
            return lo + (BOUNDS_MS[i] - lo) * (rank - seen) / n
        seen += n
    return float(BOUNDS_MS[-1])
