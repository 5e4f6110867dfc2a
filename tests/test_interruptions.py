"""Interruptions are not handler failures (issue 22 item 3, docs/clock.md): an attempt ended by
its worker's death or its lease's expiry does not use up max_retries; it is counted apart, and
only past settings.max_interruptions is the run FAILED, with reason interrupted_too_often (never
retries_exhausted: no handler raised)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from tests.conftest import log_tail, record_all, spawn, stop, wait_until

APP = "tests.apps:registry"
WORKER = ("worker", "--app", APP, "--queue", "tq")
LIMIT = 2
ENV = {"FENCEPOST_MAX_INTERRUPTIONS": str(LIMIT), "FENCEPOST_WORKER_LIVENESS_MS": "1000",
       "FENCEPOST_LEASE_MS": "10000"}


async def test_a_run_whose_worker_is_killed_again_and_again_is_rerun_then_failed_interrupted_too_often(
        client: Client, settings: Settings, stores: Stores, tmp_path: Path) -> None:
    run = await client.submit("t.sleep", 60.0, max_retries=0)
    key = stores.keys("tq").run(run)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for attempt in range(1, LIMIT + 2):
            log = tmp_path / f"w{attempt}.log"
            w = spawn(settings, *WORKER, log=log, **ENV)
            procs.append(w)

            async def running(n: int = attempt) -> bool:
                h = await stores.redis.hmget(key, "state", "attempt")
                return h == [b"RUNNING", str(n).encode()]

            async def pulsing() -> bool:  # a worker that never pulsed is reaped only at its lease's end
                worker = await stores.redis.hget(key, "worker")
                return worker is not None and await stores.redis.zscore(stores.keys("tq").base + "workers",
                                                                        worker) is not None

            try:
                await wait_until(running, timeout=20, what=f"attempt {attempt} to run")
                await wait_until(pulsing, timeout=10, what=f"attempt {attempt}'s worker to pulse")
            except AssertionError:
                raise AssertionError(f"{await stores.redis.hgetall(key)}\n{log_tail(log)}") from None
            os.kill(w.pid, signal.SIGKILL)  # the next worker's reaper sees the dead one's pulse lapse
            w.wait(10)
        # after the last kill, a live worker's reaper ends the run (no interruption left to give)
        procs.append(spawn(settings, *WORKER, log=tmp_path / "last.log", **ENV))

        async def failed() -> bool:
            return await stores.redis.hget(key, "state") == b"FAILED"

        await wait_until(failed, timeout=20, what="the run to fail after the last interruption")
    finally:
        stop(procs)
    h = await stores.redis.hgetall(key)
    assert (h[b"attempt"], h[b"interrupts"], h.get(b"fails")) == (str(LIMIT + 1).encode(), str(LIMIT + 1).encode(),
                                                                   None)
    events = [f for _, f in await stores.redis.xrange(stores.keys("tq").events)]
    expired = [(e[b"to"], e.get(b"reason")) for e in events if e[b"type"] == b"lease_expired"]
    assert expired == [(b"PENDING", None)] * LIMIT + [(b"FAILED", b"interrupted_too_often")]
    await record_all(stores)
    assert (await client.get(run))["reason"] == "interrupted_too_often"
