"""Results through workflows and batches: a workflow node reads its upstream results by name;
a batch's on_complete / on_success callback runs exactly once when every member is terminal,
also when the worker running a member is SIGKILLed and when the recorder replays a batch."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core import release
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.models import Submit
from fencepost.core.registry import Registry
from fencepost.core.stores import Stores
from fencepost.worker.context import Context
from fencepost.workflows import Node
from tests.conftest import log_tail, record_all, spawn, stop, wait_until
from tests.servers import RedisServer

registry = Registry()
Q = "bq"


@registry.job("b.square", queue=Q, max_retries=3)
async def square(ctx: Context, x: int, marker: str | None = None, hang_on: int | None = None) -> int:
    """x*x; with hang_on == x, the first attempt marks that it started and hangs (to be SIGKILLed)."""
    if hang_on == x and ctx.attempt == 1 and marker:
        Path(marker).write_text("started")
        await asyncio.sleep(3600)
    return x * x


@registry.job("b.gated", queue=Q, max_retries=5)
async def gated(ctx: Context, x: int, gate: str, started: str) -> int:
    """x*x once `gate` exists (bounded wait); marks `started` first."""
    Path(started).write_text("started")
    for _ in range(3000):
        if Path(gate).exists():
            return x * x
        await asyncio.sleep(0.02)
    raise TimeoutError("gate never opened")


@registry.job("b.fail", queue=Q, max_retries=0)
async def fail(ctx: Context) -> None:
    raise ValueError("this member fails for good")


@registry.job("b.collect", queue=Q, max_retries=3)
async def collect(ctx: Context, log: str) -> dict[str, Any]:
    """A callback: appends one line per execution to `log`, returns what it saw."""
    members = await ctx.batch_results()
    with open(log, "a") as f:
        f.write(f"{ctx.run_id}\n")
    return {"statuses": [m.status for m in members], "total": sum(m.result or 0 for m in members)}


@registry.job("w.numbers", queue=Q)
async def numbers(ctx: Context, n: int) -> list[int]:
    return list(range(1, n + 1))


@registry.job("w.factor", queue=Q)
async def factor(ctx: Context) -> int:
    return 10


@registry.job("w.combine", queue=Q)
async def combine(ctx: Context) -> dict[str, Any]:
    ups = await ctx.upstream_results()
    return {"names": sorted(ups), "value": sum(ups["numbers"].result) * ups["factor"].result}


APP = "tests.test_batches:registry"


@contextmanager
def _services(settings: Settings, tmp: Path, *, worker: bool = True, **env: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [spawn(settings, "reconciler", log=tmp / "reconciler.log")]
    if worker:
        procs.append(spawn(settings, "worker", "--app", APP, "--queue", Q, "--processes", "1",
                           log=tmp / "worker.log", **env))
    try:
        yield procs
    finally:
        stop(procs)


async def _status(client: Client, run_id: int) -> str:
    return str((await client.get(run_id))["status"])


async def _terminal(client: Client, run_id: int) -> str | None:
    s = await _status(client, run_id)
    return s if s in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT") else None


# -- validation ------------------------------------------------------------------------------------
async def test_a_batch_without_runs_or_callbacks_is_refused_and_writes_nothing(client: Client, stores: Stores) -> None:
    await client.register(registry)
    with pytest.raises(InvalidInput) as e:
        await client.submit_batch([], on_complete=Submit(handler="b.collect", args=("x",)))
    assert e.value.field == "requests"
    with pytest.raises(InvalidInput) as e:
        await client.submit_batch([Submit(handler="b.square", args=(1,))])
    assert e.value.field == "on_complete"
    with pytest.raises(InvalidInput) as e:
        await client.submit_batch([Submit(handler="b.square", args=(1,))],
                                  on_complete=Submit(handler="b.collect", args=("x",), delay=5))
    assert e.value.field == "on_complete"
    assert await client.list_runs(queue=Q) == []


# -- the recorder's settle step --------------------------------------------------------------------
async def test_callbacks_wait_blocked_until_every_member_is_terminal(client: Client, stores: Stores,
                                                                     tmp_path: Path) -> None:
    await client.register(registry)
    log = tmp_path / "cb.log"
    b = await client.submit_batch([Submit(handler="b.square", args=(x,)) for x in (1, 2, 3)],
                                  on_complete=Submit(handler="b.collect", args=(str(log),)),
                                  on_success=Submit(handler="b.collect", args=(str(log),)))
    assert b.on_complete is not None and b.on_success is not None
    assert await _status(client, b.on_complete) == "BLOCKED"
    assert (await client.batch(b.id))["settled_at"] is None
    assert [m["status"] for m in (await client.batch(b.id))["members"]] == ["PENDING"] * 3
    # the callbacks are not in Redis: a worker cannot claim them early
    assert not await stores.redis.exists(stores.keys(Q).run(b.on_complete))


async def test_a_replayed_settle_releases_the_callback_once(client: Client, stores: Stores) -> None:
    """The recorder redelivers a batch after a failed transaction: the second settle is a no-op."""
    await client.register(registry)
    b = await client.submit_batch([Submit(handler="b.square", args=(1,))],
                                  on_complete=Submit(handler="b.collect", args=("x",)))
    assert b.on_complete is not None
    rid = b.run_ids[0]
    # the member ends through the real store path (a cancel is terminal), then the recorder records it
    await client.cancel(rid, reason="test")
    await record_all(stores)
    assert await _status(client, rid) == "CANCELLED"
    assert await _status(client, b.on_complete) == "PENDING"
    events = [e for e in await client.events(b.on_complete) if e["type"] == "released"]
    for _ in range(2):  # replays, and the sweep, change nothing
        async with stores.db.transaction() as tx:
            await release.on_recorded(tx, [rid], ["CANCELLED"])
            await release.sweep_blocked(tx, settled_s=0)
    assert [e for e in await client.events(b.on_complete) if e["type"] == "released"] == events
    assert len(events) == 1


# -- end to end, with a SIGKILLed worker ------------------------------------------------------------
@pytest.mark.slow
async def test_batch_callbacks_run_exactly_once_across_a_sigkilled_worker(client: Client, settings: Settings,
                                                                          stores: Stores, tmp_path: Path) -> None:
    await client.register(registry)
    marker, log = tmp_path / "started", tmp_path / "callbacks.log"
    b = await client.submit_batch(
        [Submit(handler="b.square", args=(x,), kwargs={"marker": str(marker), "hang_on": 2}) for x in (1, 2, 3)],
        on_complete=Submit(handler="b.collect", args=(str(log),)),
        on_success=Submit(handler="b.collect", args=(str(log),)))
    assert b.on_complete is not None and b.on_success is not None
    with _services(settings, tmp_path, worker=False):
        w1 = spawn(settings, "worker", "--app", APP, "--queue", Q, "--processes", "1", log=tmp_path / "w1.log",
                   FENCEPOST_LEASE_MS="1500")
        try:
            await wait_until(lambda: asyncio.sleep(0, marker.exists()), what="member 2 to start (and hang)")
            assert await _status(client, b.on_complete) == "BLOCKED"
        finally:
            w1.send_signal(signal.SIGKILL)
            w1.wait(10)
        w2 = spawn(settings, "worker", "--app", APP, "--queue", Q, "--processes", "1", log=tmp_path / "w2.log",
                   FENCEPOST_LEASE_MS="1500")
        try:
            for cb in (b.on_complete, b.on_success):
                try:
                    await wait_until(lambda cb=cb: _terminal(client, cb), timeout=60, what=f"callback {cb}")
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\n{log_tail(tmp_path / 'w2.log')}") from None
        finally:
            w2.send_signal(signal.SIGTERM)
            w2.wait(20)
    done = await client.get(b.on_complete)
    assert done["status"] == "SUCCEEDED"
    seen = (await client.wait(b.on_complete)).result
    assert seen == {"statuses": ["SUCCEEDED"] * 3, "total": 1 + 4 + 9}
    assert await _status(client, b.on_success) == "SUCCEEDED"
    attempts = await client.attempts(b.run_ids[1])
    assert len(attempts) >= 2, "member 2's first attempt died with its worker"
    # each callback ran exactly once
    assert sorted(log.read_text().split()) == sorted([str(b.on_complete), str(b.on_success)])
    assert (await client.batch(b.id))["settled_at"] is not None


@pytest.mark.slow
async def test_on_success_is_cancelled_when_a_member_fails(client: Client, settings: Settings, stores: Stores,
                                                           tmp_path: Path) -> None:
    await client.register(registry)
    log = tmp_path / "callbacks.log"
    b = await client.submit_batch([Submit(handler="b.square", args=(3,)), Submit(handler="b.fail")],
                                  on_complete=Submit(handler="b.collect", args=(str(log),)),
                                  on_success=Submit(handler="b.collect", args=(str(log),)))
    assert b.on_complete is not None and b.on_success is not None
    with _services(settings, tmp_path):
        await wait_until(lambda: _terminal(client, b.on_complete), timeout=60, what="on_complete")
        await wait_until(lambda: _terminal(client, b.on_success), timeout=60, what="on_success")
    assert (await client.wait(b.on_complete)).result == {"statuses": ["SUCCEEDED", "FAILED"], "total": 9}
    run = await client.get(b.on_success)
    assert (run["status"], run["reason"]) == ("CANCELLED", "batch_failed")
    assert log.read_text().split() == [str(b.on_complete)]


@pytest.mark.slow
async def test_batch_callbacks_run_exactly_once_across_a_redis_that_forgot_everything(
        settings: Settings, tmp_path: Path) -> None:
    """FLUSHALL (a failover to a replica that has nothing) while a member runs: the reconciler
    rebuilds from PostgreSQL, the member runs again, and each callback still runs exactly once."""
    server = await RedisServer().start()
    s = Settings(redis_url=server.url, database_url=settings.database_url, prefix=settings.prefix,
                 backoff_base_ms=50, backoff_cap_ms=500)
    client = await Client(settings=s).connect()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await client.register(registry)
        gate, started, log = tmp_path / "gate", tmp_path / "started", tmp_path / "callbacks.log"
        b = await client.submit_batch(
            [Submit(handler="b.square", args=(x,)) for x in (1, 2)]
            + [Submit(handler="b.gated", args=(3, str(gate), str(started)))],
            on_complete=Submit(handler="b.collect", args=(str(log),)),
            on_success=Submit(handler="b.collect", args=(str(log),)))
        assert b.on_complete is not None and b.on_success is not None
        procs.append(spawn(s, "reconciler", log=tmp_path / "reconciler.log"))
        procs.append(spawn(s, "worker", "--app", APP, "--queue", Q, "--processes", "1", log=tmp_path / "worker.log",
                           FENCEPOST_LEASE_MS="2000"))

        async def members_done() -> bool:
            return started.exists() and [await _status(client, r) for r in b.run_ids[:2]] == ["SUCCEEDED"] * 2

        await wait_until(members_done, timeout=60, what="two members recorded and the third running")
        assert await _status(client, b.on_complete) == "BLOCKED"
        await client.stores.redis.flushall()
        gate.write_text("open")
        for cb in (b.on_complete, b.on_success):
            try:
                await wait_until(lambda cb=cb: _terminal(client, cb), timeout=90, what=f"callback {cb}")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{log_tail(tmp_path / 'reconciler.log')}\n"
                                     f"{log_tail(tmp_path / 'worker.log')}") from None
        assert (await client.wait(b.on_complete, timeout=30)).result == {"statuses": ["SUCCEEDED"] * 3,
                                                                         "total": 1 + 4 + 9}
        assert await _status(client, b.on_success) == "SUCCEEDED"
        assert sorted(log.read_text().split()) == sorted([str(b.on_complete), str(b.on_success)])
    finally:
        stop(procs)
        await client.close()
        server.cleanup()


# -- workflows pass results by name ----------------------------------------------------------------
@pytest.mark.slow
async def test_a_workflow_node_reads_its_upstream_results_by_name(client: Client, settings: Settings,
                                                                   tmp_path: Path) -> None:
    await client.register(registry)
    wid = await client.submit_workflow([
        Node(name="numbers", handler="w.numbers", args=(4,)),
        Node(name="factor", handler="w.factor"),
        Node(name="combine", handler="w.combine", depends_on=("numbers", "factor")),
    ])
    assert isinstance(wid, uuid.UUID)

    async def combined() -> Any:
        nodes = {n["name"]: n for n in (await client.workflow(wid))["nodes"]}
        return nodes["combine"]["id"] if nodes["combine"]["status"] == "SUCCEEDED" else None

    with _services(settings, tmp_path):
        rid = await wait_until(combined, timeout=60, what="the combine node")
    assert (await client.wait(rid)).result == {"names": ["factor", "numbers"], "value": (1 + 2 + 3 + 4) * 10}
