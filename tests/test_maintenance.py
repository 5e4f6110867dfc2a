"""The reconciler's maintenance loops are independent (reconciler/loops.py): a stuck drift pass
and a failing gauges pass do not delay the reaper, the failures are counted, a queue whose
Redis dataset is not trusted is rebuilt before drift repair touches it, and a graceful stop
cancels a pass that does not finish. Real Redis and PostgreSQL; every wait is on an event."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from fencepost.reconciler import service
from fencepost.reconciler.loops import QueueGate
from fencepost.reconciler.service import Reconciler
from tests.conftest import run_state
from tests.test_drift import Q, claim

pytestmark = pytest.mark.slow

BOUND_S = 10.0
"""Every wait below is on an event, bounded by this (the reaper runs every 0.2 s here)."""


def runs(loop: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("fencepost_maintenance_runs_total", {"loop": loop, "outcome": outcome}) or 0.0


async def within(event: asyncio.Event, what: str) -> None:
    try:
        await asyncio.wait_for(event.wait(), BOUND_S)
    except TimeoutError:
        raise AssertionError(f"no {what} within {BOUND_S}s") from None


async def test_a_stuck_and_a_failing_loop_do_not_delay_the_reaper(client: Client, stores: Stores, settings: Settings,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rid = await client.submit("t.noop")
    rec = Reconciler(settings, tick_s=0.2, stop_grace_s=0.5)
    rec.loops["gauges"].interval_s = 0.1
    drift_stuck, drift_cancelled, gauges_failed, reaped = (asyncio.Event() for _ in range(4))

    async def stuck(queue: str) -> None:  # a drift pass that never ends (until cancelled)
        drift_stuck.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            drift_cancelled.set()
            raise

    async def failing(queues: list[str]) -> None:
        gauges_failed.set()
        raise RuntimeError("gauges: PostgreSQL said no")

    reap = rec._reap

    async def watched_reap(queue: str) -> None:  # the reaper takes no time: the server's clock decides
        await reap(queue)
        if queue == Q and await run_state(stores, rid) not in ("RUNNING", None):
            reaped.set()

    monkeypatch.setattr(rec.drift, "tick", stuck)
    monkeypatch.setattr(rec.gauges, "observe", failing)
    monkeypatch.setattr(rec, "_reap", watched_reap)
    base = {key: runs(*key) for key in (("gauges", "error"), ("reaper", "ok"))}

    task = asyncio.create_task(rec.run())
    try:
        await within(drift_stuck, "drift pass")
        drift_passes = (runs("drift", "ok"), runs("drift", "error"))  # those before the gate trusted tq
        await within(gauges_failed, "gauges pass")
        # A worker took a lease and died: its lease expired while the drift pass is stuck.
        [(claimed, _)] = await claim(stores)
        assert claimed == rid and await run_state(stores, rid) == "RUNNING"
        k = stores.keys(Q)
        await stores.redis.hset(k.run(rid), "lease_until", 1)
        await stores.redis.zadd(k.active, {str(rid): 1})
        await within(reaped, "reap of the expired lease")
        assert not task.done()
    finally:
        rec.stop.set()
        await asyncio.wait_for(task, BOUND_S)  # returns: the stuck pass is cancelled after stop_grace_s

    assert drift_cancelled.is_set(), "graceful stop cancels the pass still in flight"
    assert runs("gauges", "error") > base[("gauges", "error")], "the failing loop is counted"
    assert runs("reaper", "ok") > base[("reaper", "ok")]
    assert (runs("drift", "ok"), runs("drift", "error")) == drift_passes, \
        "the stuck drift pass never finished (a cancelled pass is not counted)"
    assert (REGISTRY.get_sample_value("fencepost_maintenance_seconds_count", {"loop": "reaper"}) or 0) > 0


async def test_an_untrusted_queue_is_rebuilt_before_drift_repair_touches_it(
        client: Client, stores: Stores, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    await client.submit("t.noop")  # queue tq
    await client.submit("t.noop", queue="other")
    await stores.redis.delete(stores.keys(Q).epoch)  # tq's dataset forgot its stamp: untrusted
    rec = Reconciler(settings, tick_s=0.1, drift_grace_s=0.0)
    rebuild_started, release, other_drifted, tq_drifted = (asyncio.Event() for _ in range(4))
    stamped_at_drift: list[bool] = []

    real_rebuild = service.rebuild_queue

    async def slow_rebuild(stores_: Stores, queue: str, **kw: Any) -> dict[str, Any]:
        rebuild_started.set()
        await release.wait()
        return await real_rebuild(stores_, queue, **kw)

    real_tick = rec.drift.tick

    async def watched_tick(queue: str) -> Any:
        if queue == Q:
            stamped_at_drift.append(bool(await stores.redis.exists(stores.keys(Q).epoch)))
            tq_drifted.set()
        else:
            other_drifted.set()
        return await real_tick(queue)

    monkeypatch.setattr(service, "rebuild_queue", slow_rebuild)
    monkeypatch.setattr(rec.drift, "tick", watched_tick)
    task = asyncio.create_task(rec.run())
    try:
        await within(rebuild_started, "rebuild of tq")
        for _ in range(3):  # drift passes go on for the other queue while tq's rebuild is held
            other_drifted.clear()
            await within(other_drifted, "drift pass over the trusted queue")
        assert stamped_at_drift == [], "drift repair touched tq before its rebuild"
        release.set()
        await within(tq_drifted, "drift pass over tq after its rebuild")
        assert stamped_at_drift[0] and [q for _, q in rec.rebuilt] == [Q]
    finally:
        rec.stop.set()
        await asyncio.wait_for(task, BOUND_S)


async def test_a_rebuild_waits_for_the_passes_in_flight_and_keeps_new_ones_off() -> None:
    gate = QueueGate()
    async with gate.using("q") as ok:
        assert not ok, "nothing is trusted before the first check"
    gate.publish(["bad"])
    assert gate.trusted("q") and not gate.trusted("bad") and gate.suspect("bad")

    inside, rebuilt = asyncio.Event(), asyncio.Event()
    leave = asyncio.Event()

    async def drift_pass() -> None:
        async with gate.using("q") as ok:
            assert ok
            inside.set()
            await leave.wait()

    async def rebuild() -> None:
        async with gate.rebuilding("q"):
            rebuilt.set()

    pass_task = asyncio.create_task(drift_pass())
    await within(inside, "drift pass")
    rebuild_task = asyncio.create_task(rebuild())
    await asyncio.sleep(0)  # let the rebuild reach its wait
    assert not rebuilt.is_set(), "the rebuild waits for the pass in flight"
    async with gate.using("q") as ok:
        assert not ok, "no new pass while the rebuild is pending"
    assert gate.suspect("q")
    leave.set()
    await within(rebuilt, "rebuild")
    await asyncio.gather(pass_task, rebuild_task)
    assert gate.trusted("q")
    gate.unknown()
    assert not gate.trusted("q") and not gate.suspect("q"), "a failed check: drift waits, the reaper does not"
