"""Metrics of the reconciler (one module per component; labels are bounded: kind, queue)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

__all__ = ["DRIFT_FOUND", "DRIFT_REPAIRED", "REBUILDS", "REBUILD_SECONDS", "RESTORED"]

DRIFT_FOUND = Counter("fencepost_drift_found_total", "Drift between Redis and PostgreSQL found, by kind",
                      ["kind", "queue"])
DRIFT_REPAIRED = Counter("fencepost_drift_repaired_total", "Drift between Redis and PostgreSQL repaired, by kind",
                         ["kind", "queue"])
REBUILDS = Counter("fencepost_queue_rebuilds_total", "Queues rebuilt from PostgreSQL (untrusted Redis dataset)",
                   ["queue"])
RESTORED = Counter("fencepost_rebuild_runs_total", "Runs restored or interrupted by rebuilds",
                   ["queue", "action"])
REBUILD_SECONDS = Histogram("fencepost_rebuild_seconds", "Duration of a queue rebuild", ["queue"],
                            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120))
