"""`fencepost loadtest chaos`: every check is able to fail (a seeded known violation planted in a
test double ledger/history is reported, and nothing else is), and a short seeded soak on private
stores with every fault kind this machine supports, through the real CLI, gives its verdict."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import msgspec
import pytest

from fencepost.core.config import Settings
from fencepost.dev import chaos_check as cc
from fencepost.dev.chaos import FAULTS, ChaosReport, format_chaos
from fencepost.dev.faults import TcpProxy
from tests.chaos_doubles import clean, pick, second_execution
from tests.conftest import ROOT, worker_env


def failing(verdicts: list[cc.Verdict]) -> dict[str, int]:
    return {v.check: v.violations for v in verdicts if v.violations}


def test_a_clean_history_passes_every_check() -> None:
    ledger, history = clean()
    verdicts = cc.check(ledger, history)
    assert [v.check for v in verdicts] == list(cc.CHECKS)
    assert failing(verdicts) == {}


def test_a_reexecution_recorded_as_such_passes() -> None:
    ledger, history = clean()
    second_execution(ledger, history, pick(ledger, 1), start_after_ms=50)
    assert failing(cc.check(ledger, history)) == {}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_overlapping_executions_beyond_the_window_are_reported(seed: int) -> None:
    ledger, history = clean(seed)
    e = pick(ledger, seed)
    b = second_execution(ledger, history, e, start_after_ms=-50)  # started 50 ms before e.last_ms
    assert failing(cc.check(ledger, history, overlap_window_ms=0)) == {"overlapping_executions": 1}
    v = next(v for v in cc.check(ledger, history, overlap_window_ms=500) if v.check == "overlapping_executions")
    assert v.violations == 0 and "1 overlaps within the 500 ms window" in v.note
    assert f"run {b.run_id}" in cc.check(ledger, history)[2].examples[0]


def test_a_stale_finish_fencepost_accepted_is_reported() -> None:
    ledger, history = clean()
    e = pick(ledger, 4)
    second_execution(ledger, history, e, start_after_ms=50)
    # attempt 1's finish applied after attempt 2's claim (version 6 > 4): Fencepost's own history says so
    history.events.append(cc.EventRow(id=10_003, run_id=e.run_id, type="succeeded", version=6, attempt=1,
                                      token=e.token, to_status="SUCCEEDED"))
    history.attempts[:] = [msgspec.structs.replace(a, outcome="succeeded") if (a.run_id, a.attempt) == (e.run_id, 1)
                           else a for a in history.attempts]
    got = failing(cc.check(ledger, history))
    assert got == {"stale_finishes_accepted": 3}  # the late event, two successes, a success before a later claim


def test_a_stale_finish_is_seen_in_attempt_columns_alone() -> None:
    """History without claim and finish events (they are attempt columns): attempt 1 closed
    succeeded after attempt 2 was claimed, by the attempts' own times."""
    ledger, history = clean()
    for ev in list(history.events):
        if ev.type in ("claimed", "succeeded"):
            history.events.remove(ev)
    e = pick(ledger, 14)
    history.attempts[:] = [a for a in history.attempts if a.run_id != e.run_id]
    assert e.started_ms is not None
    history.attempts += [
        cc.AttemptRow(run_id=e.run_id, attempt=1, token=e.token, outcome="error", started_ms=e.started_ms,
                      finished_ms=e.started_ms + 9_000),
        cc.AttemptRow(run_id=e.run_id, attempt=2, token=e.token + 9, outcome="succeeded",
                      started_ms=e.started_ms + 5_000, finished_ms=e.started_ms + 6_000),
    ]
    v = {x.check: x for x in cc.check(ledger, history)}["stale_finishes_accepted"]
    assert v.violations == 1 and "attempt 1 closed error 4000 ms after attempt 2 was claimed" in v.examples[0]


def test_a_stale_checkpoint_fencepost_accepted_is_reported() -> None:
    ledger, history = clean()
    e = pick(ledger, 6)
    b = second_execution(ledger, history, e, start_after_ms=50, resumed_from=1)
    # attempt 1 got checkpoint v3 accepted after attempt 2 had started from v1 (and written v2)
    ledger.executions[ledger.executions.index(e)] = msgspec.structs.replace(
        e, checkpoints=(*e.checkpoints, cc.CheckpointWrite(version=3, at_ms=b.last_ms + 5)))
    v = {x.check: x for x in cc.check(ledger, history)}["stale_checkpoints_accepted"]
    assert v.violations == 2 and all(f"run {e.run_id}" in x for x in v.examples)
    assert failing(cc.check(ledger, history)) == {"stale_checkpoints_accepted": 2}


