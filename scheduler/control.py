"""Operator commands: pause, stop, cancel, resume, restart, retry (one run or a bounded
bulk selection) and queue pause/resume.

Each run command is one Lua compare-and-set on the run's hot state (never queued behind
jobs, so it works while workers are saturated) and becomes an event with actor and reason.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fencepost.core import audit
from fencepost.core.errors import BulkNotConfirmed, InvalidInput, ResumeRefused, UnknownQueue, UnknownRun
from fencepost.core.hot import CancelArgs, ControlArgs, ControlVerb, ResolveArgs
from fencepost.core.models import JobSpec, decode_payload, decode_result, run_row
from fencepost.core.states import WAITING, Status
from fencepost.core.submit import SubmitPath
from fencepost.core.views import BulkCount, BulkResult, BulkSkip, Reply, RunSummary

__all__ = ["BULK_DEFAULT_LIMIT", "COMMANDS", "Control", "explain_reply"]

COMMANDS = ("pause", "stop", "cancel", "resume", "restart", "retry")
_UNHELD = (ValueError, ArithmeticError, TypeError, msgspec.ValidationError)
"""What enqueuing a run's own stored values raises when Redis cannot hold them (an infinite timeout)."""
_WAITING = frozenset(s.value for s in WAITING)
BULK_DEFAULT_LIMIT = 100


_IN_PROGRESS = {
    ("pause", "REQUESTED"): "RUNNING, pause requested: it becomes PAUSED at its next safe boundary (its next "
                            "heartbeat or checkpoint, once the handler has checkpointed and let go)",
    ("stop", "STOPPING"): "STOPPING: it becomes STOPPED when the handler lets go (forced after its grace period)",
    ("cancel", "STOPPING"): "STOPPING: it is stopped first, then CANCELLED",
}


def explain_reply(verb: str, reply: str) -> str:
    """What a command's reply means for an operator: the state the run is in now, and what happens
    next when the command takes effect later (a pause of a RUNNING run replies 'REQUESTED', which
    is not a state)."""
    return _IN_PROGRESS.get((verb, reply), reply)


