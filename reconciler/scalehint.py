"""The scale hint as a gauge: `fencepost_scale_hint_workers{queue}`, the worker replica count
each queue needs now by Little's law (scheduler/scaling.py), for dashboards and autoscalers.

Settings from the environment (the reconciler has no flags for them):
    FENCEPOST_SCALE_TARGET_LAG_S   (default 10)   backlog drained within this many seconds
    FENCEPOST_SCALE_CONCURRENCY    (default 100)  the workers' --concurrency
    FENCEPOST_SCALE_WINDOW_S       (default 300)  history measured
    FENCEPOST_SCALE_EVERY_S        (default 30)   how often (the queries scan the queue's recent runs)

Hooked into reconciler/service.py's maintain_once with one line (see docs/scale.md).
"""

from __future__ import annotations

import os
import time

from prometheus_client import Gauge

from fencepost.core.scaling import scale_hint
from fencepost.core.stores import Stores

__all__ = ["WORKERS", "ScaleHints"]

WORKERS = Gauge("fencepost_scale_hint_workers", "Worker replicas the queue needs now (Little's law: "
                "(arrival rate + backlog / target lag) x mean run time / (concurrency x utilisation))", ["queue"])
IN_FLIGHT = Gauge("fencepost_scale_hint_in_flight", "Runs in flight the queue needs to meet its target lag", ["queue"])


class ScaleHints:
    def __init__(self, stores: Stores) -> None:
        env = os.environ.get
        self.stores = stores
        self.target_lag_s = float(env("FENCEPOST_SCALE_TARGET_LAG_S", "10"))
        self.concurrency = int(env("FENCEPOST_SCALE_CONCURRENCY", "100"))
        self.window_s = float(env("FENCEPOST_SCALE_WINDOW_S", "300"))
        self.every_s = float(env("FENCEPOST_SCALE_EVERY_S", "30"))
        self._last = 0.0

    async def observe(self, queues: list[str], *, force: bool = False) -> None:
        if not force and time.monotonic() - self._last < self.every_s:
            return
        self._last = time.monotonic()
        db = self.stores.db
        if not db.connected:
            return
        for q in queues:
            h = await scale_hint(db, q, window_s=self.window_s, target_lag_s=self.target_lag_s,
                                 concurrency=self.concurrency)
            WORKERS.labels(q).set(h.replicas)
            IN_FLIGHT.labels(q).set(h.in_flight)
