"""The client's schedule commands: add, update, run now, list, pause, resume, remove (rules in
fencepost.core.schedules)."""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Protocol

import msgspec

from fencepost.core import audit, validate
from fencepost.core.errors import IllegalTransition, InvalidInput
from fencepost.core.models import decode_payload
from fencepost.core.record import Session
from fencepost.core.schedules import (
    ScheduleExists,
    ScheduleSpec,
    UnknownSchedule,
    next_fire_after,
    next_fires,
    spread_offset_ms,
    validated,
)
from fencepost.core.submit import SubmitPath, encode_arguments, fire_row
from fencepost.core.views import Schedule, ScheduleRun, view

__all__ = ["ScheduleUpdate", "Schedules"]

_UTC = UTC

_UNSET: Any = msgspec.UNSET



class ScheduleUpdate(msgspec.Struct, kw_only=True, frozen=True):
    """Fields to change in a stored schedule; the others keep their values. Giving cron clears
    the interval and the other way round. A change of cron, interval, timezone or start_at
    recomputes the next fire from now; any other change keeps it."""

    handler: Annotated[str, validate.meta("handler")] | msgspec.UnsetType = _UNSET
    args: tuple[Any, ...] | msgspec.UnsetType = _UNSET
    kwargs: dict[str, Any] | msgspec.UnsetType = _UNSET
    cron: Annotated[str, msgspec.Meta(max_length=200)] | msgspec.UnsetType = _UNSET
    interval_s: Annotated[float, validate.meta("interval_s")] | msgspec.UnsetType = _UNSET
    timezone: Annotated[str, msgspec.Meta(max_length=64)] | msgspec.UnsetType = _UNSET
    queue: str | msgspec.UnsetType | None = _UNSET
    priority: Annotated[int, validate.meta("priority")] | msgspec.UnsetType | None = _UNSET
    spread_s: Annotated[float, validate.meta("spread_s")] | msgspec.UnsetType = _UNSET
    catchup: bool | msgspec.UnsetType = _UNSET
    catchup_window_s: Annotated[float, validate.meta("catchup_window_s")] | msgspec.UnsetType | None = _UNSET
    allow_overlap: bool | msgspec.UnsetType = _UNSET
    start_at: datetime | msgspec.UnsetType = _UNSET

    def changes(self) -> dict[str, Any]:
        return {f: v for f in self.__struct_fields__ if (v := getattr(self, f)) is not _UNSET}


class Producer(Protocol):
    """Anything that submits through a SubmitPath (a Client: `Schedules(client)`)."""

    @property
    def submitter(self) -> SubmitPath: ...


