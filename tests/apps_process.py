"""A registry with a process-model handler for fencepost.testing's drain() (tests/test_testing_process.py):
the drain's worker spawns its child from `tests.apps_process:registry`, found among the loaded modules."""

from __future__ import annotations

import os
from typing import Any

from fencepost.core.registry import Registry
from fencepost.worker.context import SyncContext

registry = Registry()


@registry.job("tp.count", queue="tpq", model="process")
def count(ctx: SyncContext, n: int) -> dict[str, Any]:
    """Counts to n from its checkpoint, one checkpoint and progress report per step; says which process it ran in."""
    done = ctx.checkpoint_data or 0
    while done < n:
        done += 1
        ctx.checkpoint(done, processed=done)  # written by the drain's worker before the child goes on
        ctx.progress(done, total=n, message="counting")
    return {"done": done, "pid": os.getpid()}


@registry.job("tp.boom", queue="tpq", model="process", max_retries=2)
def boom(ctx: SyncContext) -> None:
    raise ConnectionError(f"attempt {ctx.attempt} fails in the child")
