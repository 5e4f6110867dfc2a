"""Metrics of the reconciler (one module per component; labels are bounded: kind, queue, loop)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = ["DRIFT_FOUND", "DRIFT_REPAIRED", "EPOCH", "MAINTENANCE_LAST_OK", "MAINTENANCE_RUNS", "MAINTENANCE_SECONDS",
           "REBUILDS", "REBUILD_SECONDS", "RESTORED"]

DRIFT_FOUND = Counter("fencepost_drift_found_total", "Drift between Redis and PostgreSQL found, by kind",
                      ["kind", "queue"])
DRIFT_REPAIRED = Counter("fencepost_drift_repaired_total", "Drift between Redis and PostgreSQL repaired, by kind",
                         ["kind", "queue"])
REBUILDS = Counter("fencepost_queue_rebuilds_total", "Queues rebuilt from PostgreSQL (untrusted Redis dataset)",
                   ["queue"])
RESTORED = Counter("fencepost_rebuild_runs_total", "Runs restored or interrupted by rebuilds",
                   ["queue", "action"])
EPOCH = Gauge("fencepost_queue_epoch", "The queue's fencing epoch in PostgreSQL (spent by rebuilds that stamp; "
              "the last one is 8191: FencepostEpochNearCap)", ["queue"])
REBUILD_SECONDS = Histogram("fencepost_rebuild_seconds", "Duration of a queue rebuild", ["queue"],
                            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120))

# The maintenance loops (reconciler/loops.py): `loop` is one of a fixed set of names
# (rebuild, reaper, outbox, drift, refill, gauges, scale_hint, partitions, archive).
MAINTENANCE_RUNS = Counter("fencepost_maintenance_runs_total",
                           "Passes of each maintenance loop, by outcome (ok, error: the pass or one of its queues "
                           "failed; logged as <loop>_failed and retried next pass)", ["loop", "outcome"])
MAINTENANCE_SECONDS = Histogram("fencepost_maintenance_seconds", "Duration of one pass of a maintenance loop",
                                ["loop"], buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                                                   300))
MAINTENANCE_LAST_OK = Gauge("fencepost_maintenance_last_success_timestamp_seconds",
                            "Unix time a maintenance loop last finished a pass without error (stalls show as age)",
                            ["loop"])
