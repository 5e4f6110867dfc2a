"""The client's schedule commands: add, list, pause, resume, remove (rules in fencepost.core.schedules)."""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec

from fencepost.core import audit
from fencepost.core.errors import InvalidInput
from fencepost.core.models import encode_payload
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

if TYPE_CHECKING:
    from fencepost.client import Client

__all__ = ["Schedules"]

_UTC = UTC


class Schedules:
    """Add, list, pause, resume and remove schedules (validated before anything is written)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.db = client.stores.db

    async def add(self, spec: ScheduleSpec, *, now: datetime | None = None, reason: str = "") -> dict[str, Any]:
        """Store a schedule; its audit row (actor, reason) commits with it."""
        validated(spec)
        if "/" in spec.name:  # /v1/schedules/{name} could never reach it
            raise InvalidInput(f"schedule name {spec.name!r} must not contain '/'", field="name")
        audit.reason(reason)
        await self.client._load_definitions({spec.handler})
        try:
            payload = encode_payload(tuple(spec.args), dict(spec.kwargs))
            shown = json.dumps({"args": list(spec.args), "kwargs": spec.kwargs}, default=str, allow_nan=False)
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            raise InvalidInput(f"arguments cannot be encoded: {exc}", field="args") from exc
        if "\\u0000" in shown:  # jsonb refuses NUL
            raise InvalidInput("arguments must not contain NUL characters", field="args")
        if len(payload) > self.client.settings.max_payload_bytes:
            raise InvalidInput("payload too large", field="args")
        now = now or datetime.now(_UTC)
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
            offset = spread_offset_ms(row["id"], spread)
            if offset:
                await self.db.execute("schedule_set_offset", row["id"], offset, conn=tx)
            await audit.write(self.db, tx, self.client.actor, "schedule_added", queue=await self.queue_of(spec),
                              target=spec.name, reason_=reason,
                              data={"handler": spec.handler, "cron": spec.cron, "interval_s": spec.interval_s})
        return await self.get(spec.name)

    async def _insert(self, tx: Session, spec: ScheduleSpec, payload: bytes, shown: str, first: datetime,
                      spread: float, window: float | None) -> Any:
        return await self.db.fetchrow(
            "schedule_insert", spec.name, spec.handler, payload,
            shown, spec.queue,
            spec.priority, spec.cron, spec.interval_s, spec.timezone, first, spread, spec.catchup, window,
            spec.allow_overlap, conn=tx)

    async def get(self, name: str) -> dict[str, Any]:
        row = await self.db.fetchrow("schedule_get", name)
        if row is None:
            raise UnknownSchedule(name)
        return dict(row)

    async def list(self, *, limit: int = 100) -> builtins.list[dict[str, Any]]:  # `list` here is this method
        return [dict(r) for r in await self.db.fetch("schedule_list", limit)]

    async def set_paused(self, name: str, paused: bool, *, now: datetime | None = None,
                         reason: str = "") -> dict[str, Any]:
        """Pause keeps next_fire_time; resume coalesces what was missed (or backfills with catchup)."""
        audit.reason(reason)
        async with self.db.transaction() as tx:
            if await self.db.fetchrow("schedule_pause", name, paused, conn=tx) is None:
                raise UnknownSchedule(name)
            await audit.write(self.db, tx, self.client.actor, "schedule_paused" if paused else "schedule_resumed",
                              queue=await self.queue_named(name, tx), target=name, reason_=reason)
        return await self.get(name)

    async def remove(self, name: str, *, reason: str = "") -> None:
        audit.reason(reason)
        async with self.db.transaction() as tx:
            queue = await self.queue_named(name, tx)
            if await self.db.fetchrow("schedule_delete", name, conn=tx) is None:
                raise UnknownSchedule(name)
            await audit.write(self.db, tx, self.client.actor, "schedule_removed", queue=queue, target=name,
                              reason_=reason)

    async def queue_named(self, name: str, conn: Session | None = None) -> str | None:
        """The queue a stored schedule fires into (its own, else its handler's), None if unknown."""
        row = await self.db.fetchrow("schedule_queues", [name], conn=conn)
        return None if row is None else row["queue"]

    async def queue_of(self, spec: ScheduleSpec) -> str:
        """The queue a schedule fires into: its own, else its handler's declared queue."""
        if spec.queue is not None:
            return spec.queue
        await self.client._load_definitions({spec.handler})
        return self.client._defs[spec.handler].queue

    async def list_scoped(self, *, limit: int = 100, queues: builtins.list[str] | None = None
                          ) -> builtins.list[dict[str, Any]]:
        """Schedules, only those firing into `queues` when given (a scoped token's view)."""
        return [dict(r) for r in await self.db.fetch("schedule_list_scoped", limit, queues)]

    async def runs(self, name: str, limit: int = 10) -> builtins.list[dict[str, Any]]:
        s = await self.get(name)
        return [dict(r) for r in await self.db.fetch("schedule_runs", s["id"], limit)]

    async def upcoming(self, name: str, n: int, *, now: datetime | None = None) -> Sequence[datetime]:
        s = await self.get(name)
        start = s["next_fire_time"]
        rest = next_fires(start, n - 1, cron=s["cron"], interval_s=s["interval_s"], tz=s["timezone"]) if n > 1 else []
        return [start, *rest][:n]
