"""No run, queue or schedule stops a service loop (issue 13): the trigger quarantines a schedule
it cannot fire and fires the others; drift repair and the rebuild quarantine a run Redis cannot
hold and repair the rest; the epoch is spent only by a rebuild that stamps and its cap is a clear
typed error; the `unrecorded` repair keeps the run's reason; workflow steps waiting for their
upstream are not drift; the reconciler's gauges skip a queue they cannot read and observe the
others; the retry budget is not rewritten by each worker; a failed breaker flush keeps its counts.
Real Redis and PostgreSQL; rows an older version could write are made by SQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput, RedisUnavailable
from fencepost.core.keys import breaker_keys
from fencepost.core.models import Submit
from fencepost.core.schedules import ScheduleSpec
from fencepost.core.stores import Stores
from fencepost.reconciler import rebuild as rebuild_mod
from fencepost.reconciler.drift import DriftRepair
from fencepost.reconciler.gauges import DEPTH, STUCK, Gauges
from fencepost.reconciler.loops import QueueFailures
from fencepost.reconciler.outbox import OutboxRelay
from fencepost.reconciler.rebuild import EpochExhausted, ensure_stamped, rebuild_queue
from fencepost.schedules import Schedules
from fencepost.trigger import ManualClock, Trigger
from fencepost.worker.breakers import Breakers
from fencepost.worker.runtime import Worker
from fencepost.workflows import Node
from tests.apps import registry
from tests.conftest import record_all
from tests.test_control import _cli
from tests.test_drift import claim

Q = "tq"


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _sql(settings: Settings, query: str, *args: Any) -> Any:
    conn = await asyncpg.connect(settings.database_url)
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


BOUNDS = ("runs_timeout_bounded", "runs_max_retries_bounded", "schedules_interval_bounded",
          "schedules_spread_bounded")
"""The bounds 010 added NOT VALID (017 redefined the schedules' two)."""


async def _stored_before_the_bounds(settings: Settings, *statements: tuple[Any, ...]) -> None:
    """Rows exactly as a version before 010 could store them: the bounds dropped, the statements
    run, then the bounds added back as the migrations add them (their definitions read back from
    the database, NOT VALID: PostgreSQL leaves the rows in place and checks every later INSERT
    and UPDATE, the quarantine's included)."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        defs = await conn.fetch("SELECT conrelid::regclass::text AS tbl, conname, pg_get_constraintdef(oid) AS def "
                                "FROM pg_constraint WHERE conname = ANY($1::text[]) ORDER BY conname", list(BOUNDS))
        assert len(defs) == len(BOUNDS) and all(d["def"].endswith("NOT VALID") for d in defs), defs
        async with conn.transaction():
            for d in defs:
                await conn.execute(f'ALTER TABLE {d["tbl"]} DROP CONSTRAINT {d["conname"]}')
            for sql, *args in statements:
                await conn.execute(sql, *args)
            for d in defs:
                await conn.execute(f'ALTER TABLE {d["tbl"]} ADD CONSTRAINT {d["conname"]} {d["def"]}')
    finally:
        await conn.close()


async def _forget(stores: Stores) -> None:
    """This test's FLUSHALL: every key under its prefix (other tests share the Redis server)."""
    keys = [k async for k in stores.redis.scan_iter(match=f"{stores.settings.prefix}:*", count=1000)]
    if keys:
        await stores.redis.unlink(*keys)


# -- the trigger -----------------------------------------------------------------------------------
async def test_a_schedule_that_cannot_fire_is_quarantined_and_the_others_fire(client: Client, stores: Stores,
                                                                             settings: Settings) -> None:
    """Issue 13 item 2: `interval inf`, `interval_s 1e-9` and a cron line that never fires (as an
    older version stored them) used to fail every trigger tick, so no schedule fired at all."""
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    sch = Schedules(client)
    await sch.add(ScheduleSpec(name="good", handler="t.noop", interval_s=60, allow_overlap=True), now=t0)
    for name in ("inf", "tiny", "feb30"):
        await sch.add(ScheduleSpec(name=name, handler="t.noop", interval_s=60), now=t0)
    # what an older version accepted, with 010's bounds added back NOT VALID after it (issue 22 item 8:
    # the quarantine's UPDATE kept the value and was refused, so every tick failed and nothing fired)
    await _stored_before_the_bounds(
        settings, ("UPDATE schedules SET interval_s = 'Infinity' WHERE name = 'inf'",),
        ("UPDATE schedules SET interval_s = 1e-9 WHERE name = 'tiny'",),
        ("UPDATE schedules SET interval_s = NULL, cron = '0 0 30 2 *' WHERE name = 'feb30'",))
    before = _metric("fencepost_quarantined_total", loop="trigger", kind="schedule")

    clock = ManualClock(t0 + timedelta(minutes=5))
    trig = Trigger(stores, clock=clock, use_lease=False)
    res = await trig.tick()
    assert res.created == 1, res  # the good schedule fired (coalesced to its latest fire)
    assert sorted(trig.quarantined) == ["feb30", "inf", "tiny"]
    rows = {r["name"]: r for r in await _sql(settings, "SELECT name, paused, quarantined FROM schedules")}
    assert not rows["good"]["paused"] and rows["good"]["quarantined"] is None
    for name in ("inf", "tiny", "feb30"):
        assert rows[name]["paused"] and rows[name]["quarantined"], rows[name]
    events = await _sql(settings, "SELECT data->>'schedule' AS name FROM events WHERE type = 'schedule_quarantined'")
    assert sorted(e["name"] for e in events) == ["feb30", "inf", "tiny"]
    assert _metric("fencepost_quarantined_total", loop="trigger", kind="schedule") == before + 3

    clock.advance(120)  # the next ticks go on firing the good one, and nothing else
    res = await trig.tick()
    assert res.created == 1 and len(trig.quarantined) == 3


async def test_a_handler_declaring_an_impossible_timeout_quarantines_its_schedule_only(
        client: Client, stores: Stores, settings: Settings) -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    sch = Schedules(client)
    await sch.add(ScheduleSpec(name="good", handler="t.noop", interval_s=60), now=t0)
    await sch.add(ScheduleSpec(name="bad", handler="t.echo", interval_s=60), now=t0)
    await _sql(settings, "UPDATE job_definitions SET timeout_s = 'Infinity' WHERE name = 't.echo'")
    trig = Trigger(stores, clock=ManualClock(t0 + timedelta(seconds=30)), use_lease=False)
    res = await trig.tick()
    assert res.created == 1 and trig.quarantined == ["bad"]
    assert (await _sql(settings, "SELECT count(*) AS n FROM runs WHERE timeout_s = 'Infinity'"))[0]["n"] == 0


# -- drift repair and the rebuild --------------------------------------------------------------------
async def _poison(settings: Settings, run_id: int) -> None:
    """Make a run what an older version let in: timeout_s = Infinity (Redis cannot hold it), with
    010's bounds added back after it as the migrations add them (NOT VALID)."""
    await _stored_before_the_bounds(settings, ("UPDATE runs SET timeout_s = 'Infinity', updated_at = now() - "
                                               "interval '1 hour' WHERE id = $1", run_id))


async def test_drift_repair_quarantines_a_run_redis_cannot_hold_and_repairs_the_rest(
        client: Client, stores: Stores, settings: Settings) -> None:
    """Issue 13 item 1: one run with timeout_s = Infinity made drift repair of its queue fail every tick."""
    ids = await client.submit_many([Submit(handler="t.noop") for _ in range(4)])
    k = stores.keys(Q)
    await stores.redis.delete(*[k.run(i) for i in ids])
    await stores.redis.zrem(k.due, *ids)
    await _poison(settings, ids[0])
    before = _metric("fencepost_quarantined_total", loop="drift", kind="run")

    drift = DriftRepair(stores, grace_s=0.0)
    done = await drift.tick(Q)
    assert sorted(d.run_id for d in done if d.kind == "missing") == ids[1:]
    for i in ids[1:]:
        assert await stores.redis.hget(k.run(i), "state") == b"PENDING"
    row = await client.get(ids[0])
    assert (row["status"], row["reason"], row["last_error_class"]) == ("CANCELLED", "quarantined", "Quarantined")
    assert "timeout" in row["last_error"]
    ev = [e for e in await client.events(ids[0]) if e["reason"] == "quarantined"]
    assert len(ev) == 1 and ev[0]["to_status"] == "CANCELLED"
    assert _metric("fencepost_quarantined_total", loop="drift", kind="run") == before + 1
    assert await drift.tick(Q) == []  # next tick: nothing left to repair, nothing raised


async def test_rebuild_isolates_runs_and_queues_and_spends_one_epoch(client: Client, stores: Stores,
                                                                     settings: Settings) -> None:
    """After a Redis loss, a poison run no longer stops its queue's rebuild (and with it every
    queue after it), and a rebuild that fails does not spend the epoch."""
    a = await client.submit_many([Submit(handler="t.noop", queue="qa") for _ in range(3)])
    b = await client.submit_many([Submit(handler="t.noop", queue="qb") for _ in range(3)])
    await _poison(settings, a[0])
    await _forget(stores)
    epochs = {r["name"]: r["epoch"] for r in await _sql(settings, "SELECT name, epoch FROM queues")}

    rebuilt = await ensure_stamped(stores)
    assert {"qa", "qb"} <= set(rebuilt)
    assert (await client.get(a[0]))["reason"] == "quarantined"
    for q, ids in (("qa", a[1:]), ("qb", b)):
        for i in ids:
            assert await stores.redis.hget(stores.keys(q).run(i), "state") == b"PENDING"
    now = {r["name"]: r["epoch"] for r in await _sql(settings, "SELECT name, epoch FROM queues")}
    assert now["qa"] == epochs["qa"] + 1 and now["qb"] == epochs["qb"] + 1


async def test_a_rebuild_failing_before_the_stamp_mark_reuses_its_epoch(client: Client, stores: Stores,
                                                                        settings: Settings,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13 item 1: each failed rebuild bumped the epoch before any work (1 -> 14 in 13 s)."""
    await client.submit_many([Submit(handler="t.noop") for _ in range(2)])
    epoch = (await _sql(settings, "SELECT epoch FROM queues WHERE name = $1", Q))[0]["epoch"]
    await stores.redis.delete(stores.keys(Q).epoch)
    async def broken(*a: Any, **kw: Any) -> Any:
        raise RuntimeError("injected: settings copy failed")

    monkeypatch.setattr(rebuild_mod.fairness, "apply", broken)
    for _ in range(5):
        with pytest.raises(RuntimeError):
            await rebuild_queue(stores, Q)
    monkeypatch.undo()
    stats = await rebuild_queue(stores, Q)
    assert stats["epoch"] == epoch + 1
    assert (await _sql(settings, "SELECT epoch FROM queues WHERE name = $1", Q))[0]["epoch"] == epoch + 1


async def test_the_last_epoch_is_a_typed_error_and_other_queues_are_rebuilt(client: Client, stores: Stores,
                                                                            settings: Settings) -> None:
    await client.submit_many([Submit(handler="t.noop", queue="qa"), Submit(handler="t.noop", queue="qb")])
    await _sql(settings, "UPDATE queues SET epoch = 8191 WHERE name = 'qa'")
    await _forget(stores)
    with pytest.raises(EpochExhausted, match="last epoch"):
        await rebuild_queue(stores, "qa")
    assert "qb" in await ensure_stamped(stores)  # qa's failure does not stop qb
    assert _metric("fencepost_queue_epoch", queue="qa") == 8191


# -- the reconciler's gauges: one unreadable queue -------------------------------------------------
async def test_one_unreadable_queue_does_not_stop_the_gauges_of_the_others(client: Client, stores: Stores) -> None:
    """The gauge pass isolates queues (DESIGN 8): a queue whose Redis keys cannot be read (here its
    rate registry holds the wrong type) is counted as a failed queue; the others still get their
    gauges, and the stuck-run detector, which runs after them and feeds the SLA alerts, still runs."""
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


# -- item 5: the unrecorded repair keeps the reason ----------------------------------------------
async def test_unrecorded_repair_keeps_the_review_reason(client: Client, stores: Stores) -> None:
    """Issue 13 item 5: a FAILED run with reason 'review' recovered by the `unrecorded` repair got
    reason NULL (repair_inspect read a hash field no script wrote) and left the review queue."""
    [rid] = await client.submit_many([Submit(handler="t.noop")])
    [(run_id, token)] = await claim(stores)
    assert run_id == rid
    await record_all(stores)
    k = stores.keys(Q)
    out = await stores.scripts.run("finish_runs", k, [3, rid, token, "review",
                                                      b"charged twice?", "SideEffectFailed", 0])
    assert out[0] == b"FAILED"
    await stores.redis.xtrim(k.events, maxlen=0)  # the stream entry is lost before the recorder saw it
    done = await DriftRepair(stores, grace_s=0.0).tick(Q)
    assert [d.kind for d in done] == ["unrecorded"]
    row = await client.get(rid)
    assert (row["status"], row["reason"]) == ("FAILED", "review")
    assert rid in [r["id"] for r in await client.review_queue()]


# -- item 6: a workflow step waiting for its upstream is not drift -------------------------------
async def test_a_blocked_workflow_step_is_not_drift(client: Client, stores: Stores, settings: Settings) -> None:
    wf = await client.submit_workflow([Node(name="a", handler="t.noop"),
                                       Node(name="b", handler="t.noop", depends_on=("a",))])
    nodes = {n["name"]: n for n in (await client.workflow(wf))["nodes"]}
    blocked = nodes["b"]["id"]
    # waiting far longer than the grace period (the step's upstream is slow)
    await _sql(settings, "UPDATE runs SET updated_at = now() - interval '1 hour' WHERE id = $1", blocked)
    drift = DriftRepair(stores, grace_s=5.0)
    found = await drift.tick(Q, repair=False)
    assert [d for d in found if d.run_id == blocked] == [], found
    await drift.tick(Q)
    assert not await stores.redis.exists(stores.keys(Q).run(blocked)), "a BLOCKED step was copied into Redis"
    # recompute after that: nothing of the workflow gets cancelled by the sweeper
    [(a_id, token)] = await claim(stores)
    assert a_id == nodes["a"]["id"]
    await stores.scripts.run("finish_runs", stores.keys(Q), [3, a_id, token, "ok",
                                                             b"\x90", "", 0])
    await record_all(stores)  # a SUCCEEDED releases b (PENDING, through the outbox: here drift moves it)
    await DriftRepair(stores, grace_s=0.0).tick(Q)
    [(b_id, token)] = await claim(stores)
    assert b_id == blocked
    await stores.scripts.run("finish_runs", stores.keys(Q), [3, b_id, token, "ok",
                                                             b"\x90", "", 0])
    await record_all(stores)
    await client.retry_workflow(wf, recompute=["a"])
    await _sql(settings, "UPDATE runs SET updated_at = now() - interval '1 hour' WHERE workflow_id = $1", wf)
    await drift.tick(Q)
    await Trigger(stores, use_lease=False).sweep()
    current = {n["name"]: n for n in (await client.workflow(wf))["nodes"]}
    assert current["a"]["status"] == "PENDING" and current["b"]["status"] == "BLOCKED", current


# -- item 5: the retry budget and the breaker counts ----------------------------------------------
async def test_workers_do_not_overwrite_the_queues_retry_budget(settings: Settings, stores: Stores) -> None:
    """Issue 13 item 5: every worker wrote its environment's budget at start; the last one won."""
    first = Worker(registry, settings=settings)
    first.stores = stores
    await first._seed_retry_budget()
    cfg = stores.keys(first.opts.queues[0]).config
    assert float(await stores.redis.hget(cfg, "budget_ratio")) == settings.retry_budget_ratio
    other = SimpleNamespace(settings=SimpleNamespace(retry_budget_ratio=0.9, retry_budget_floor=99,
                                                     retry_budget_window_ms=5),
                            opts=first.opts, stores=stores, id="w-later")
    await Worker._seed_retry_budget(other)  # type: ignore[arg-type]
    assert float(await stores.redis.hget(cfg, "budget_ratio")) == settings.retry_budget_ratio
    assert int(await stores.redis.hget(cfg, "budget_floor")) == settings.retry_budget_floor


async def test_a_failed_breaker_flush_keeps_its_counts(stores: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13 item 5: a flush that failed lost the counts it had taken out."""
    b = Breakers(stores)
    for _ in range(7):
        b.record("svc-a", False, False)
    b.record("svc-b", True, False)
    real = stores.scripts.breaker_record

    async def down(*a: Any, **kw: Any) -> Any:
        raise RedisUnavailable("injected")

    monkeypatch.setattr(stores.scripts, "breaker_record", down)
    with pytest.raises(RedisUnavailable):
        await b.flush()
    b.record("svc-a", False, False)  # recorded while Redis was away
    monkeypatch.setattr(stores.scripts, "breaker_record", real)
    await b.flush()
    assert b._counts == {}
    _state, _probe, prefix = breaker_keys(stores.settings.prefix, "svc-a")
    failures = 0
    async for key in stores.redis.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "f:*"):
        failures += int(await stores.redis.hget(key, "n") or 0)
    assert failures == 8, "the 7 failures of the failed flush and the one recorded meanwhile"


async def test_the_outbox_relay_quarantines_a_run_redis_cannot_hold(client: Client, stores: Stores,
                                                                    settings: Settings) -> None:
    """The relay moved a queue's outbox runs in batches of 1000: one run Redis cannot hold failed the
    batch every pass, so no outbox run of that queue ever reached Redis."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        async with conn.transaction():
            ids = [await client.submit("t.noop", connection=conn) for _ in range(3)]
    finally:
        await conn.close()
    await _poison(settings, ids[1])
    relay = OutboxRelay(stores)
    assert await relay.relay() == 3
    for i in (ids[0], ids[2]):
        assert await stores.redis.hget(stores.keys(Q).run(i), "state") == b"PENDING"
    assert (await client.get(ids[1]))["reason"] == "quarantined"
    assert not await stores.redis.exists(stores.keys(Q).run(ids[1]))
    assert await relay.relay() == 0


async def test_schedule_show_of_a_quarantined_schedule_says_why(client: Client, stores: Stores,
                                                                settings: Settings) -> None:
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    await Schedules(client).add(ScheduleSpec(name="inf", handler="t.noop", interval_s=60), now=t0)
    await _stored_before_the_bounds(settings, ("UPDATE schedules SET interval_s = 'Infinity' WHERE name = 'inf'",))
    await Trigger(stores, clock=ManualClock(t0 + timedelta(minutes=5)), use_lease=False).tick()
    code, out = await _cli(settings, "schedule", "show", "inf")
    assert code == 0, out
    assert "quarantined" in out and "OverflowError" in out and "next fires: none (quarantined)" in out, out


# -- issue 22 item 8: rows stored before 010's bounds, the bounds added back NOT VALID ---------------
async def _events(settings: Settings, run_id: int, type_: str) -> list[Any]:
    conn = await asyncpg.connect(settings.database_url)
    try:
        await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
        return await conn.fetch("SELECT type, reason, actor, data FROM events WHERE run_id = $1 AND type = $2",
                                run_id, type_)
    finally:
        await conn.close()


async def test_a_tiny_interval_stored_before_the_bounds_is_quarantined_and_can_be_fixed(
        client: Client, stores: Stores, settings: Settings) -> None:
    """interval_s = 1e-9 stored by an older version: trigger_tick_failed on every tick (913 of them)
    and no schedule fired. Now the one schedule is quarantined with its stored value kept (so `show`
    says what was wrong), the others fire, and `schedule update` with a valid interval brings it back."""
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    sch = Schedules(client)
    await sch.add(ScheduleSpec(name="good", handler="t.noop", interval_s=60, allow_overlap=True), now=t0)
    await sch.add(ScheduleSpec(name="tiny", handler="t.noop", interval_s=60), now=t0)
    await _stored_before_the_bounds(settings, ("UPDATE schedules SET interval_s = 1e-9 WHERE name = 'tiny'",))
    before = _metric("fencepost_quarantined_total", loop="trigger", kind="schedule")
    clock = ManualClock(t0 + timedelta(minutes=5))
    trig = Trigger(stores, clock=clock, use_lease=False)
    for _ in range(3):
        res = await trig.tick()
        assert res.created == 1, res  # the good one fires every tick; nothing raised
        clock.advance(60)
    assert trig.quarantined == ["tiny"]
    assert _metric("fencepost_quarantined_total", loop="trigger", kind="schedule") == before + 1
    [row] = await _sql(settings, "SELECT paused, quarantined, interval_s FROM schedules WHERE name = 'tiny'")
    assert row["paused"] and row["quarantined"] and row["interval_s"] == 1e-9, dict(row)
    with pytest.raises(InvalidInput, match="quarantined") as refused:  # as it is, it would fail again
        await sch.set_paused("tiny", False)
    assert refused.value.field == "name"
    from fencepost.schedules import ScheduleUpdate
    await sch.update("tiny", ScheduleUpdate(interval_s=30), now=clock.now(), reason="fixed its interval")
    [row] = await _sql(settings, "SELECT paused, quarantined, interval_s FROM schedules WHERE name = 'tiny'")
    assert (row["paused"], row["quarantined"], row["interval_s"]) == (False, None, 30)
    clock.advance(60)
    assert (await trig.tick()).created == 2


async def test_a_run_redis_cannot_hold_stops_neither_the_rebuild_nor_new_submits(
        client: Client, stores: Stores, settings: Settings) -> None:
    """A PENDING run with timeout_s = 'Infinity' (stored before 010): after its queue's Redis keys were
    lost the rebuild failed for ever, the queue stayed unstamped and new submits were acknowledged
    and never ran."""
    ids = await client.submit_many([Submit(handler="t.noop") for _ in range(3)])
    await _poison(settings, ids[0])
    await _forget(stores)
    assert Q in await ensure_stamped(stores)
    assert Q not in await rebuild_mod.untrusted_queues(stores), "the queue is stamped"
    assert (await client.get(ids[0]))["reason"] == "quarantined"
    [ev] = await _events(settings, ids[0], "cancelled")
    assert ev["reason"] == "quarantined" and ev["data"]["stored"]["timeout_s"] == "Infinity", dict(ev)
    assert ev["data"]["loop"] == "rebuild"
    fresh = await client.submit("t.noop")  # a new submit is claimable
    assert await stores.redis.hget(stores.keys(Q).run(fresh), "state") == b"PENDING"
    assert await stores.redis.zscore(stores.keys(Q).due, fresh) is not None


async def test_cancel_of_a_run_redis_cannot_hold_is_done_in_postgresql_and_other_commands_say_why(
        client: Client, stores: Stores, settings: Settings) -> None:
    """`fencepost cancel ID` of a PENDING run with timeout_s = 'Infinity' whose Redis copy is gone
    (no reconciler has passed yet) printed an OverflowError traceback: the command put PostgreSQL's
    copy back into Redis first, which cannot hold it."""
    ids = await client.submit_many([Submit(handler="t.noop") for _ in range(3)])
    for rid in ids[:2]:
        await _poison(settings, rid)
        await stores.redis.delete(stores.keys(Q).run(rid))
        await stores.redis.zrem(stores.keys(Q).due, rid)
    code, out = await _cli(settings, "cancel", str(ids[0]), "--reason", "stored before 010")
    assert code == 0 and "Traceback" not in out, out
    row = await client.get(ids[0])
    assert row["status"] == "CANCELLED" and row["timeout_s"] == 2592000, row
    [ev] = await _events(settings, ids[0], "cancelled")
    assert ev["reason"] == "stored before 010" and ev["actor"] and ev["data"]["stored"]["timeout_s"] == "Infinity"
    code, out = await _cli(settings, "pause", str(ids[1]))
    assert code != 0 and "Traceback" not in out and len(out.strip().splitlines()) == 1, out
    assert "cannot hold" in out and (await client.get(ids[1]))["status"] == "PENDING"
    code, out = await _cli(settings, "pause", str(ids[2]))  # the queue's other runs are unaffected
    assert code == 0, out


async def test_a_run_with_max_retries_stored_before_the_bounds_is_recorded(
        client: Client, stores: Stores, settings: Settings) -> None:
    """max_retries = 2147483647 (stored before 010, in PostgreSQL and in Redis): the run executed, its
    events went to the poison stream, PostgreSQL kept it PENDING with no attempt row and
    `reconcile --check` reported it unrecorded for good. Now the recorder quarantines the value
    (put back inside the bounds, the stored one kept in an event), records the history and carries on."""
    from fencepost.testing import Harness
    from tests.test_drift import reconcile

    ids = await client.submit_many([Submit(handler="t.noop") for _ in range(3)])
    await _stored_before_the_bounds(settings, ("UPDATE runs SET max_retries = 2147483647 WHERE id = $1", ids[1]))
    await stores.redis.hset(stores.keys(Q).run(ids[1]), "max_retries", 2147483647)
    before = _metric("fencepost_quarantined_total", loop="recorder", kind="run_value")
    await Harness(settings, registry, client).drain(timeout=30)
    for i in ids:
        row = await client.get(i)
        assert row["status"] == "SUCCEEDED", row
        assert len(await client.attempts(i)) == 1, await client.attempts(i)
    assert await stores.redis.xlen(f"{settings.prefix}:recorder:poison") == 0
    [ev] = await _events(settings, ids[1], "quarantined")
    assert ev["data"]["stored"]["max_retries"] == 2147483647 and ev["data"]["loop"] == "recorder"
    assert (await client.get(ids[1]))["max_retries"] == 10000
    assert _metric("fencepost_quarantined_total", loop="recorder", kind="run_value") == before + 1
    check = reconcile(settings, "--check", "--grace", "0")
    assert check.returncode == 0, check.stdout + check.stderr


# -- issue 22 item 11: a transition recorded twice (from the stream and by the rebuild) -------------
async def test_a_transition_still_in_the_stream_is_recorded_once_when_a_rebuild_sees_it_first(
        client: Client, stores: Stores, settings: Settings) -> None:
    """The rebuild took every run finished in Redis and not yet in PostgreSQL for `unrecorded` and
    wrote it, without looking whether the stream still held its entry (drift's own pass does): the
    recorder then recorded the same transition again."""
    from fencepost.worker.runtime import WorkerOptions

    [rid] = await client.submit_many([Submit(handler="t.noop")])
    await Worker(registry, WorkerOptions(queues=[Q], concurrency=1, burst=True), settings=settings).run()
    k = stores.keys(Q)
    assert await stores.redis.hget(k.run(rid), "state") == b"SUCCEEDED"
    assert (await client.get(rid))["status"] == "PENDING", "the recorder has not seen the stream yet"
    await stores.redis.delete(k.epoch)  # the stamp is gone (a restart, a promoted replica): a rebuild
    await rebuild_queue(stores, Q)
    await record_all(stores)
    assert (await client.get(rid))["status"] == "SUCCEEDED"
    repaired = await _sql(settings, "SELECT reason FROM events WHERE run_id = $1 AND type = 'drift_repaired'", rid)
    assert repaired == [], "the transition was recorded by the rebuild and again from the stream"
    done = await _sql(settings, "SELECT count(*) AS n FROM events WHERE run_id = $1 AND to_status = 'SUCCEEDED'",
                      rid)
    attempts = await _sql(settings, "SELECT outcome FROM attempts WHERE run_id = $1", rid)
    assert [a["outcome"] for a in attempts] == ["succeeded"]
    assert done[0]["n"] <= 1


async def test_a_lost_lease_of_a_run_stored_outside_the_bounds_is_interrupted(
        client: Client, stores: Stores, settings: Settings) -> None:
    """A RUNNING run with max_retries = 2147483647 (stored before 010) whose Redis copy is lost:
    drift's interrupt (an UPDATE of its row) was refused, so the queue's lost leases were never
    repaired. Now its values are put back inside the bounds first and it is re-queued."""
    ids = await client.submit_many([Submit(handler="t.noop") for _ in range(2)])
    claimed = dict(await claim(stores, 2))
    assert sorted(claimed) == sorted(ids)
    await record_all(stores)
    await _stored_before_the_bounds(settings, ("UPDATE runs SET max_retries = 2147483647, updated_at = now() - "
                                               "interval '1 hour' WHERE id = $1", ids[0]))
    k = stores.keys(Q)
    for rid in ids:
        await stores.redis.delete(k.run(rid))
        await stores.redis.zrem(k.active, rid)
    done = await DriftRepair(stores, grace_s=0.0).tick(Q)
    assert sorted(d.run_id for d in done if d.kind == "lost_lease") == sorted(ids)
    for rid in ids:
        assert (await client.get(rid))["status"] == "PENDING"
        assert await stores.redis.hget(k.run(rid), "state") == b"PENDING"
    [ev] = await _events(settings, ids[0], "quarantined")
    assert ev["data"]["stored"]["max_retries"] == 2147483647 and ev["data"]["loop"] == "drift"
    assert (await client.get(ids[0]))["max_retries"] == 10000