def test_a_run_failed_without_a_handler_error_is_reported() -> None:
    ledger, history = clean()
    e = pick(ledger, 7)
    history.runs[:] = [msgspec.structs.replace(r, status="FAILED") if r.id == e.run_id else r for r in history.runs]
    history.attempts[:] = [msgspec.structs.replace(a, outcome="interrupted") if a.run_id == e.run_id else a
                           for a in history.attempts]
    assert failing(cc.check(ledger, history)) == {"failed_without_handler_error": 1}
    # the same run with its handler's own error on record is a legitimate failure
    ledger.executions[ledger.executions.index(e)] = msgspec.structs.replace(e, raised=True)
    history.attempts[:] = [msgspec.structs.replace(a, outcome="error", error_class="ChaosError")
                           if a.run_id == e.run_id else a for a in history.attempts]
    assert failing(cc.check(ledger, history)) == {}


def test_a_duplicate_event_is_reported() -> None:
    ledger, history = clean()
    ev = random_event(history, 8)
    history.events.append(msgspec.structs.replace(ev, id=99_999))
    assert failing(cc.check(ledger, history)) == {"duplicate_events": 1}


def random_event(history: cc.History, seed: int) -> cc.EventRow:
    import random

    return random.Random(seed).choice(history.events)


def test_a_lost_acknowledged_submit_is_reported() -> None:
    ledger, history = clean()
    gone = pick(ledger, 9).run_id
    history.runs[:] = [r for r in history.runs if r.id != gone]
    history.attempts[:] = [a for a in history.attempts if a.run_id != gone]
    history.events[:] = [e for e in history.events if e.run_id != gone]
    ledger.executions[:] = [e for e in ledger.executions if e.run_id != gone]
    assert failing(cc.check(ledger, history)) == {"acknowledged_submits_lost": 1}
    ledger.acked.append(10_000)  # acknowledged, never in PostgreSQL
    assert failing(cc.check(ledger, history)) == {"acknowledged_submits_lost": 2}


def test_an_acknowledged_run_that_never_finished_is_reported() -> None:
    ledger, history = clean()
    rid = pick(ledger, 10).run_id
    history.runs[:] = [msgspec.structs.replace(r, status="RUNNING") if r.id == rid else r for r in history.runs]
    assert failing(cc.check(ledger, history)) == {"acknowledged_runs_unfinished": 1}


def test_an_untraced_execution_is_reported() -> None:
    ledger, history = clean()
    e = pick(ledger, 11)
    ledger.executions.append(msgspec.structs.replace(e, attempt=2, token=e.token + 5, started_ms=e.last_ms + 10,
                                                     last_ms=e.last_ms + 20, checkpoints=(), resumed_from=1))
    assert failing(cc.check(ledger, history)) == {"untraced_executions": 1}
    # an 'unknown' attempt row of that number (a Redis loss) traces it
    history.attempts.append(cc.AttemptRow(run_id=e.run_id, attempt=2, token=0, outcome="unknown",
                                          error_class="RedisLost"))
    assert failing(cc.check(ledger, history)) == {}


def test_an_attempt_number_run_with_two_tokens_is_reported() -> None:
    ledger, history = clean()
    e = pick(ledger, 12)
    ledger.executions.append(msgspec.structs.replace(e, token=e.token + 7, started_ms=e.last_ms + 10,
                                                     last_ms=e.last_ms + 20, checkpoints=()))
    got = failing(cc.check(ledger, history))
    assert got == {"attempt_numbers_reused": 1, "untraced_executions": 1}


def test_a_delayed_run_started_early_is_reported() -> None:
    ledger, history = clean()
    e = pick(ledger, 13)
    ledger.due[e.run_id] = e.started_ms + 20_000  # due 20 s after it started: a skewed clock's promotion
    assert failing(cc.check(ledger, history)) == {"started_before_due": 1}


def test_a_missed_schedule_fire_is_reported() -> None:
    ledger, history = clean()
    t = 1_700_000_100_000
    for k in (0, 1, 2, 4, 5):  # fire 3 never became a run
        history.runs.append(cc.RunRow(id=500 + k, status="SUCCEEDED", schedule_id=77, fire_ms=t + 1000 * k))
    ledger.schedules.append(cc.ScheduleSpan(schedule_id=77, interval_ms=1000, first_ms=t, until_ms=t + 5000))
    v = {x.check: x for x in cc.check(ledger, history)}["schedule_fires_missing"]
    assert v.violations == 1 and "+3000 ms" in v.examples[0]