class Control:
    """A client's operator commands (`client.control`; Client's methods of the same names delegate
    here), acting as its submit path's actor."""

    def __init__(self, path: SubmitPath) -> None:
        self.path = path
        self.stores = path.stores

    @property
    def actor(self) -> str:
        return self.path.actor

    async def pause(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """PENDING / RETRY_WAIT -> PAUSED now ('PAUSED'); RUNNING -> pause requested ('REQUESTED')."""
        return await self._command("pause", run_id, reason, expected_version)

    async def stop(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """RUNNING -> STOPPING; the run becomes STOPPED when the handler lets go (or is forced)."""
        return await self._command("stop", run_id, reason, expected_version)

    async def cancel(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """Not running: CANCELLED now. Running: stopped first, then CANCELLED ('STOPPING')."""
        run = await self._hot_run(run_id)
        spec = (await self._specs([run.handler])).get(run.handler)
        compensate = ""
        if spec is not None and spec.side_effects:
            compensate = spec.compensate or "!"  # '!': flag needs_compensation, nothing to enqueue
        return await self._command("cancel", run_id, reason, expected_version, run=run, compensate=compensate)

    async def resume(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """PAUSED / STOPPED -> PENDING: same run, next attempt starts from the latest checkpoint."""
        run = await self._hot_run(run_id)
        await self._check_resumable(run)
        return await self._command("resume", run_id, reason, expected_version, run=run)

    async def restart(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """From the beginning: the checkpoint is discarded (its generation is bumped)."""
        return await self._command("restart", run_id, reason, expected_version)

    async def retry(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """A dead-lettered run (FAILED / TIMED_OUT / CANCELLED) -> PENDING, keeping its checkpoint."""
        return await self._command("retry", run_id, reason, expected_version)

    async def run_now(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply:
        """A scheduled (PENDING, due later) or RETRY_WAIT run due now: one transition, event `run_now`, its
        due time the server's now (lua/run_now.lua); a run already due is refused."""
        return await self._command("run_now", run_id, reason, expected_version)

    async def resolve(self, run_id: int, *, as_: str, reason: str = "",
                      expected_version: int | None = None) -> Reply:
        """Close a review-queue run: `as_` is 'succeeded' or 'failed' (or 'retry' to run it again)."""
        if as_ not in ("succeeded", "failed", "retry"):
            raise InvalidInput(f"resolve --as must be succeeded, failed or retry, not {as_!r}", field="as")
        audit.reason(reason)
        run = await self._hot_run(run_id)
        if run.status != "FAILED" or run.reason != "review":
            raise InvalidInput(f"run {run_id} is not in the review queue (it is {run.status}, "
                               f"reason {run.reason})", field="run_id")
        if as_ == "retry":
            return await self.retry(run_id, reason=reason, expected_version=expected_version)
        return await self._command("resolve", run_id, reason, expected_version, run=run, outcome=as_)

    async def review_queue(self, *, queue: str | None = None, limit: int = 50) -> list[RunSummary]:
        """FAILED runs with reason `review`, waiting for an operator's `resolve`."""
        return [RunSummary(id=r.id, handler=r.handler, queue=r.queue, status="FAILED", attempt=r.attempt,
                           finished_at=r.finished_at, last_error_class=r.last_error_class, last_error=r.last_error,
                           reason="review")
                for r in await self.stores.db.rows("review_queue", queue, limit)]

    # -- queues --------------------------------------------------------------------------------
    async def pause_queue(self, queue: str, *, reason: str = "") -> None:
        """Nothing new is dispatched from the queue; running runs carry on."""
        await self._set_queue_paused(queue, True, reason)

    async def resume_queue(self, queue: str, *, reason: str = "") -> None:
        await self._set_queue_paused(queue, False, reason)

    async def _set_queue_paused(self, queue: str, paused: bool, reason: str) -> None:
        audit.reason(reason)
        db = self.stores.db
        action = "queue_paused" if paused else "queue_resumed"
        async with db.transaction() as tx:  # the change and its audit row commit together, or neither
            row = await db.row("pause_queue", queue, paused, conn=tx)  # PostgreSQL first: a rebuild restores it
            if row is None or not row.n:
                raise UnknownQueue(queue)
            await db.execute("queue_event", queue, action, self.actor, reason or None, conn=tx)
            await audit.write(db, tx, self.actor, action, queue=queue, reason_=reason)
        await self.stores.scripts.set_queue_paused(self.stores.keys(queue), paused)

    # -- bulk ----------------------------------------------------------------------------------
    async def bulk(self, command: str, *, queue: str, status: str | None = None, handler: str | None = None,
                   limit: int = BULK_DEFAULT_LIMIT, confirm: bool = False, reason: str = "",
                   until_id: int | None = None) -> BulkResult:
        """Apply a command to the runs of a queue that match; without `confirm` nothing changes
        and BulkNotConfirmed says how many match. At most `limit` runs are touched: the lowest
        ids that match, read once, so the runs acted on are exactly those selected (a run that
        changed state since is refused by its own compare-and-set and listed in `skipped` and `refused`).
        `until_id` bounds the selection to the ids a count saw (`bulk_count` gives it)."""
        audit.reason(reason)
        counted = await self.bulk_count(command, queue=queue, status=status, handler=handler, limit=limit,
                                        until_id=until_id)
        matched = counted.matched
        if not confirm:
            raise BulkNotConfirmed(matched, limit)
        bound = until_id if until_id is not None else counted.until_id
        ids = [r.id for r in await self.stores.db.rows("bulk_select", queue, status, handler, bound, limit)]
        selection = {"status": status, "handler": handler, "until_id": bound, "matched": matched}
        done = await self.act_on(command, ids, reason=reason, queue=queue, selection=selection)
        return msgspec.structs.replace(done, matched=matched, until_id=bound)

    async def bulk_count(self, command: str, *, queue: str, status: str | None = None, handler: str | None = None,
                         limit: int = BULK_DEFAULT_LIMIT, until_id: int | None = None) -> BulkCount:
        """What `bulk` would act on, counted (nothing changes): the runs matching now, bounded by the
        highest id seen (`until_id`), so a confirm acts on no run submitted after the count."""
        if command not in COMMANDS:
            raise InvalidInput(f"unknown command {command!r}; one of {', '.join(COMMANDS)}", field="command")
        if status is not None and status not in Status.__members__:
            raise InvalidInput(f"unknown status {status!r}", field="status")
        if limit < 1:
            raise InvalidInput("limit must be at least 1", field="limit")
        counted = await self.stores.db.row("bulk_count", queue, status, handler, until_id)
        assert counted is not None
        return BulkCount(command=command, queue=queue, status=status, handler=handler, matched=counted.matched,
                         limit=limit, acting=min(counted.matched, limit), until_id=counted.until_id)

    async def bulk_confirm(self, count: BulkCount, *, reason: str = "") -> BulkResult:
        """Act on the runs COUNT counted (those still matching, at most its limit, none newer)."""
        return await self.bulk(count.command, queue=count.queue, status=count.status, handler=count.handler,
                               limit=count.limit, confirm=True, reason=reason, until_id=count.until_id)

    async def act_on(self, command: str, ids: list[int], *, reason: str = "", queue: str | None = None,
                     selection: dict[str, Any] | None = None) -> BulkResult:
        """Apply a command to exactly these runs, one compare-and-set each; what a run refuses
        (its state changed, it is gone) is reported per run (`skipped`, `refused`) and does not stop
        the others. `matched` is the number of ids given, `acted` the number changed.

        One audit row (`bulk_<command>`: the filter, the count, the ids) is written before the
        first run is touched, so the operator's intent and its size are on record even if the
        act is interrupted; each run's own event follows as with a single command."""
        if command not in COMMANDS:
            raise InvalidInput(f"unknown command {command!r}; one of {', '.join(COMMANDS)}", field="command")
        audit.reason(reason)
        db = self.stores.db
        async with db.transaction() as tx:
            await audit.write(db, tx, self.actor, f"bulk_{command}", queue=queue, reason_=reason,
                              data={**(selection or {}), "runs": len(ids), "ids": ids[:1000]})
        done: dict[str, int] = {}
        changed: list[int] = []
        skipped: list[BulkSkip] = []
        for run_id in ids:
            try:
                state = await getattr(self, command)(run_id, reason=reason)
            except Exception as exc:  # one run's refusal never stops the others
                skipped.append(BulkSkip(id=run_id, reason=str(exc)))
                continue
            done[str(state)] = done.get(str(state), 0) + 1
            changed.append(run_id)
        return BulkResult(matched=len(ids), acted=len(changed), changed=changed, skipped=skipped, results=done,
                          refused={str(s.id): s.reason for s in skipped})

    # -- internals -----------------------------------------------------------------------------
    async def _hot_run(self, run_id: int) -> Any:
        """The run from the hot table only (get_hot_run's row Struct): an archived run (finished, moved
        to runs_archive) is history, and re-enqueuing it would run it with no row to record into; UnknownRun."""
        row = await self.stores.db.row("get_hot_run", run_id)
        if row is None:
            raise UnknownRun(run_id)
        return row

    async def _specs(self, names: list[str]) -> dict[str, JobSpec]:
        try:
            await self.path.load_definitions(set(names))
        except InvalidInput:
            pass
        defs = self.path.defs
        return {n: defs[n] for n in names if n in defs}

    async def _check_resumable(self, run: Any) -> None:
        """Refuse, with the reason, what cannot be resumed safely (RUN: `_hot_run`'s row); restart stays available."""
        run_id, name = run.id, run.handler
        spec = (await self._specs([name])).get(name)
        if spec is None:
            raise ResumeRefused(run_id, f"handler {name!r} is not registered any more")
        if not spec.resumable:
            raise ResumeRefused(run_id, f"handler {name!r} declares itself not resumable")
        ckpt = await self.stores.db.row("get_checkpoint", run_id)
        (hot,) = await self.stores.scripts.peek(self.stores.keys(run.queue), [run_id])
        gen = hot.gen if hot is not None else 0
        state = None
        if ckpt is not None and ckpt.state is not None and ckpt.gen == gen:
            sv = ckpt.schema_version
            if sv != spec.version and not (spec.migrates and sv < spec.version):
                raise ResumeRefused(run_id, f"its checkpoint has schema version {sv}, handler {name!r} is at "
                                            f"version {spec.version} and declares no migration from it")
            state = decode_result(ckpt.state)
        registry = self.path.registry
        handler = registry.handlers.get(name) if registry is not None else None
        if handler is not None and handler.resume_check is not None:
            args, kwargs = decode_payload(run.payload)
            problem = handler.resume_check(args, kwargs, state)
            if problem:
                raise ResumeRefused(run_id, problem)

    async def _command(self, verb: ControlVerb, run_id: int, reason: str, expected_version: int | None,
                       *, run: Any = None, compensate: str | None = None,
                       outcome: str | None = None) -> Reply:
        audit.reason(reason)  # before anything takes effect: a reason the history cannot hold is refused
        run = run if run is not None else await self._hot_run(run_id)
        keys = self.stores.keys(run.queue)
        base = ControlArgs(run_id, self.actor, reason or "",
                           "" if expected_version is None else expected_version)
        args = base
        if compensate is not None:
            args = CancelArgs(**msgspec.structs.asdict(base), compensate=compensate)
        elif outcome is not None:
            args = ResolveArgs(**msgspec.structs.asdict(base), outcome=outcome)
        try:
            return Reply(await self.stores.scripts.control_run(verb, keys, args))
        except UnknownRun:
            # Redis no longer holds the run (a finished run's hash expired, or drift): put
            # PostgreSQL's copy back, then ask again; the Lua still decides (compare-and-set).
            try:
                await self.path.requeue(run_row(run))
            except _UNHELD as exc:  # a row an older version stored, which Redis cannot hold (issue 22 item 8)
                return Reply(await self._unheld(verb, run, reason, exc))
            return Reply(await self.stores.scripts.control_run(verb, keys, args))

    async def _unheld(self, verb: str, run: Any, reason: str, exc: BaseException) -> str:
        """A command on a run Redis cannot hold (no script can apply it): a cancel of a waiting run
        is done in PostgreSQL alone, compare-and-set on the version read, with its event; any other
        command is a one-line InvalidInput naming what is wrong."""
        why = f"{type(exc).__name__}: {exc}"[:1000]
        if verb == "cancel" and run.status in _WAITING:
            row = await self.stores.db.row("cancel_unheld_run", run.id, self.actor, reason or "",
                                           f"stored values Redis cannot hold ({why})", "", run.version)
            if row is not None:
                return Status.CANCELLED.value
            raise InvalidInput(f"run {run.id} changed while it was being cancelled; retry", field="run_id")
        raise InvalidInput(f"run {run.id} has stored values Redis cannot hold ({why}); cancel it, or let the "
                           "reconciler quarantine it", field="timeout")
