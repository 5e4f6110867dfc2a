"""One clock (DESIGN invariant 11, docs/clock.md): leases, due times, delayed-run promotion,
retry times and reaping are decided on the Redis server's clock inside the scripts. A worker
process whose host clock is skewed (libfaketime, Debian's `faketime`) by +-30 s or +-10 min runs
beside a normal worker, both claiming and reaping: it neither reaps its peer's live runs, nor
starts delayed runs early, nor loses its own leases, and no run fails without a handler error.

Issue 22 item 1 measured, on the code before: at +30 s the skewed reaper interrupted the other
worker's attempts and delayed runs started 20 s early; at -30 s its own leases were expired
when taken, and runs went FAILED retries_exhausted with no handler error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from tests.conftest import log_tail, spawn, stop, wait_until

APP = "tests.apps:registry"
WORKER = ("worker", "--app", APP, "--queue", "tq", "--concurrency", "3")  # 6 busy runs: each worker takes some
LIBFAKETIME = next((p for p in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                                "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
                                "/usr/lib/faketime/libfaketime.so.1") if Path(p).exists()), None)
LEASE_MS = "3000"
"""Short, so a lease taken on a skewed clock would be past (or far ahead) within the test."""
DELAY_S = 4.0


def faketime_env(offset: str) -> dict[str, str]:
    """The environment that runs a process under libfaketime at `offset` ('+30s', '-10m')."""
    assert LIBFAKETIME is not None
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": offset, "FAKETIME_NO_CACHE": "1"}


async def _server_ms(stores: Stores) -> int:
    sec, usec = await stores.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


async def _events(stores: Stores) -> list[dict[str, str]]:
    return [{k.decode(): v.decode(errors="replace") for k, v in f.items()}
            for _, f in await stores.redis.xrange(stores.keys("tq").events)]


@pytest.mark.skipif(LIBFAKETIME is None or shutil.which("faketime") is None,
                    reason="faketime (Debian package faketime) is not installed")
@pytest.mark.parametrize("offset", ["+30s", "-30s", "+10m", "-10m"])
async def test_a_worker_with_a_skewed_clock_neither_reaps_peers_nor_starts_delayed_runs_early_nor_loses_leases(
        client: Client, settings: Settings, stores: Stores, tmp_path: Path, offset: str) -> None:
    # runs long enough to be renewed twice under a 3 s lease, none may be retried (max_retries=0)
    busy = [await client.submit("t.sleep", 4.0, max_retries=0) for _ in range(6)]
    submitted_at = await _server_ms(stores)
    delayed = [await client.submit("t.sleep", 0.0, delay=DELAY_S, max_retries=0) for _ in range(3)]
    log_normal, log_skewed = tmp_path / "normal.log", tmp_path / "skewed.log"
    normal = spawn(settings, *WORKER, log=log_normal, FENCEPOST_LEASE_MS=LEASE_MS)
    skewed = spawn(settings, *WORKER, log=log_skewed, FENCEPOST_LEASE_MS=LEASE_MS, **faketime_env(offset))
    try:
        async def all_done() -> bool:
            states = [await stores.redis.hget(stores.keys("tq").run(r), "state") for r in busy + delayed]
            return all(s in (b"SUCCEEDED", b"FAILED") for s in states)

        try:
            await wait_until(all_done, timeout=40, what="every run to finish")
        except AssertionError:
            raise AssertionError(f"normal:\n{log_tail(log_normal)}\nskewed:\n{log_tail(log_skewed)}") from None
    finally:
        stop([normal, skewed])
    events = await _events(stores)
    claimed = [e for e in events if e["type"] == "claimed"]
    workers = {e["worker"] for e in claimed}
    assert len(workers) == 2, f"both workers claimed runs ({workers}): the test must exercise the skewed one"
    expired = [e for e in events if e["type"] == "lease_expired"]
    assert expired == [], f"{len(expired)} live leases were reaped: {expired[:3]}"
    for r in busy + delayed:
        h = await stores.redis.hgetall(stores.keys("tq").run(r))
        assert (h[b"state"], h[b"attempt"]) == (b"SUCCEEDED", b"1"), (r, h)
    for e in claimed:
        if int(e["run"]) in delayed:
            early = submitted_at + DELAY_S * 1000 - int(e["ts"])
            assert early <= 0, f"delayed run {e['run']} started {early} ms early (by {e['worker']})"


async def test_two_workers_starting_on_a_busy_queue_report_no_lost_lease_for_runs_that_finished(
        client: Client, settings: Settings, stores: Stores, tmp_path: Path) -> None:
    """Issue 22 item 11: 13-60 "lost lease ... abandoning it" warnings about 2 s after two workers
    started on a busy queue, with no duplicate execution: a heartbeat renewing a run whose finish
    was applied while the renewal was on its way got "lost" for it and warned. A run that finished
    meanwhile has not lost its lease; only a run another attempt owns has."""
    from fencepost.client import Submit

    ids = await client.submit_many([Submit(handler="t.sleep", args=(0.1 + (i % 5) / 10,)) for i in range(1500)])
    logs = [tmp_path / "w1.log", tmp_path / "w2.log"]
    procs = [spawn(settings, "worker", "--app", APP, "--queue", "tq", log=log) for log in logs]
    try:
        async def drained() -> bool:
            return await stores.redis.zcard(stores.keys("tq").active) == 0 and \
                await stores.redis.zcard(stores.keys("tq").due) == 0

        await wait_until(drained, timeout=60, what="the queue to drain")
    finally:
        stop(procs)
    lost = [ln for log in logs for ln in log.read_text().splitlines() if '"lease_lost"' in ln]
    expired = [e for e in await _events(stores) if e["type"] == "lease_expired"]
    states = {await stores.redis.hget(stores.keys("tq").run(r), "state") for r in ids[:50]}
    assert states == {b"SUCCEEDED"}
    assert (len(lost), len(expired)) == (0, 0), lost[:3]


@pytest.mark.skipif(LIBFAKETIME is None or shutil.which("faketime") is None,
                    reason="faketime (Debian package faketime) is not installed")
@pytest.mark.parametrize("offset", ["+10m", "-10m"])
async def test_a_trigger_with_a_skewed_clock_fires_neither_early_nor_late(
        client: Client, settings: Settings, tmp_path: Path, offset: str) -> None:
    """The trigger decides fires on PostgreSQL's clock: a trigger host 10 min ahead created the
    fire 10 min ahead of its time (one coalesced fire at its own now), 10 min behind it fired
    nothing for 10 min. Each run is created within the lookahead before its fire time and a
    moment after it (created_at is PostgreSQL's clock)."""
    from fencepost.core.schedules import ScheduleSpec
    from fencepost.schedules import Schedules

    await Schedules(client).add(ScheduleSpec(name="skew", handler="t.noop", interval_s=1, exact=True, allow_overlap=True))
    log = tmp_path / "trigger.log"
    trig = spawn(settings, "trigger", "--tick", "0.05", log=log, **faketime_env(offset))
    pool = client.stores.db.pool
    assert pool is not None
    try:
        await wait_until(lambda: pool.fetchval("SELECT count(*) >= 3 FROM runs WHERE schedule_id IS NOT NULL"),
                         timeout=30, what=f"three fires\n{log_tail(log)}")
    finally:
        stop([trig])
    rows = await pool.fetch("SELECT fire_time, created_at FROM runs WHERE schedule_id IS NOT NULL ORDER BY fire_time")
    for r in rows:
        ahead = (r["fire_time"] - r["created_at"]).total_seconds()
        assert -3.0 < ahead <= 1.0, f"fire {r['fire_time']} created {ahead:+.1f} s before it (trigger at {offset})"


_PRODUCER = """
import asyncio
from fencepost.client import Client

async def main():
    c = await Client().connect()
    print(await c.submit("t.noop", delay={delay}))
    await c.close()

asyncio.run(main())
"""


@pytest.mark.skipif(LIBFAKETIME is None or shutil.which("faketime") is None,
                    reason="faketime (Debian package faketime) is not installed")
@pytest.mark.parametrize("offset", ["+10m", "-10m"])
async def test_a_delayed_run_rebuilt_after_redis_lost_it_is_due_on_the_servers_clock(
        client: Client, settings: Settings, stores: Stores, offset: str) -> None:
    """runs.run_at of a delayed submit was the producer's clock + the delay: Redis made the run due on
    its own clock, but once Redis lost the run, the rebuild enqueued PostgreSQL's run_at, 10 min late
    (producer ahead) or due at once, 10 min early (behind). The producer now counts relative times from
    the Redis server's clock (PostgreSQL's when Redis cannot be read)."""
    import subprocess
    import sys

    from fencepost.reconciler.rebuild import ensure_stamped
    from tests.conftest import ROOT, worker_env

    before = await _server_ms(stores)
    delay_s = 120  # long beside this loaded machine's process start-ups: nothing waits for it
    out = subprocess.run([sys.executable, "-c", _PRODUCER.format(delay=delay_s)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env=worker_env(settings, **faketime_env(offset)))
    assert out.returncode == 0, out.stderr[-2000:]
    rid = int(out.stdout.split()[-1])
    after = await _server_ms(stores)
    keys = [k async for k in stores.redis.scan_iter(match=f"{settings.prefix}:*", count=1000)]
    await stores.redis.delete(*keys)  # the dataset is lost (a FLUSHALL of this test's keys)
    assert await ensure_stamped(stores) == ["tq"]
    k = stores.keys("tq")
    due = int(float(await stores.redis.hget(k.run(rid), "run_at")))
    assert await stores.redis.zscore(k.delayed, rid) is not None, f"due at once: {before + delay_s * 1000 - due} ms early"
    assert before + delay_s * 1000 - 50 <= due <= after + delay_s * 1000, (
        f"due {due - before - delay_s * 1000:+d} ms off the server's clock + the delay (producer at {offset})")