def test_unrecovered_faults_orphans_and_harness_errors_are_reported() -> None:
    ledger, history = clean()
    ledger.recoveries += [cc.FaultRecovery(kind="partition", at_s=3.0, seconds=None, measures="runs reclaimed"),
                          cc.FaultRecovery(kind="pg_restart", at_s=9.0, seconds=1.2),
                          cc.FaultRecovery(kind="clock_skew", at_s=12.0, seconds=None, skipped="no faketime"),
                          cc.FaultRecovery(kind="promote_lagging", at_s=20.0, seconds=None, error="boom")]
    ledger.orphans.append("kill_worker_children: 1 of 2 children alive")
    assert failing(cc.check(ledger, history)) == {"faults_not_recovered": 1, "children_outlived_worker": 1,
                                                  "harness_errors": 1}


def test_ledger_rows_fold_into_executions() -> None:
    rows = [cc.LedgerRow(run_id=1, attempt=1, token=5, worker_id="w", pid=3, model="async", kind=k, cp_version=v,
                         at_ms=t)
            for k, v, t in [("start", 0, 100), ("effect", None, 200), ("step", 1, 210), ("refused", None, 900)]]
    (e,) = cc.executions_from_rows(rows)
    assert (e.started_ms, e.last_ms, e.ended, e.checkpoints) == (100, 210, True, (cc.CheckpointWrite(version=1,
                                                                                                      at_ms=210),))


async def test_the_proxy_blackholes_without_closing_and_delivers_late_on_resume() -> None:
    """pause(): the peer goes silent (a read times out, the socket stays open); resume(): what was
    sent during the cut arrives, late, on the same connection."""
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(100):
            w.write(data)
            await w.drain()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = await TcpProxy("127.0.0.1", server.sockets[0].getsockname()[1]).start()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        w.write(b"a")
        assert await asyncio.wait_for(r.read(10), 5) == b"a"
        proxy.pause()
        w.write(b"late")
        await w.drain()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(r.read(10), 0.5)
        assert not r.at_eof() and not w.is_closing()
        proxy.resume()
        assert await asyncio.wait_for(r.read(10), 5) == b"late"
        w.close()
    finally:
        await proxy.close()
        server.close()


OPEN: frozenset[str] = frozenset()
"""Checks a soak still finds failing on this tree: printed, not asserted (none now; every check is
asserted). duplicate_events left with c62dc86 (a transition is recorded once per (run, type,
version): a replica promoted without the reaper's write made the run be reaped again at the same
version), children_outlived_worker with 7009239 (spawned children ask for their parent-death signal
before their imports: a worker killed while a child was being replaced left it alive for 1-2 s)."""


