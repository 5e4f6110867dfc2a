"""Process-model handlers (`model="process"`, issue 16) get what async and thread handlers get: ctx.progress()
(coalesced in the child, the last report never lost), a workflow node's upstream results and a batch
callback's member results (answered by the parent from PostgreSQL), annotated arguments converted, and
arguments that no longer bind failing fast as invalid input. Run by a real worker process and its child."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.models import Submit
from fencepost.core.registry import Registry
from fencepost.worker.context import Context, SyncContext
from fencepost.workflows import Node
from tests.conftest import log_tail, spawn, stop, wait_until

registry = Registry()
Q = "ppq"
APP = "tests.test_process_handlers:registry"
N = 20_000


class Order(msgspec.Struct):
    sku: str
    quantity: int


@registry.job("pp.numbers", queue=Q)
async def numbers(ctx: Context, n: int) -> list[int]:
    return list(range(1, n + 1))


@registry.job("pp.combine", queue=Q, model="process")
def combine(ctx: SyncContext, factor: int) -> dict[str, Any]:
    """A process node: reads its upstream by name, reports progress N times (the last one must arrive)."""
    ups = ctx.upstream_results()
    for i in range(N):
        ctx.progress(i + 1, total=N, message="combining")
    return {"names": sorted(ups), "value": sum(ups["numbers"].result) * factor}


@registry.job("pp.square", queue=Q, model="process")
def square(ctx: SyncContext, x: int) -> int:
    return x * x


@registry.job("pp.collect", queue=Q, model="process")
def collect(ctx: SyncContext) -> dict[str, Any]:
    """A process batch callback: every member's status and result."""
    members = ctx.batch_results()
    ctx.progress(len(members), total=len(members), message="collected")
    return {"statuses": [m.status for m in members], "total": sum(m.result or 0 for m in members)}


@registry.job("pp.order", queue=Q, model="process", max_retries=3)
def order(ctx: SyncContext, o: Order) -> str:
    """Annotated: the child converts the argument as a worker does for async handlers."""
    return f"{type(o).__name__}:{o.sku}x{o.quantity}"


@contextmanager
def _services(settings: Settings, tmp: Path) -> Iterator[None]:
    procs = [spawn(settings, "reconciler", log=tmp / "reconciler.log"),
             spawn(settings, "worker", "--app", APP, "--queue", Q, "--processes", "1", log=tmp / "worker.log")]
    try:
        yield
    finally:
        stop(procs)


async def _final(client: Client, run_id: int, tmp: Path) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        row = await client.get(run_id)
        return row if row["status"] in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT") else None

    try:
        return dict(await wait_until(done, timeout=90, what=f"run {run_id} to end"))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- worker ---\n{log_tail(tmp / 'worker.log')}") from None


@pytest.mark.slow
async def test_process_handlers_get_progress_upstream_and_batch_results(client: Client, settings: Settings,
                                                                        tmp_path: Path) -> None:
    await client.register(registry)
    wid = await client.submit_workflow([
        Node(name="numbers", handler="pp.numbers", args=(4,)),
        Node(name="combine", handler="pp.combine", args=(10,), depends_on=("numbers",))])
    b = await client.submit_batch([Submit(handler="pp.square", args=(x,)) for x in (1, 2, 3)],
                                  on_complete=Submit(handler="pp.collect"))
    assert b.on_complete is not None
    converted = await order.submit(client, Order(sku="a-1", quantity=2))
    async with Client(settings=settings) as blind:  # never registered the registry: checks the stored signature
        with pytest.raises(InvalidInput, match="positional"):
            await blind.submit("pp.order", {"sku": "a-1"}, "extra")
    with _services(settings, tmp_path):
        combine_id = next(n["id"] for n in (await client.workflow(wid))["nodes"] if n["name"] == "combine")
        row = await _final(client, combine_id, tmp_path)
        assert row["status"] == "SUCCEEDED", row
        out = await client.wait(combine_id, timeout=10)
        assert out.result == {"names": ["numbers"], "value": 100}
        async def last_progress(run_id: int, message: str, done: int | None = None) -> Any:
            p = (await client.get(run_id))["progress"]  # written by the worker's next flush (about a second)
            return p if p is not None and p["message"] == message and done in (None, p["done"]) else None

        # an earlier report may be flushed first (a slow child sends one every 0.2 s): wait for the last
        progress = await wait_until(lambda: last_progress(combine_id, "combining", N), timeout=10,
                                    what="the combine's last progress report")
        assert (progress["done"], progress["total"]) == (N, N), "the last report of the child arrived"
        row = await _final(client, b.on_complete, tmp_path)
        assert row["status"] == "SUCCEEDED", row
        assert (await client.wait(b.on_complete, timeout=10)).result == {"statuses": ["SUCCEEDED"] * 3, "total": 14}
        assert (await wait_until(lambda: last_progress(b.on_complete, "collected")))["done"] == 3
        assert (await client.wait(converted, timeout=60)).result == "Order:a-1x2"
