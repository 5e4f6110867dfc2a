"""Fleet-wide gauges the reconciler publishes (queue depth and age, dead-letter and review
queues, retry budgets, rate limits, recorder lag) and the stuck-run detector behind the SLA alerts.

Bounded labels only: queue, priority band, state, reason.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import Counter, Gauge, Histogram

from fencepost.core.fairness import due_summary
from fencepost.core.hotreads import queue_gauges
from fencepost.core.stores import Stores
from fencepost.reconciler.loops import each_queue

log = logging.getLogger("fencepost.reconciler")

DEPTH = Gauge("fencepost_queue_depth", "Runs waiting by queue, priority band and kind (due/delayed/active; "
              "band 'all' from Redis, bands high/normal/low of due runs from PostgreSQL)",
              ["queue", "band", "kind"])
HELD = Gauge("fencepost_held_runs", "Due runs waiting for a slot of their concurrency key", ["queue"])
OLDEST = Gauge("fencepost_queue_oldest_pending_seconds", "Age of the oldest due run (now - run_at)", ["queue"])
DEAD = Gauge("fencepost_dead_letter_runs", "Runs in the dead-letter view (FAILED / TIMED_OUT, not review)", ["queue"])
REVIEW = Gauge("fencepost_review_queue_runs", "Runs waiting for an operator to reconcile a side effect", ["queue"])
STUCK = Gauge("fencepost_stuck_runs", "Runs in RUNNING / STOPPING / PAUSED beyond their SLA", ["queue", "state"])
STUCK_EVENTS = Counter("fencepost_stuck_detected_total", "Runs newly found stuck beyond their SLA", ["queue", "state"])
BUDGET_EXHAUSTED = Gauge("fencepost_retry_budget_exhausted", "Retries delayed by the queue's retry budget (counter in Redis)",
                         ["queue"])
RATE_DEFERRED = Gauge("fencepost_rate_deferred", "Starts a proactive rate limit deferred: runs held for their rate key's "
                      "window, and claims the queue's window refused (counter in Redis)", ["queue"])
RATE_HELD = Gauge("fencepost_rate_held_runs", "Due runs held until their rate key's window frees", ["queue"])
RATE_WINDOW_USED = Gauge("fencepost_rate_window_used", "Starts in the queue-wide rate window now (of its limit)", ["queue"])
STALE_FINISH = Gauge("fencepost_stale_finishes", "Finishes refused for a stale token (counter in Redis)", ["queue"])
RECORDER_LAG = Gauge("fencepost_recorder_lag_seconds", "Age of the newest transition the recorder committed when it did")
POISON = Counter("fencepost_recorder_poison_total",
                 "Transitions PostgreSQL refused even alone, kept in the <prefix>:recorder:poison stream")
RECORDED = Counter("fencepost_recorded_events_total", "Transitions written to PostgreSQL by the recorder", ["type"])
CONTROL = Counter("fencepost_control_actions_total", "Operator commands and forced stops, from the history", ["action"])
SCHEDULE_LAG = Histogram("fencepost_schedule_lag_seconds", "Claim time minus run_at (due time)", ["queue"],
                         buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900))
RECOVERY = Histogram("fencepost_recovery_seconds", "Lease expiry of an interrupted attempt to the next claim",
                     ["queue"], buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900))

CONTROL_TYPES = {"pause_requested": "pause", "paused": "pause", "stop_requested": "stop", "cancelled": "cancel",
                 "cancel_requested": "cancel", "resumed": "resume", "restarted": "restart", "retried": "retry",
                 "stop_escalated": "forced", "resolved": "resolve"}
BANDS = (("high", 200, 255), ("normal", 100, 199), ("low", 0, 99))
MAX_TENANTS = 200
"""Tenants (with due runs) per queue read for the depth and oldest-run gauges."""


class Gauges:
    def __init__(self, stores: Stores, *, sla: dict[str, float] | None = None) -> None:
        self.stores = stores
        # seconds a run may sit in a state before it counts as stuck
        self.sla = sla or {"RUNNING": 3600.0, "STOPPING": 300.0, "PAUSED": 86400.0}
        self._stuck_seen: set[int] = set()

    async def observe(self, queues: list[str]) -> None:
        """Every queue's gauges, then the record's (bands, dead letters, stuck runs). A queue that
        fails is logged and does not stop the others nor the stuck-run detector (each_queue raises
        QueueFailures once the pass is done, so it is counted as an error)."""
        now = time.time()
        try:
            await each_queue("gauges", queues, lambda q: self._observe_queue(q, now))
        finally:
            await self._from_postgres(now, queues)

    async def _observe_queue(self, q: str, now: float) -> None:
        due, age = await due_summary(self.stores, q, now=now, max_tenants=MAX_TENANTS)
        g = await queue_gauges(self.stores.redis, self.stores.keys(q), max_keys=MAX_TENANTS)
        HELD.labels(q).set(g.held)
        RATE_DEFERRED.labels(q).set(g.rate_limited)  # rate limits: starts deferred, runs held, the window's use
        RATE_HELD.labels(q).set(g.rate_held)
        RATE_WINDOW_USED.labels(q).set(g.rate_window_used)
        DEPTH.labels(q, "all", "due").set(due)
        DEPTH.labels(q, "all", "delayed").set(g.delayed)
        DEPTH.labels(q, "all", "active").set(g.active)
        OLDEST.labels(q).set(age)
        BUDGET_EXHAUSTED.labels(q).set(g.budget_exhausted)
        STALE_FINISH.labels(q).set(g.stale_finish)

    async def _from_postgres(self, now: float, queues: list[str]) -> None:
        db = self.stores.db
        if not db.connected:
            return
        # depth by priority band (the starvation signal), counted from the record
        bands = {(r.queue, r.band): r.n for r in await db.rows("gauge_due_bands")}
        for q in queues:
            for name, _, _ in BANDS:
                DEPTH.labels(q, name, "due").set(bands.get((q, name), 0))
        rows = await db.rows("gauge_dead_and_review")
        seen = {(r.queue, bool(r.review)): r.n for r in rows}
        for gauge, review in ((DEAD, False), (REVIEW, True)):  # series that emptied go back to 0
            for (q,) in list(gauge._metrics):
                if (q, review) not in seen:
                    gauge.labels(q).set(0)
        for (q, review), n in seen.items():
            (REVIEW if review else DEAD).labels(q).set(n)
        stuck = await db.rows("gauge_stuck_runs", self.sla["RUNNING"], self.sla["STOPPING"], self.sla["PAUSED"])
        counts: dict[tuple[str, str], int] = {}
        fresh = []
        for r in stuck:
            counts[(r.queue, r.status)] = counts.get((r.queue, r.status), 0) + 1
            if r.id not in self._stuck_seen:
                fresh.append(r)
        for labels in list(STUCK._metrics):  # reset series that are no longer stuck
            if labels not in counts:
                STUCK.labels(*labels).set(0)
        for (q, st), n in counts.items():
            STUCK.labels(q, st).set(n)
        if fresh:  # one event per run that crossed its SLA: what the SLA alerts and runbooks point at
            await db.execute("stuck_detected_events", [r.id for r in fresh], [r.queue for r in fresh],
                             [r.status for r in fresh],
                             [f"{r.status} beyond its SLA of {self.sla[r.status]:g}s" for r in fresh])
            for r in fresh:
                STUCK_EVENTS.labels(r.queue, r.status).inc()
                log.warning("run %s stuck in %s beyond its SLA", r.id, r.status,
                            extra={"event": "stuck_detected", "run_id": r.id, "queue": r.queue})
        self._stuck_seen = {r.id for r in stuck}
