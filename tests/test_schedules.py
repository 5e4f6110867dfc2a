"""Recurring schedules and the trigger service: DST, intervals, spread, coalesce/catchup,
overlap, racing leaders, leader takeover (injectable clock: nothing sleeps to decide a fire)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from fencepost.client import Client
from fencepost.core.schedules import InvalidCron, InvalidTimezone, ScheduleSpec, next_fires, spread_offset_ms, zone
from fencepost.schedules import Schedules
from fencepost.trigger import ManualClock, Trigger
from tests.conftest import ROOT, spawn, stop, wait_until, worker_env

UTC = UTC
T0 = datetime(2030, 1, 7, 12, 0, 0, tzinfo=UTC)


async def _runs(client: Client, name: str) -> list[asyncpg.Record]:
    return await client.stores.db.pool.fetch(  # type: ignore[union-attr]
        "SELECT r.id, r.fire_time, r.run_at, r.status FROM runs r JOIN schedules s ON s.id = r.schedule_id "
        "WHERE s.name = $1 ORDER BY r.fire_time", name)


async def _add(client: Client, clock: ManualClock, **kw: object) -> dict:
    kw.setdefault("handler", "t.noop")
    return await Schedules(client).add(ScheduleSpec(**kw), now=clock.now())  # type: ignore[arg-type]


def _local(ts: list[datetime], tz: str) -> list[str]:
    return [t.astimezone(zone(tz)).strftime("%Y-%m-%d %H:%M %z") for t in ts]


# -- pure time arithmetic ------------------------------------------------------------------------
@pytest.mark.parametrize("tz,spring,fall,expect_spring,expect_fall", [
    ("Europe/Paris", datetime(2030, 3, 30, tzinfo=UTC), datetime(2030, 10, 26, tzinfo=UTC),
     ["2030-03-30 02:30 +0100", "2030-03-31 03:00 +0200", "2030-04-01 02:30 +0200"],
     ["2030-10-26 02:30 +0200", "2030-10-27 02:30 +0200", "2030-10-28 02:30 +0100"]),
    ("America/New_York", datetime(2030, 3, 9, tzinfo=UTC), datetime(2030, 11, 2, tzinfo=UTC),
     ["2030-03-09 02:30 -0500", "2030-03-10 03:00 -0400", "2030-03-11 02:30 -0400"],
     ["2030-11-02 02:30 -0400", "2030-11-03 02:30 -0500", "2030-11-04 02:30 -0500"]),
])
def test_daily_0230_fires_once_on_both_dst_days(tz, spring, fall, expect_spring, expect_fall) -> None:
    # Spring forward: 02:30 does not exist; it fires once, when the clocks jump (03:00).
    assert _local(next_fires(spring, 3, cron="30 2 * * *", tz=tz), tz) == expect_spring
    # Fall back: Paris repeats 02:00-03:00, so 02:30 fires once, at its first occurrence (+0200);
    # New York repeats 01:00-02:00, so 02:30 is unambiguous there.
    assert _local(next_fires(fall, 3, cron="30 2 * * *", tz=tz), tz) == expect_fall


def test_repeated_hour_fires_once_and_skipped_hour_collapses() -> None:
    tz = "America/New_York"
    fall = _local(next_fires(datetime(2030, 11, 3, 4, 0, tzinfo=UTC), 4, cron="30 * * * *", tz=tz), tz)
    assert fall == ["2030-11-03 00:30 -0400", "2030-11-03 01:30 -0400", "2030-11-03 02:30 -0500",
                    "2030-11-03 03:30 -0500"], "01:30 fires once, at its first occurrence"
    spring = _local(next_fires(datetime(2030, 3, 30, 12, 0, tzinfo=UTC), 3, cron="*/20 2 * * *",
                               tz="Europe/Paris"), "Europe/Paris")
    assert spring == ["2030-03-31 03:00 +0200", "2030-04-01 02:00 +0200", "2030-04-01 02:20 +0200"], \
        "02:00/02:20/02:40 do not exist on the spring-forward day: they collapse into one fire at 03:00"


def test_bad_cron_or_timezone_is_typed_and_stores_nothing_pure() -> None:
    with pytest.raises(InvalidCron):
        next_fires(T0, 1, cron="61 * * * *")
    with pytest.raises(InvalidCron):
        next_fires(T0, 1, cron="* * *")
    with pytest.raises(InvalidTimezone):
        next_fires(T0, 1, cron="0 * * * *", tz="Mars/Olympus")


def test_spread_offset_is_stable_and_in_range() -> None:
    offs = [spread_offset_ms(i, 60) for i in range(1, 5001)]
    assert offs == [spread_offset_ms(i, 60) for i in range(1, 5001)]
    assert min(offs) >= 0 and max(offs) < 60_000
    assert len({o // 1000 for o in offs}) == 60, "5,000 schedules cover every second of the minute"
    assert spread_offset_ms(7, 0) == 0


# -- store ---------------------------------------------------------------------------------------
async def test_add_rejects_bad_input_and_stores_nothing(client: Client) -> None:
    store = Schedules(client)
    for spec, err in [(ScheduleSpec(name="a", handler="t.noop", cron="0 25 * * *"), InvalidCron),
                      (ScheduleSpec(name="a", handler="t.noop", cron="0 * * * *", timezone="Europe/Pariss"),
                       InvalidTimezone),
                      (ScheduleSpec(name="a", handler="nope", cron="0 * * * *"), Exception)]:
        with pytest.raises(err):
            await store.add(spec)
    assert await store.list() == []


# -- trigger -------------------------------------------------------------------------------------
async def test_interval_schedule_fires_on_its_grid_with_logical_fire_time(client: Client) -> None:
    clock = ManualClock(T0)
    s = await _add(client, clock, name="iv", interval_s=30, allow_overlap=True, spread_s=10)
    assert 0 <= s["offset_ms"] < 10_000
    trig = Trigger(client.stores, clock=clock, lookahead_s=0, use_lease=False)
    assert (await trig.tick()).created == 0, "not due before its offset"
    for _ in range(8):
        clock.advance(15)
        await trig.tick()
    runs = await _runs(client, "iv")
    assert [r["fire_time"] for r in runs] == [T0 + timedelta(seconds=30 * k) for k in range(4)]
    assert all(r["run_at"] - r["fire_time"] == timedelta(milliseconds=s["offset_ms"]) for r in runs)


async def test_racing_leaders_create_each_fire_once(client: Client) -> None:
    clock = ManualClock(T0)
    for i in range(40):
        await _add(client, clock, name=f"race{i}", interval_s=60, allow_overlap=True)
    a = Trigger(client.stores, clock=clock, use_lease=False, batch=7, holder="a")
    b = Trigger(client.stores, clock=clock, use_lease=False, batch=5, holder="b")
    for _ in range(5):
        await asyncio.gather(a.tick(), b.tick(), a.tick(), b.tick())
        clock.advance(60)
    pool = client.stores.db.pool
    assert await pool.fetchval("SELECT count(*) FROM runs") == 40 * 5
    assert await pool.fetchval("SELECT count(DISTINCT (schedule_id, fire_time)) FROM runs") == 40 * 5
    # A leader working from a stale read (it read next_fire_time before the other committed):
    # the same fires again are no-ops thanks to UNIQUE (schedule_id, fire_time).
    await pool.execute("UPDATE schedules SET next_fire_time = next_fire_time - interval '60 seconds', "
                       "due_at = due_at - interval '60 seconds'")
    clock.advance(-60)  # back to the time of the last round
    stale = await Trigger(client.stores, clock=clock, use_lease=False).tick()
    assert stale.created == 0 and stale.duplicates == 40
    assert await pool.fetchval("SELECT count(*) FROM runs") == 40 * 5
    assert await pool.fetchval("SELECT count(*) FROM history WHERE type = 'submitted'") == 40 * 5


async def test_one_leader_and_a_new_leader_resumes_from_next_fire_time(client: Client) -> None:
    clock = ManualClock(T0)
    await _add(client, clock, name="lead", interval_s=10, allow_overlap=True)
    a = Trigger(client.stores, clock=clock, holder="a", lease_s=30)
    b = Trigger(client.stores, clock=clock, holder="b", lease_s=30)
    assert await a.acquire() and not await b.acquire(), "one leader at a time"
    for _ in range(3):
        assert await a.acquire()  # renewed on every pass
        await a.tick()
        clock.advance(10)
    # a dies without releasing its lease; b takes over once the lease expired.
    nft = (await Schedules(client).get("lead"))["next_fire_time"]
    assert nft == T0 + timedelta(seconds=30)
    clock.advance(5)
    assert not await b.acquire()
    clock.advance(30)
    assert await b.acquire() and b.lease_token == a.lease_token + 1
    r = await b.tick()
    assert r.created == 1 and r.coalesced == 3, "the 4 fires missed during the takeover coalesce into one"
    fires = [x["fire_time"] for x in await _runs(client, "lead")]
    assert fires == [T0, T0 + timedelta(seconds=10), T0 + timedelta(seconds=20), T0 + timedelta(seconds=60)]
    assert not await a.acquire(), "the old leader cannot take the lease back while b holds it"


async def test_downtime_coalesces_by_default_and_catchup_backfills_within_window(client: Client) -> None:
    clock = ManualClock(T0)
    await _add(client, clock, name="co", cron="* * * * *", allow_overlap=True)
    await _add(client, clock, name="cu", cron="* * * * *", allow_overlap=True, catchup=True, catchup_window_s=300)
    trig = Trigger(client.stores, clock=clock, lookahead_s=0, use_lease=False)
    clock.advance(60)
    await trig.tick()  # a minute late: "co" coalesces T0 and T0+1m into T0+1m, "cu" fires both
    clock.advance(10 * 60 + 5)  # ten minutes of downtime
    await trig.tick()
    co = [r["fire_time"] for r in await _runs(client, "co")]
    cu = [r["fire_time"] for r in await _runs(client, "cu")]
    m = lambda k: T0 + timedelta(minutes=k)
    assert co == [m(1), m(11)], "missed fires coalesced into one, at the latest missed fire time"
    assert cu == [m(0), m(1), m(7), m(8), m(9), m(10), m(11)], "backfilled, bounded by the 5-minute window"
    evs = await client.stores.db.pool.fetch("SELECT run_id, queue, data FROM events WHERE type = 'fires_coalesced' "
                                            "ORDER BY id")
    assert [json.loads(e["data"])["missed"] for e in evs] == [1, 9]
    assert all(e["run_id"] is None and e["queue"] == "tq" for e in evs)
    assert (await Schedules(client).get("co"))["next_fire_time"] == m(12)


async def test_overlap_skipped_by_default_and_allowed_when_asked(client: Client) -> None:
    clock = ManualClock(T0)
    await _add(client, clock, name="skip", interval_s=60)
    await _add(client, clock, name="both", interval_s=60, allow_overlap=True)
    trig = Trigger(client.stores, clock=clock, lookahead_s=0, use_lease=False)
    await trig.tick()
    clock.advance(60)
    await trig.tick()  # the first runs are still PENDING (no worker)
    assert len(await _runs(client, "skip")) == 1
    assert len(await _runs(client, "both")) == 2
    pool = client.stores.db.pool
    ev = await pool.fetchrow("SELECT run_id, queue, reason, data FROM events WHERE type = 'fire_skipped'")
    first = (await _runs(client, "skip"))[0]
    assert ev["run_id"] is None and ev["reason"] == "overlap" and json.loads(ev["data"])["blocking_run"] == first["id"]
    assert (await Schedules(client).get("skip"))["skipped"] == 1
    # Once the previous run is over, the schedule fires again.
    await pool.execute("UPDATE runs SET status = 'CANCELLED', finished_at = now() WHERE id = $1", first["id"])
    clock.advance(60)
    await trig.tick()
    assert [r["fire_time"] for r in await _runs(client, "skip")] == [T0, T0 + timedelta(seconds=120)]


@pytest.mark.parametrize("tz,day", [("Europe/Paris", datetime(2030, 3, 30, tzinfo=UTC)),
                                    ("Europe/Paris", datetime(2030, 10, 26, tzinfo=UTC)),
                                    ("America/New_York", datetime(2030, 3, 9, tzinfo=UTC)),
                                    ("America/New_York", datetime(2030, 11, 2, tzinfo=UTC))])
async def test_trigger_fires_daily_0230_once_per_day_across_dst(client: Client, tz: str, day: datetime) -> None:
    clock = ManualClock(day)
    await _add(client, clock, name="d", cron="30 2 * * *", timezone=tz, allow_overlap=True)
    trig = Trigger(client.stores, clock=clock, lookahead_s=0, use_lease=False)
    for _ in range(3 * 24 * 2):  # three days in 30-minute ticks
        clock.advance(1800)
        await trig.tick()
    fires = [r["fire_time"].astimezone(zone(tz)) for r in await _runs(client, "d")]
    assert [f.date() for f in fires] == [(day + timedelta(days=k)).date() for k in range(3)]
    assert all((f.hour, f.minute) in ((2, 30), (3, 0)) for f in fires)


async def test_paused_schedule_does_not_fire_and_resume_coalesces(client: Client) -> None:
    clock = ManualClock(T0)
    await _add(client, clock, name="p", interval_s=60, allow_overlap=True)
    store = Schedules(client)
    await store.set_paused("p", True)
    trig = Trigger(client.stores, clock=clock, lookahead_s=0, use_lease=False)
    clock.advance(600)
    assert (await trig.tick()).schedules == 0
    await store.set_paused("p", False)
    await trig.tick()
    assert [r["fire_time"] for r in await _runs(client, "p")] == [T0 + timedelta(seconds=600)]


# -- real processes ------------------------------------------------------------------------------
@pytest.mark.slow
async def test_killed_trigger_process_standby_takes_over_and_job_sees_fire_time(client, settings, tmp_path) -> None:
    from fencepost.dev.loadtest import registry as lt_registry

    await client.register(lt_registry)
    await Schedules(client).add(ScheduleSpec(name="sec", handler="loadtest.fire_time", interval_s=1, exact=True,
                                             queue="ltq"))
    wk = spawn(settings, "worker", "--app", "fencepost.dev.loadtest:registry", "--queue", "ltq", "--processes", "1",
               log=tmp_path / "w.log")
    rec = spawn(settings, "reconciler", log=tmp_path / "r.log")
    t1 = spawn(settings, "trigger", "--lease", "1.5", "--tick", "0.05", log=tmp_path / "t1.log")
    t2 = None
    pool = client.stores.db.pool
    try:
        await wait_until(lambda: pool.fetchval("SELECT count(*) FROM runs WHERE status = 'SUCCEEDED'"),
                         timeout=30, what="a scheduled run to succeed")
        t2 = spawn(settings, "trigger", "--lease", "1.5", "--tick", "0.05", log=tmp_path / "t2.log")
        await asyncio.sleep(0.5)
        holder = await pool.fetchval("SELECT holder FROM trigger_leases")
        t1.send_signal(signal.SIGKILL)
        t1.wait(10)
        before = await pool.fetchval("SELECT count(*) FROM runs")
        nft = await pool.fetchval("SELECT next_fire_time FROM schedules")
        await wait_until(lambda: _newer(pool, nft), timeout=20, what="the standby to fire after the leader died")
        assert await pool.fetchval("SELECT holder FROM trigger_leases") != holder
        assert await pool.fetchval("SELECT count(*) FROM runs") > before
        fires = [r["fire_time"] for r in await pool.fetch("SELECT fire_time FROM runs ORDER BY fire_time")]
        assert len(fires) == len(set(fires))
        assert all((f - fires[0]).total_seconds() % 1 == 0 for f in fires), "every fire is on the 1 s grid"
        # the handler received its logical fire time
        row = await wait_until(lambda: pool.fetchrow(
            "SELECT fire_time, result FROM runs WHERE status = 'SUCCEEDED' ORDER BY id LIMIT 1"), timeout=10)
        from fencepost.core.models import decode_result

        assert decode_result(row["result"]) == int(row["fire_time"].timestamp() * 1000)
    finally:
        stop((t1, t2, rec, wk), timeout=15)


async def _newer(pool: asyncpg.Pool, nft: datetime) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM runs WHERE fire_time >= $1", nft))


@pytest.mark.slow
def test_cli_add_ls_next_and_bad_cron(settings, client) -> None:
    env = worker_env(settings)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)

    bad = cli("schedule", "add", "x", "--cron", "0 0 31 2 * *", "--handler", "t.noop")
    assert bad.returncode == 1 and bad.stderr.startswith("error: invalid cron"), bad.stderr
    badtz = cli("schedule", "add", "x", "--cron", "0 * * * *", "--tz", "Nowhere/Land", "--handler", "t.noop")
    assert badtz.returncode == 1 and "unknown timezone" in badtz.stderr
    assert "(none)" in cli("schedule", "ls").stdout, "nothing stored"
    ok = cli("schedule", "add", "hourly", "--cron", "0 * * * *", "--tz", "Europe/Paris", "--handler", "t.echo",
             "--args", '["hi"]', "--spread", "60")
    assert ok.returncode == 0 and "next fire" in ok.stdout, ok.stderr
    assert "hourly" in cli("schedule", "ls").stdout
    nxt = cli("schedule", "next", "hourly", "3").stdout.strip().splitlines()
    assert len(nxt) == 3 and all(":00:00+0" in line for line in nxt)
    line = cli("schedule", "next", "30 2 * * *", "2", "--tz", "America/New_York").stdout
    assert "02:30:00-0" in line
    assert cli("schedule", "pause", "hourly").returncode == 0
    assert cli("schedule", "rm", "hourly").returncode == 0
    assert cli("schedule", "rm", "hourly").returncode == 1
