"""Worker liveness, kept apart from job leases (issue 18): a worker pulses from a thread of its own,
and the runs of a worker whose pulse stopped are reclaimed within seconds whatever their lease, so
long jobs may hold long leases and a crash is still noticed at once. Fencing is unchanged: the
dead (or frozen) worker's token is stale once its run was reclaimed."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.hot import ClaimArgs, Lease, PulseArgs, ReapArgs, RenewArgs
from fencepost.core.models import decode_result
from fencepost.core.stores import Stores
from tests.conftest import log_tail, record_all, run_state, spawn, wait_state, wait_until

APP = "tests.apps:registry"
WORKER = ("worker", "--app", APP, "--queue", "tq")
LONG_LEASE_MS = "600000"
"""Ten minutes: any reclaim seen within the tests' bounded waits came from liveness, not the lease."""


async def _claim(stores: Stores, worker: str, lease_ms: int = 600_000) -> list[Any]:
    return [c.id for c in await stores.scripts.claim_due(stores.keys("tq"), ClaimArgs(1, worker, lease_ms, 100))]


def _kill(*procs: subprocess.Popen[bytes] | None) -> None:
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(10)


async def test_runs_of_a_worker_whose_pulse_lapsed_are_reaped_whatever_their_lease(client: Client,
                                                                                   stores: Stores) -> None:
    keys = stores.keys("tq")
    dead_run = await client.submit("t.noop")
    live_run = await client.submit("t.noop")
    silent_run = await client.submit("t.noop")
    assert int((await _claim(stores, "w-dead"))[0]) == dead_run
    assert int((await _claim(stores, "w-live"))[0]) == live_run
    assert int((await _claim(stores, "w-never-pulsed"))[0]) == silent_run
    await stores.scripts.pulse_worker(keys, PulseArgs("w-live", 600_000))
    await stores.scripts.pulse_worker(keys, PulseArgs("w-dead", 1))  # alive for 1 ms of the server's clock

    # every lease still has ten minutes to go
    reaped = await wait_until(lambda: stores.scripts.reap_expired(keys, ReapArgs(100)), timeout=10,
                              what="the dead worker's run to be reaped")
    assert reaped == 1
    assert await run_state(stores, dead_run) == "PENDING"
    assert await run_state(stores, live_run) == "RUNNING"
    assert await run_state(stores, silent_run) == "RUNNING", "a worker that never pulsed keeps its lease"
    assert await stores.redis.zscore(keys.base + "workers", "w-dead") is None, "a dead worker leaves the set"
    assert await stores.redis.zscore(keys.base + "workers", "w-live") is not None
    assert await stores.scripts.reap_expired(keys, ReapArgs(100)) == 0

    # the dead worker's token is stale: it can neither renew nor finish
    h = await stores.redis.hgetall(keys.run(dead_run))
    assert h[b"state"] == b"PENDING"
    await record_all(stores)
    (att,) = await client.attempts(dead_run)
    assert (att["worker_id"], att["outcome"]) == ("w-dead", "interrupted")
    renew = await stores.scripts.renew_leases(keys, RenewArgs(30_000), [Lease(dead_run, att["token"])])
    assert renew[0].lost
    events = [(e["type"], e["from_status"], e["to_status"]) for e in await client.events(dead_run)]
    assert events == [("submitted", None, "PENDING"), ("claimed", "PENDING", "RUNNING"),
                      ("lease_expired", "RUNNING", "PENDING")]


async def test_a_leaving_worker_is_not_expected_to_pulse(stores: Stores) -> None:
    keys = stores.keys("tq")
    await stores.scripts.pulse_worker(keys, PulseArgs("w", 600_000))
    assert await stores.redis.zscore(keys.base + "workers", "w") is not None
    await stores.scripts.pulse_worker(keys, PulseArgs("w", 0))
    assert await stores.redis.zscore(keys.base + "workers", "w") is None