class Schedules:
    """Add, list, pause, resume and remove schedules (validated before anything is written), and
    fire one now, through the submit path given (or the producer's, `Schedules(client)`)."""

    def __init__(self, via: SubmitPath | Producer) -> None:
        self.path = via if isinstance(via, SubmitPath) else via.submitter
        self.db = self.path.stores.db

    async def add(self, spec: ScheduleSpec, *, now: datetime | None = None, reason: str = "") -> Schedule:
        """Store a schedule; its audit row (actor, reason) commits with it."""
        validated(spec)
        if "/" in spec.name:  # /v1/schedules/{name} could never reach it
            raise InvalidInput(f"schedule name {spec.name!r} must not contain '/'", field="name")
        audit.reason(reason)
        await self.path.load_definitions({spec.handler})
        payload, shown = self._encoded(spec)
        now = now or await self.path.server_now()  # the server's clock, not this host's (docs/clock.md)
        start = max(now, spec.start_at) if spec.start_at else now
        if spec.cron is not None:
            first = next_fire_after(start - timedelta(microseconds=1), cron=spec.cron, interval_s=None,
                                    tz=spec.timezone)
        else:
            first = start
        spread = 0.0 if spec.exact else spec.spread_s
        window = spec.catchup_window_s if spec.catchup_window_s is not None else (86400.0 if spec.catchup else None)
        async with self.db.transaction() as tx:
            row = await self._insert(tx, spec, payload, shown, first, spread, window)
            if row is None:
                raise ScheduleExists(spec.name)
            offset = spread_offset_ms(row.id, spread)
            if offset:
                await self.db.execute("schedule_set_offset", row.id, offset, conn=tx)
            await audit.write(self.db, tx, self.path.actor, "schedule_added", queue=await self.queue_of(spec),
                              target=spec.name, reason_=reason,
                              data={"handler": spec.handler, "cron": spec.cron, "interval_s": spec.interval_s})
        return await self.get(spec.name)

    async def update(self, name: str, change: ScheduleUpdate, *, now: datetime | None = None,
                     reason: str = "") -> Schedule:
        """Edit a schedule in place (its id, history and counters stay): the merged definition is
        validated as a new one would be, then written with its audit row in one transaction."""
        audit.reason(reason)
        changes = change.changes()
        if not changes:
            raise InvalidInput("nothing to change: give at least one field", field="update")
        if "cron" in changes and "interval_s" in changes:
            raise InvalidInput("give exactly one of cron or interval", field="cron")
        now = now or await self.path.server_now()  # the server's clock, not this host's (docs/clock.md)
        async with self.db.transaction() as tx:
            old = await self.db.row("schedule_lock", name, conn=tx)
            if old is None:
                raise UnknownSchedule(name)
            args, kwargs = decode_payload(old.payload)
            spec = ScheduleSpec(
                name=name, handler=changes.get("handler", old.handler),
                args=tuple(changes.get("args", args)), kwargs=dict(changes.get("kwargs", kwargs)),
                cron=changes["cron"] if "cron" in changes else (None if "interval_s" in changes else old.cron),
                interval_s=changes["interval_s"] if "interval_s" in changes else (
                    None if "cron" in changes else old.interval_s),
                timezone=changes.get("timezone", old.timezone), queue=changes.get("queue", old.queue),
                priority=changes.get("priority", old.priority), spread_s=changes.get("spread_s", old.spread_s),
                catchup=changes.get("catchup", old.catchup),
                catchup_window_s=changes.get("catchup_window_s", old.catchup_window_s),
                allow_overlap=changes.get("allow_overlap", old.allow_overlap), start_at=changes.get("start_at"))
            validated(spec)
            await self.path.load_definitions({spec.handler})
            payload, shown = self._encoded(spec)
            timing = {"cron", "interval_s", "timezone", "start_at"} & changes.keys()
            nxt = old.next_fire_time
            if timing or old.quarantined is not None:
                start = max(now, spec.start_at) if spec.start_at else now
                nxt = (next_fire_after(start - timedelta(microseconds=1), cron=spec.cron, interval_s=None,
                                       tz=spec.timezone) if spec.cron is not None else start)
            offset = spread_offset_ms(old.id, spec.spread_s)
            await self.db.row(
                "schedule_update", old.id, spec.handler, payload, shown, spec.queue, spec.priority, spec.cron,
                spec.interval_s, spec.timezone, nxt, spec.spread_s, offset, spec.catchup, spec.catchup_window_s,
                spec.allow_overlap, conn=tx)
            before = {"handler": old.handler, "args": list(args), "kwargs": kwargs, "cron": old.cron,
                      "interval_s": old.interval_s, "timezone": old.timezone, "queue": old.queue,
                      "priority": old.priority, "spread_s": old.spread_s, "catchup": old.catchup,
                      "catchup_window_s": old.catchup_window_s, "allow_overlap": old.allow_overlap}
            after = {k: (list(v) if isinstance(v, tuple) else v) for k, v in msgspec.structs.asdict(spec).items()}
            diff = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
            if "start_at" in changes:
                diff["start_at"] = [None, spec.start_at.isoformat() if spec.start_at else None]
            await audit.write(self.db, tx, self.path.actor, "schedule_updated", queue=await self.queue_of(spec),
                              target=name, reason_=reason, data={"changed": diff, "next_fire_time": nxt.isoformat()})
        return await self.get(name)

    async def run_now(self, name: str, *, now: datetime | None = None, reason: str = "") -> int:
        """Fire the schedule once now (its next scheduled fire does not move); returns the run id.

        The run is the schedule's (fire_time = now, listed by `schedule show`), so overlap rules
        hold both ways: refused while the previous run is active unless allow_overlap is set,
        and a scheduled fire is skipped while this run is active."""
        audit.reason(reason)
        now = now or await self.path.server_now()  # the server's clock, not this host's (docs/clock.md)
        async with self.db.transaction() as tx:
            s = await self.db.row("schedule_lock", name, conn=tx)
            if s is None:
                raise UnknownSchedule(name)
            if s.busy:
                raise IllegalTransition(s.last_run_id, s.last_status or "active",
                                        f"run schedule {name!r} now: its previous run is still active and "
                                        "allow_overlap is off")
            if s.def_max_retries is None:
                await self.path.load_definitions({s.handler})  # raises UnknownHandler
            queue = s.fires_into or "default"
            row = fire_row(schedule_id=s.id, handler=s.handler, queue=queue, payload=s.payload,
                           priority=s.fire_priority, max_retries=s.def_max_retries,
                           timeout_s=s.def_timeout_s, fire_time=now, run_at=now)
            ids, created, new_queues = await self.path.insert(None, [row], tx)
            if not created:
                raise InvalidInput(f"schedule {name!r} already fired at {now.isoformat()}; retry", field="name")
            await self.db.execute("schedule_fired_now", s.id, ids[0], now, conn=tx)
            await audit.write(self.db, tx, self.path.actor, "schedule_run_now", queue=queue, target=name,
                              reason_=reason, data={"run_id": ids[0], "fire_time": now.isoformat()})
        await self.path.deliver(ids, created, [row], new_queues)
        return ids[0]

    def _encoded(self, spec: ScheduleSpec) -> tuple[bytes, str]:
        """The payload each fire carries, checked as a submit's is (SubmitPath: InvalidInput, or
        PayloadTooLarge), and the arguments as JSON for display."""
        payload = encode_arguments(spec.args, spec.kwargs, self.path.stores.settings)
        try:
            shown = json.dumps({"args": list(spec.args), "kwargs": spec.kwargs}, default=str, allow_nan=False)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidInput(f"arguments cannot be encoded: {exc}", field="args") from exc
        if "\\u0000" in shown:  # jsonb refuses NUL
            raise InvalidInput("arguments must not contain NUL characters", field="args")
        return payload, shown

    async def _insert(self, tx: Session, spec: ScheduleSpec, payload: bytes, shown: str, first: datetime,
                      spread: float, window: float | None) -> Any:
        return await self.db.row(
            "schedule_insert", spec.name, spec.handler, payload,
            shown, spec.queue,
            spec.priority, spec.cron, spec.interval_s, spec.timezone, first, spread, spec.catchup, window,
            spec.allow_overlap, conn=tx)

    async def get(self, name: str) -> Schedule:
        """The stored schedule (`args_json` as PostgreSQL gives it, JSON text: `Schedule.decoded()` parses it)."""
        row = await self.db.row("schedule_get", name)
        if row is None:
            raise UnknownSchedule(name)
        return view(Schedule, row)

    async def list(self, *, limit: int = 100) -> builtins.list[Schedule]:  # `list` here is this method
        return [view(Schedule, r) for r in await self.db.rows("schedule_list", limit)]

    async def set_paused(self, name: str, paused: bool, *, now: datetime | None = None,
                         reason: str = "") -> Schedule:
        """Pause keeps next_fire_time; resume coalesces what was missed (or backfills with catchup)."""
        audit.reason(reason)
        if not paused:
            why = (await self.get(name)).quarantined
            if why is not None:  # resumed as it is, it would fail the trigger again (and be quarantined again)
                raise InvalidInput(f"schedule {name!r} is quarantined ({why}); fix it with `fencepost schedule "
                                   "update`, which checks it and resumes it", field="name")
        async with self.db.transaction() as tx:
            if await self.db.row("schedule_pause", name, paused, conn=tx) is None:
                raise UnknownSchedule(name)
            await audit.write(self.db, tx, self.path.actor, "schedule_paused" if paused else "schedule_resumed",
                              queue=await self.queue_named(name, tx), target=name, reason_=reason)
        return await self.get(name)

    async def remove(self, name: str, *, reason: str = "") -> None:
        audit.reason(reason)
        async with self.db.transaction() as tx:
            queue = await self.queue_named(name, tx)
            if await self.db.row("schedule_delete", name, conn=tx) is None:
                raise UnknownSchedule(name)
            await audit.write(self.db, tx, self.path.actor, "schedule_removed", queue=queue, target=name,
                              reason_=reason)

    async def queue_named(self, name: str, conn: Session | None = None) -> str | None:
        """The queue a stored schedule fires into (its own, else its handler's), None if unknown."""
        row = await self.db.row("schedule_queues", [name], conn=conn)
        return None if row is None else row.queue

    async def queue_of(self, spec: ScheduleSpec) -> str:
        """The queue a schedule fires into: its own, else its handler's declared queue."""
        if spec.queue is not None:
            return spec.queue
        await self.path.load_definitions({spec.handler})
        return self.path.defs[spec.handler].queue

    async def list_scoped(self, *, limit: int = 100, queues: builtins.list[str] | None = None
                          ) -> builtins.list[Schedule]:
        """Schedules, only those firing into `queues` when given (a scoped token's view)."""
        return [view(Schedule, r) for r in await self.db.rows("schedule_list_scoped", limit, queues)]

    async def runs(self, name: str, limit: int = 10) -> builtins.list[ScheduleRun]:
        """The runs the schedule fired, latest fire first."""
        s = await self.get(name)
        return [view(ScheduleRun, r) for r in await self.db.rows("schedule_runs", s.id, limit)]

    async def upcoming(self, name: str, n: int, *, now: datetime | None = None) -> Sequence[datetime]:
        s = await self.get(name)
        start = s.next_fire_time
        rest = next_fires(start, n - 1, cron=s.cron, interval_s=s.interval_s, tz=s.timezone) if n > 1 else []
        return [start, *rest][:n]
