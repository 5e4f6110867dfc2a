"""fencepost.testing (issue 16): run_job runs a handler in-process with checkpoints and interrupts that
behave as in a worker; the Harness's drain() runs due jobs in-process to the end on real stores, with
a clock moved forward for delays and retries; the pytest plugin works as a user's project uses it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.registry import Registry
from fencepost.testing import Harness, run_job
from fencepost.worker.context import Context, SyncContext

ROOT = Path(__file__).resolve().parent.parent
registry = Registry()
EFFECTS: list[str] = []
FLAKY: dict[int, int] = {}


@registry.job("t.batch", queue="tt")
async def batch(ctx: Context, items: list[str]) -> int:
    """Processes items from its checkpoint on, one checkpoint per item, stopping when asked."""
    start = ctx.checkpoint_data or 0
    for i in range(start, len(items)):
        EFFECTS.append(ctx.op_key(items[i]))
        await ctx.checkpoint(i + 1, processed=i + 1)
    return len(items) - start


@registry.job("t.sync_batch", queue="tt", model="thread")
def sync_batch(ctx: SyncContext, n: int) -> str:
    done = ctx.checkpoint_data or 0
    while done < n:
        done += 1
        ctx.checkpoint(done, processed=done)
    return f"{done}/{n}"


@registry.job("t.node", queue="tt")
async def node(ctx: Context, factor: int) -> int:
    """A workflow node reading its upstream's result, reporting progress as it goes."""
    total = sum(r.result for r in (await ctx.upstream_results()).values())
    for i in range(3):
        ctx.progress(i + 1, total=3, message=f"step {i + 1}")
    return total * factor


@registry.job("t.flaky", queue="tt", max_retries=5)
async def flaky(ctx: Context, fail_times: int) -> int:
    """Fails (a transient ConnectionError) on its first `fail_times` attempts."""
    if ctx.attempt <= fail_times:
        raise ConnectionError(f"attempt {ctx.attempt} fails")
    return ctx.attempt


def test_a_hand_made_context_cannot_checkpoint() -> None:
    """The issue's reproduction: why run_job exists (a bare Context has no store behind it)."""
    ctx = Context(1, 1, 1, "tt", "t.batch")
    with pytest.raises(RuntimeError, match="only available inside a worker"):
        asyncio.run(batch(ctx, ["a"]))


async def test_run_job_checkpoints_interrupts_and_resumes() -> None:
    EFFECTS.clear()
    items = ["a", "b", "c", "d"]
    first = await run_job(batch, items, interrupt_at=2, run_id=7)
    assert first.status == "PAUSED" and first.checkpoints == [1, 2] and first.processed == 2
    assert first.checkpoint == 2 and first.result is None
    resumed = await run_job(batch, items, checkpoint=first.checkpoint, run_id=7, attempt=2)
    assert resumed.status == "SUCCEEDED" and resumed.result == 2 and resumed.checkpoints == [3, 4]
    assert EFFECTS == ["7:a", "7:b", "7:c", "7:d"]  # op keys are stable across attempts of the run
    stopped = await run_job(batch, items, interrupt_at=1, interrupt="cancel")
    assert stopped.status == "CANCELLED"


async def test_run_job_progress_and_upstream_results() -> None:
    done = await run_job(node, 10, upstream={"a": 2, "b": 3})
    assert done.result == 50
    assert [(p.done, p.total, p.message) for p in done.progress] == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_run_job_thread_handlers_and_validation() -> None:
    done = await run_job(sync_batch, 3)
    assert done.status == "SUCCEEDED" and done.result == "3/3" and done.checkpoints == [1, 2, 3]
    paused = await run_job(sync_batch, 3, interrupt_at=1, interrupt="stop")
    assert paused.status == "STOPPED" and paused.checkpoint == 1
    with pytest.raises(InvalidInput) as caught:
        await run_job(batch, "not-a-list")
    assert caught.value.field == "items"
    with pytest.raises(ConnectionError):  # the handler's own exception propagates
        await run_job(flaky, 1)


@pytest_asyncio.fixture
async def fp(settings: Settings) -> AsyncIterator[Harness]:
    client = await Client(settings=settings).connect()
    await client.register(registry)
    yield Harness(settings, registry, client)
    await client.close()


async def test_drain_runs_retries_to_the_end_by_skipping_time(fp: Harness) -> None:
    run_id = await flaky.submit(fp.client, 2)
    await fp.drain()  # the first attempt fails; its retry waits for its backoff
    assert await fp.status(run_id) in ("RETRY_WAIT", "SUCCEEDED", "PENDING")
    await fp.drain(skip_delays=True)
    out = await fp.client.wait(run_id, timeout=10)
    assert out.status == "SUCCEEDED" and out.result == 3
    assert [a["attempt"] for a in await fp.client.attempts(run_id)] == [1, 2, 3]


async def test_the_clock_brings_delayed_runs_forward(fp: Harness) -> None:
    EFFECTS.clear()
    run_id = await batch.options(delay=3600).submit(fp.client, ["x"])
    now = await batch.submit(fp.client, ["y"])
    await fp.drain()
    assert await fp.status(now) == "SUCCEEDED"
    assert await fp.status(run_id) == "PENDING"
    await fp.clock.advance(1800)
    await fp.drain()
    assert await fp.status(run_id) == "PENDING"  # half-way there
    await fp.clock.advance(1800)
    await fp.drain()
    assert await fp.status(run_id) == "SUCCEEDED"
    assert fp.clock.skipped == 3600
    assert EFFECTS == [f"{now}:y", f"{run_id}:x"]


def test_the_pytest_plugin_in_a_user_project(tmp_path: Path, settings: Settings) -> None:
    """A project with `pytest_plugins = ["fencepost.testing"]` and its own registry fixture: the
    fencepost fixture gives a client on the configured stores and drain() runs its jobs."""
    (tmp_path / "myapp.py").write_text(textwrap.dedent('''
        from fencepost.core.registry import Registry

        registry = Registry()


        @registry.job("myapp.add", queue="myapp")
        async def add(ctx, a: int, b: int) -> int:
            return a + b
    '''))
    (tmp_path / "conftest.py").write_text(textwrap.dedent('''
        import pytest
        from myapp import registry

        pytest_plugins = ["fencepost.testing"]


        @pytest.fixture
        def fencepost_registry():
            return registry
    '''))
    (tmp_path / "test_myapp.py").write_text(textwrap.dedent('''
        import pytest
        from fencepost.core.errors import InvalidInput
        from myapp import add


        async def test_add(fencepost):
            run_id = await add.submit(fencepost.client, 2, 3)
            with pytest.raises(InvalidInput):
                await add.submit(fencepost.client, 2, "three")
            await fencepost.drain()
            assert (await fencepost.client.wait(run_id, timeout=10)).result == 5
    '''))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "FENCEPOST_"))}
    env.update(PYTHONPATH=str(tmp_path), FENCEPOST_REDIS_URL=settings.redis_url,
               FENCEPOST_DATABASE_URL=settings.database_url)  # this test's own database
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout
