"""Operator commands: pause, stop, cancel, resume, restart, retry (one run or a bounded
bulk selection) and queue pause/resume.

Each run command is one Lua compare-and-set on the run's hot state (never queued behind
jobs, so it works while workers are saturated) and becomes an event with actor and reason.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from fencepost.core.errors import BulkNotConfirmed, InvalidInput, ResumeRefused, UnknownQueue, UnknownRun
from fencepost.core.hot import CancelArgs, ControlArgs, ControlVerb, ResolveArgs
from fencepost.core.models import decode_payload, decode_result, run_row
from fencepost.core.states import Status

if TYPE_CHECKING:
    from fencepost.client import Client

__all__ = ["BULK_DEFAULT_LIMIT", "COMMANDS", "ControlMixin"]

COMMANDS = ("pause", "stop", "cancel", "resume", "restart", "retry")
BULK_DEFAULT_LIMIT = 100


class ControlMixin:
    """Mixed into Client."""

    async def pause(self: Client, run_id: int, *, reason: str = "", expected_version: int | None = None) -> str:
        """PENDING / RETRY_WAIT -> PAUSED now ('PAUSED'); RUNNING -> pause requested ('REQUESTED')."""
        return await self._command("pause", run_id, reason, expected_version)

    async def stop(self: Client, run_id: int, *, reason: str = "", expected_version: int | None = None) -> str:
        """RUNNING -> STOPPING; the run becomes STOPPED when the handler lets go (or is forced)."""
        return await self._command("stop", run_id, reason, expected_version)

    async def cancel(self: Client, run_id: int, *, reason: str = "", expected_version: int | None = None) -> str:
        """Not running: CANCELLED now. Running: stopped first, then CANCELLED ('STOPPING')."""
        run = await self._hot_run(run_id)
        spec = (await self._specs([run["handler"]])).get(run["handler"])
        compensate = ""
        if spec is not None and spec.side_effects:
            compensate = spec.compensate or "!"  # '!': flag needs_compensation, nothing to enqueue
        return await self._command("cancel", run_id, reason, expected_version, run=run, compensate=compensate)

    async def resume(self: Client, run_id: int, *, reason: str = "", expected_version: int | None = None) -> str:
        """PAUSED / STOPPED -> PENDING: same run, next attempt starts from the latest checkpoint."""
        run = await self._hot_run(run_id)
        await self._check_resumable(run)
        return await self._command("resume", run_id, reason, expected_version, run=run)

    async def restart(self: Client, run_id: int, *, reason: str = "", expected_version: int | None = None) -> str:
        """From the beginning: the checkpoint is discarded (its generation is bumped)."""
        return await self._command("restart", run_id, reason, expected_version)

    async def retry(self: Client, run_id: int, *, reason: str = "", expected_version: int | None = None) -> str:
        """A dead-lettered run (FAILED / TIMED_OUT / CANCELLED) -> PENDING, keeping its checkpoint."""
        return await self._command("retry", run_id, reason, expected_version)

    async def resolve(self: Client, run_id: int, *, as_: str, reason: str = "",
                      expected_version: int | None = None) -> str:
        """Close a review-queue run: `as_` is 'succeeded' or 'failed' (or 'retry' to run it again)."""
        if as_ not in ("succeeded", "failed", "retry"):
            raise InvalidInput(f"resolve --as must be succeeded, failed or retry, not {as_!r}", field="as")
        run = await self._hot_run(run_id)
        if run["status"] != "FAILED" or run.get("reason") != "review":
            raise InvalidInput(f"run {run_id} is not in the review queue (it is {run['status']}, "
                               f"reason {run.get('reason')})", field="run_id")
        if as_ == "retry":
            return await self.retry(run_id, reason=reason, expected_version=expected_version)
        return await self._command("resolve", run_id, reason, expected_version, run=run, outcome=as_)

    async def review_queue(self: Client, *, queue: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.stores.db.fetch("review_queue", queue, limit)]

    # -- queues --------------------------------------------------------------------------------
    async def pause_queue(self: Client, queue: str, *, reason: str = "") -> None:
        """Nothing new is dispatched from the queue; running runs carry on."""
        await self._set_queue_paused(queue, True, reason)

    async def resume_queue(self: Client, queue: str, *, reason: str = "") -> None:
        await self._set_queue_paused(queue, False, reason)

    async def _set_queue_paused(self: Client, queue: str, paused: bool, reason: str) -> None:
        db = self.stores.db
        if await db.fetchrow("queue_exists", queue) is None:
            raise UnknownQueue(queue)
        await db.fetchrow("pause_queue", queue, paused)  # PostgreSQL first: a rebuild restores it
        keys = self.stores.keys(queue)
        if paused:
            await self.stores.redis.set(keys.paused, 1)
        else:
            await self.stores.redis.delete(keys.paused)
            await self.stores.redis.rpush(keys.wake, 1)
        await db.execute("queue_event", queue, "queue_paused" if paused else "queue_resumed", self.actor, reason or None)

    # -- bulk ----------------------------------------------------------------------------------
    async def bulk(self: Client, command: str, *, queue: str, status: str | None = None, handler: str | None = None,
                   limit: int = BULK_DEFAULT_LIMIT, confirm: bool = False, reason: str = "") -> dict[str, Any]:
        """Apply a command to the runs of a queue that match; without `confirm` nothing changes
        and BulkNotConfirmed says how many match. At most `limit` runs are touched."""
        if command not in COMMANDS:
            raise InvalidInput(f"unknown command {command!r}; one of {', '.join(COMMANDS)}", field="command")
        if status is not None and status not in Status.__members__:
            raise InvalidInput(f"unknown status {status!r}", field="status")
        if limit < 1:
            raise InvalidInput("limit must be at least 1", field="limit")
        matched = (await self.stores.db.fetchrow("count_matching", queue, status, handler))[0]
        if not confirm:
            raise BulkNotConfirmed(matched, limit)
        ids = [r["id"] for r in await self.stores.db.fetch("select_matching", queue, status, handler, limit)]
        done: dict[str, int] = {}
        refused: dict[int, str] = {}
        for run_id in ids:
            try:
                state = await getattr(self, command)(run_id, reason=reason)
                done[state] = done.get(state, 0) + 1
            except (InvalidInput, UnknownRun, ResumeRefused) as exc:
                refused[run_id] = str(exc)
            except Exception as exc:
                refused[run_id] = str(exc)
        return {"matched": matched, "acted": len(ids), "results": done, "refused": refused}

    # -- internals -----------------------------------------------------------------------------
    async def _hot_run(self: Client, run_id: int) -> dict[str, Any]:
        """The run from the hot table only: an archived run (finished, moved to runs_archive) is
        history, and re-enqueuing it would run it with no row to record into; UnknownRun."""
        row = await self.stores.db.fetchrow("get_hot_run", run_id)
        if row is None:
            raise UnknownRun(run_id)
        return dict(row)

    async def _specs(self: Client, names: list[str]) -> dict[str, Any]:
        try:
            await self._load_definitions(set(names))
        except InvalidInput:
            pass
        return {n: self._defs[n] for n in names if n in self._defs}

    async def _check_resumable(self: Client, run: dict[str, Any]) -> None:
        """Refuse, with the reason, what cannot be resumed safely; restart stays available."""
        run_id, name = run["id"], run["handler"]
        spec = (await self._specs([name])).get(name)
        if spec is None:
            raise ResumeRefused(run_id, f"handler {name!r} is not registered any more")
        if not spec.resumable:
            raise ResumeRefused(run_id, f"handler {name!r} declares itself not resumable")
        ckpt = await self.stores.db.fetchrow("get_checkpoint", run_id)
        gen_raw = await self.stores.redis.hget(self.stores.keys(run["queue"]).run(run_id), "gen")
        gen = int(gen_raw) if gen_raw else 0
        state = None
        if ckpt is not None and ckpt["state"] is not None and ckpt["gen"] == gen:
            sv = ckpt["schema_version"]
            if sv != spec.version and not (spec.migrates and sv < spec.version):
                raise ResumeRefused(run_id, f"its checkpoint has schema version {sv}, handler {name!r} is at "
                                            f"version {spec.version} and declares no migration from it")
            state = decode_result(ckpt["state"])
        handler = self.registry.handlers.get(name) if self.registry is not None else None
        if handler is not None and handler.resume_check is not None:
            args, kwargs = decode_payload(run["payload"])
            problem = handler.resume_check(args, kwargs, state)
            if problem:
                raise ResumeRefused(run_id, problem)

    async def _command(self: Client, verb: ControlVerb, run_id: int, reason: str, expected_version: int | None,
                       *, run: dict[str, Any] | None = None, compensate: str | None = None,
                       outcome: str | None = None) -> str:
        run = run or await self._hot_run(run_id)
        keys = self.stores.keys(run["queue"])
        base = ControlArgs(int(time.time() * 1000), run_id, self.actor, reason or "",
                           "" if expected_version is None else expected_version)
        args = base
        if compensate is not None:
            args = CancelArgs(*msgspec.structs.astuple(base), compensate=compensate)
        elif outcome is not None:
            args = ResolveArgs(*msgspec.structs.astuple(base), outcome=outcome)
        try:
            return await self.stores.scripts.control_run(verb, keys, args)
        except UnknownRun:
            # Redis no longer holds the run (a finished run's hash expired, or drift): put
            # PostgreSQL's copy back, then ask again; the Lua still decides (compare-and-set).
            await self.stores.scripts.enqueue_runs(keys, [run_row(run)])
            return await self.stores.scripts.control_run(verb, keys, args)