@pytest.mark.slow
def test_a_short_seeded_soak_with_every_fault_kind_gives_its_verdict(settings: Settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One round of every fault kind (the first round always completes; --duration 30 adds no
    more), each skip named, then the verdicts: complete, consistent with the exit code, and 0 for
    every check (tests above show each one can fail)."""
    cmd = [sys.executable, "-m", "fencepost.cli", "loadtest", "chaos", "--duration", "30", "--seed", "7",
           "--lease-ms", "3000", "--rate", "8", "--log-dir", str(tmp_path), "--json"]
    out = subprocess.run(cmd, cwd=ROOT, env=worker_env(settings), capture_output=True, text=True, timeout=400)
    assert out.stdout.strip(), out.stderr[-3000:]
    line = out.stdout.strip().splitlines()[-1]
    print("\n".join(format_chaos(msgspec.json.decode(line, type=ChaosReport))))
    rep = json.loads(line)
    checks = {v["check"]: v["violations"] for v in rep["verdicts"]}
    assert list(checks) == list(cc.CHECKS)
    assert rep["failed"] == [f"{k}: {n}" for k, n in checks.items() if n]
    assert (out.returncode != 0) == bool(rep["failed"]), (out.returncode, rep["failed"])
    injected = {r["kind"] for r in rep["recoveries"] if not r["skipped"] and not r["error"]}
    skipped = {r["kind"] for r in rep["recoveries"] if r["skipped"]}
    assert set(rep["faults"]) == set(FAULTS), rep["faults"]
    assert injected | skipped == set(FAULTS) and skipped == set(rep["skipped"])
    assert skipped <= {"cluster_shard_kill", "pg_restart", "promote_lagging"}  # the last two: no redis-server / initdb
    assert all(rep["recovery_s"][k]["n"] >= 1 for k in injected)
    assert rep["acked"] > 100
    assert {k: n for k, n in checks.items() if n and k not in OPEN} == {}, rep["verdicts"]


def test_the_injected_clock_offset_moves_the_wall_clock_only() -> None:
    """The skew the soak injects when faketime cannot run Python: time.time is off, monotonic is not."""
    import os

    from fencepost.dev.faults import offset_clock_dir

    d = offset_clock_dir()
    code = "import time; print(time.time(), time.monotonic())"
    env = dict(os.environ, PYTHONPATH=d, FENCEPOST_CHAOS_CLOCK_OFFSET_S="-600")
    import time

    wall, mono = time.time(), time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    finally:
        import shutil

        shutil.rmtree(d, ignore_errors=True)
    t, m = map(float, out.stdout.split())
    assert -610 < t - wall < -590 and abs(m - mono) < 30


@pytest.mark.slow
async def test_a_cluster_soak_kills_the_soak_queues_shard_and_sees_it_recover(settings: Settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With --cluster-url the soak runs on Redis Cluster (3 primaries, 3 replicas) and shuts down the
    primary owning its queue: the run on that queue and one on another shard's queue succeed after."""
    from tests.servers import RedisClusterServers

    cluster = await RedisClusterServers(masters=3, replicas=1).start()
    try:
        cmd = [sys.executable, "-m", "fencepost.cli", "loadtest", "chaos", "--duration", "20", "--seed", "3",
               "--lease-ms", "3000", "--rate", "6", "--cluster-url", cluster.url, "--log-dir", str(tmp_path),
               "--json"]
        out = await asyncio.to_thread(subprocess.run, cmd, cwd=ROOT, env=worker_env(settings), capture_output=True,
                                      text=True, timeout=400)
    finally:
        cluster.cleanup()
    assert out.stdout.strip(), out.stderr[-3000:]
    line = out.stdout.strip().splitlines()[-1]
    print("\n".join(format_chaos(msgspec.json.decode(line, type=ChaosReport))))
    rep = json.loads(line)
    kills = [r for r in rep["recoveries"] if r["kind"] == "cluster_shard_kill" and not r["skipped"]]
    assert len(kills) == 1 and kills[0]["seconds"] is not None and not kills[0]["error"], rep["recoveries"]
    assert "another shard SUCCEEDED after" in kills[0]["detail"]
    assert {"partition", "promote_lagging"} <= set(rep["skipped"])
    checks = {v["check"]: v["violations"] for v in rep["verdicts"]}
    assert checks["acknowledged_submits_lost"] == 0 and checks["harness_errors"] == 0, rep["verdicts"]
    # services restarted after the kill reach the cluster (their seed was the killed node once: the
    # trigger and reconciler never came back), and the other shard's new queue is recorded
    assert checks["faults_not_recovered"] == 0 and checks["untraced_executions"] == 0, rep["verdicts"]


def test_an_unknown_fault_kind_is_one_error_line_and_starts_nothing(settings: Settings) -> None:
    cmd = [sys.executable, "-m", "fencepost.cli", "loadtest", "chaos", "--faults", "partition,bogus"]
    out = subprocess.run(cmd, cwd=ROOT, env=worker_env(settings), capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"error: faults must be some of {', '.join(FAULTS)}, not bogus"], out.stderr


def test_a_seed_gives_the_same_faults_in_the_same_order() -> None:
    """Kinds, lengths, variants and target picks are drawn from the seed alone, every kind first."""
    from itertools import islice

    from fencepost.dev.chaos import fault_plan

    a = list(islice(fault_plan(11), 40))
    assert a == list(islice(fault_plan(11), 40))
    assert a != list(islice(fault_plan(12), 40))
    assert sorted(p.kind for p in a[:len(FAULTS)]) == sorted(FAULTS)
    only = list(islice(fault_plan(11, ("partition", "pg_restart")), 10))
    assert {p.kind for p in only} == {"partition", "pg_restart"}
    assert all(0 <= x < 1 for p in a for x in (p.length, p.variant, p.pick)) and all(0.5 <= p.gap_s <= 2 for p in a)


async def test_the_proxy_can_drop_what_is_sent_during_a_cut_or_stall_only_open_connections() -> None:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(100):
            w.write(data)
            await w.drain()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = await TcpProxy("127.0.0.1", server.sockets[0].getsockname()[1]).start()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        w.write(b"up")
        assert await asyncio.wait_for(r.read(10), 5) == b"up"
        proxy.pause(drop=True)
        w.write(b"lost")
        await w.drain()
        await asyncio.sleep(0.2)
        proxy.resume()
        w.write(b"kept")
        assert await asyncio.wait_for(r.read(10), 5) == b"kept"
        proxy.pause(existing_only=True)
        r2, w2 = await asyncio.open_connection("127.0.0.1", proxy.port)  # a new connection works
        w2.write(b"new")
        assert await asyncio.wait_for(r2.read(10), 5) == b"new"
        w.write(b"old")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(r.read(10), 0.3)
        assert proxy.paused
        proxy.resume()
        assert await asyncio.wait_for(r.read(10), 5) == b"old"
        w.close()
        w2.close()
    finally:
        await proxy.close()
        server.close()
