"""The reconciler's gauge pass isolates queues (DESIGN 8): one queue whose Redis keys cannot be read
(here its rate registry, which this session's rate gauges added to every pass, holds the wrong type)
is counted as a failed queue; the others still get their gauges, and the stuck-run detector, which
runs after them and feeds the SLA alerts, still runs."""

from __future__ import annotations

import pytest

from fencepost.client import Client
from fencepost.core.stores import Stores
from fencepost.reconciler.gauges import DEPTH, STUCK, Gauges
from fencepost.reconciler.loops import QueueFailures
from tests.conftest import record_all


async def test_one_unreadable_queue_does_not_stop_the_gauges_of_the_others(client: Client, stores: Stores) -> None:
    for i in range(3):
        await client.submit("t.echo", i)  # tq: 3 due
    paused = await client.submit("t.echo", 9, queue="other")
    await client.pause(paused, reason="hold")
    await record_all(stores)
    await stores.redis.set(stores.keys("broken").rwait, "not a sorted set")
    gauges = Gauges(stores, sla={"RUNNING": 3600.0, "STOPPING": 300.0, "PAUSED": 0.0})
    with pytest.raises(QueueFailures) as failed:
        await gauges.observe(["broken", "tq", "other"])
    assert "broken" in str(failed.value) and "tq" not in str(failed.value)
    assert DEPTH.labels("tq", "all", "due")._value.get() == 3, "the queue after the broken one was observed"
    assert STUCK.labels("other", "PAUSED")._value.get() == 1, "the stuck-run detector ran"