async def _claimed_and_pulsing(stores: Stores, run_id: int, log: Path) -> str:
    """Wait until a worker runs `run_id` and its liveness pulse is in; returns the worker's id."""
    await wait_state(stores, run_id, {"RUNNING"}, 30, "the first worker to claim the run", log)
    worker_id = (await stores.redis.hget(stores.keys("tq").run(run_id), "worker")).decode()

    async def pulsed() -> bool:
        return await stores.redis.zscore(stores.keys("tq").base + "workers", worker_id) is not None

    await wait_until(pulsed, timeout=10, what="the first worker's pulse")
    return worker_id


@pytest.mark.slow
async def test_sigkilled_worker_under_a_long_lease_is_reclaimed_at_once(client: Client, settings: Settings,
                                                                        stores: Stores, tmp_path: Path) -> None:
    """The kill -9 target of issue 18: the dead worker's run is reclaimed within seconds of its death
    although its lease has ten minutes left; the bounded wait below is far shorter than the lease."""
    run_id = await client.submit("t.sleep", 30, kwargs={"only_attempt": 1})
    log1, log2 = tmp_path / "w1.log", tmp_path / "w2.log"
    w1 = spawn(settings, *WORKER, "--processes", "1", log=log1, FENCEPOST_LEASE_MS=LONG_LEASE_MS)
    w2: subprocess.Popen[bytes] | None = None
    try:
        w1_id = await _claimed_and_pulsing(stores, run_id, log1)
        os.kill(w1.pid, signal.SIGKILL)
        w1.wait(10)
        w2 = spawn(settings, *WORKER, "--processes", "1", log=log2, FENCEPOST_LEASE_MS=LONG_LEASE_MS)
        await wait_state(stores, run_id, {"SUCCEEDED", "FAILED"}, 30, "the second worker to finish the run", log2)
    finally:
        _kill(w1, w2)
    await record_all(stores)
    run = await client.get(run_id)
    assert run["status"] == "SUCCEEDED" and run["attempt"] == 2 and decode_result(run["result"]) == 2
    attempts = await client.attempts(run_id)
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "interrupted"), (2, "succeeded")]
    assert attempts[0]["worker_id"] == w1_id and attempts[1]["worker_id"] != w1_id
    assert attempts[1]["token"] > attempts[0]["token"]


@pytest.mark.slow
async def test_frozen_worker_loses_its_run_and_cannot_finish_it_when_thawed(client: Client, settings: Settings,
                                                                            stores: Stores, tmp_path: Path) -> None:
    """SIGSTOP is indistinguishable from death for as long as it lasts: the run is reclaimed and
    finished elsewhere; the thawed worker's finish carries a stale token and changes nothing."""
    run_id = await client.submit("t.sleep", 3, kwargs={"only_attempt": 1})
    log1, log2 = tmp_path / "w1.log", tmp_path / "w2.log"
    w1 = spawn(settings, *WORKER, "--processes", "1", log=log1, FENCEPOST_LEASE_MS=LONG_LEASE_MS)
    w2: subprocess.Popen[bytes] | None = None
    try:
        await _claimed_and_pulsing(stores, run_id, log1)
        os.kill(w1.pid, signal.SIGSTOP)
        w2 = spawn(settings, *WORKER, "--processes", "1", log=log2, FENCEPOST_LEASE_MS=LONG_LEASE_MS)
        await wait_state(stores, run_id, {"SUCCEEDED"}, 30, "the second worker to finish the run", log2)
        os.kill(w1.pid, signal.SIGCONT)

        async def stale_or_lost() -> bool:
            text = log1.read_text(errors="replace") if log1.exists() else ""
            return any(w in text for w in ("stale_finish", "lease_lost", "late finish", "lost lease", "self_fenced"))

        await wait_until(stale_or_lost, timeout=30, what=f"the thawed worker to find its token stale\n{log_tail(log1)}")
    finally:
        _kill(w1, w2)
    await record_all(stores)
    attempts = await client.attempts(run_id)
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "interrupted"), (2, "succeeded")]
    run = await client.get(run_id)
    assert run["status"] == "SUCCEEDED" and decode_result(run["result"]) == 2
