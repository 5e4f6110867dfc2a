"""Workflow release and cancellation, inside the recorder's transaction.

`on_recorded` is called by the recorder right after `apply_runs`, in the same PostgreSQL
transaction: a dependent becomes PENDING (outbox=true, so the relay moves it to Redis
after commit) in the very transaction that records its last upstream SUCCEEDED, and the
BLOCKED descendants of a run that failed for good become CANCELLED (upstream_failed).
If the transaction fails, the batch is redelivered and both steps run again; both are
idempotent (they act only on runs still BLOCKED and check the upstreams' recorded state).
"""

from __future__ import annotations

from collections.abc import Sequence

from fencepost.core.record import Session
from fencepost.core.states import FAILED_FOR_GOOD, TERMINAL

__all__ = ["cancel_descendants", "on_recorded", "release_dependents", "settle_batches", "sweep_blocked"]

_TERMINAL = frozenset(s.value for s in TERMINAL)


async def release_dependents(tx: Session, succeeded: Sequence[int], *,
                             actor: str = "recorder") -> list[int]:
    """Make PENDING the BLOCKED dependents of `succeeded` whose upstreams all SUCCEEDED."""
    if not succeeded:
        return []
    cands = [r.id for r in await tx.rows("wf_lock_dependents", list(succeeded))]
    if not cands:
        return []
    return [r.id for r in await tx.rows("wf_release", cands, actor)]


async def cancel_descendants(tx: Session, failed: Sequence[int], *,
                             actor: str = "recorder") -> list[int]:
    """CANCELLED (upstream_failed) for every BLOCKED descendant of runs that failed for good."""
    if not failed:
        return []
    return [r.id for r in await tx.rows("wf_cancel_descendants", list(failed), actor)]


async def on_recorded(tx: Session, run_ids: Sequence[int], statuses: Sequence[str]) -> None:
    """The recorder's hook: the batch's runs and the status each reached."""
    ok = [r for r, s in zip(run_ids, statuses) if s == "SUCCEEDED"]
    bad = [r for r, s in zip(run_ids, statuses) if s in FAILED_FOR_GOOD]
    if ok:
        await release_dependents(tx, ok)
    if bad:
        await cancel_descendants(tx, bad)
    ended = [r for r, s in zip(run_ids, statuses) if s in _TERMINAL]
    if ended:
        await settle_batches(tx, ended)


async def settle_batches(tx: Session, ended: Sequence[int], *, actor: str = "recorder",
                         locked: Sequence[object] | None = None) -> int:
    """Release the callbacks of batches whose last member just ended: on_complete always,
    on_success only when every member SUCCEEDED (else it is cancelled, batch_failed).

    Exactly once: the batch row is locked and marked settled in this transaction, and a
    callback moves only from BLOCKED. A failed transaction is redelivered and does it again."""
    ids = list(locked) if locked is not None else [r.id for r in await tx.rows("batch_lock_open", list(ended))]
    if not ids:
        return 0
    settled = await tx.rows("batch_settling", ids)
    release = [r.on_complete for r in settled if r.on_complete is not None]
    release += [r.on_success for r in settled if r.on_success is not None and r.all_ok]
    cancel = [r.on_success for r in settled if r.on_success is not None and not r.all_ok]
    if release:
        await tx.rows("batch_release", release, actor)
    if cancel:
        await tx.rows("batch_cancel_callbacks", cancel, actor)
    return len(settled)


async def sweep_blocked(tx: Session, *, settled_s: float = 5.0, limit: int = 1000) -> int:
    """Safety net (run by the trigger leader): BLOCKED runs whose upstreams settled without
    the hook seeing it (a terminal state written by drift repair, not by the recorder)."""
    rows = await tx.rows("wf_blocked_settled", float(settled_s), limit)
    ok = [r.id for r in rows if r.all_ok]
    failed = sorted({u for r in rows if not r.all_ok for u in r.failed or []})
    n = 0
    if ok:
        locked = [r.id for r in await tx.rows("wf_lock_blocked", ok)]
        n += len(await tx.rows("wf_release", locked, "sweeper")) if locked else 0
    if failed:
        n += len(await cancel_descendants(tx, failed, actor="sweeper"))
    open_ = [r.id for r in await tx.rows("batch_unsettled", float(settled_s), limit)]
    if open_:
        n += await settle_batches(tx, (), actor="sweeper", locked=open_)
    await tx.execute("progress_prune", limit)  # ctx.progress() rows of archived runs
    return n
