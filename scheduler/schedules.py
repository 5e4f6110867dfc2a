"""The client's schedule commands: add, list, pause, resume, remove (rules in fencepost.core.schedules)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec

from fencepost.core.errors import InvalidInput
from fencepost.core.models import encode_payload
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

    async def add(self, spec: ScheduleSpec, *, now: datetime | None = None) -> dict[str, Any]:
        validated(spec)
        await self.client._load_definitions({spec.handler})
        try:
            payload = encode_payload(tuple(spec.args), dict(spec.kwargs))
        except (TypeError, msgspec.EncodeError) as exc:
            raise InvalidInput(f"arguments cannot be encoded: {exc}", field="args") from exc
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
        row = await self.db.fetchrow(
            "schedule_insert", spec.name, spec.handler, payload,
            json.dumps({"args": list(spec.args), "kwargs": spec.kwargs}, default=str), spec.queue,
            spec.priority, spec.cron, spec.interval_s, spec.timezone, first, spread, spec.catchup, window,
            spec.allow_overlap)
        if row is None:
            raise ScheduleExists(spec.name)
        offset = spread_offset_ms(row["id"], spread)
        if offset:
            await self.db.execute("schedule_set_offset", row["id"], offset)
        return await self.get(spec.name)

    async def get(self, name: str) -> dict[str, Any]:
        row = await self.db.fetchrow("schedule_get", name)
        if row is None:
            raise UnknownSchedule(name)
        return dict(row)

    async def list(self, *, limit: int = 100) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.db.fetch("schedule_list", limit)]

    async def set_paused(self, name: str, paused: bool, *, now: datetime | None = None) -> dict[str, Any]:
        """Pause keeps next_fire_time; resume coalesces what was missed (or backfills with catchup)."""
        if await self.db.fetchrow("schedule_pause", name, paused) is None:
            raise UnknownSchedule(name)
        return await self.get(name)

    async def remove(self, name: str) -> None:
        if await self.db.fetchrow("schedule_delete", name) is None:
            raise UnknownSchedule(name)

    async def runs(self, name: str, limit: int = 10) -> list[dict[str, Any]]:
        s = await self.get(name)
        return [dict(r) for r in await self.db.fetch("schedule_runs", s["id"], limit)]

    async def upcoming(self, name: str, n: int, *, now: datetime | None = None) -> Sequence[datetime]:
        s = await self.get(name)
        start = s["next_fire_time"]
        rest = next_fires(start, n - 1, cron=s["cron"], interval_s=s["interval_s"], tz=s["timezone"]) if n > 1 else []
        return [start, *rest][:n]
