"""Recurring schedules: fire-time arithmetic (cron in an IANA timezone, or a fixed
interval), validation and the stable spread offset (the commands are fencepost.schedules).

DST (cron schedules are read in the schedule's local wall-clock time):

* A local time that does not exist (spring forward, e.g. 02:30 on the night clocks jump
  from 02:00 to 03:00) fires once, at the first valid instant after it: the moment the
  clocks jump (03:00 local). Several skipped times (a `*/15 2 * * *` line) collapse into
  that one fire.
* A local time that happens twice (fall back, e.g. 02:30 on the night clocks go from
  03:00 back to 02:00) fires once, at its first occurrence (the earlier UTC instant).
  The repeated hour fires nothing more, so an hourly job fires 24 times on a 25-hour day.

Interval schedules are elapsed time (every `interval_s` seconds from their first fire)
and ignore the timezone and DST entirely.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
from croniter import croniter

from fencepost.core import validate
from fencepost.core.errors import FencepostError, InvalidInput
from fencepost.core.keys import valid_queue_name

__all__ = [
    "InvalidCron",
    "InvalidTimezone",
    "ScheduleExists",
    "ScheduleSpec",
    "UnknownSchedule",
    "next_fire_after",
    "next_fires",
    "spread_offset_ms",
    "validated",
    "zone",
]

_UTC = UTC


class InvalidCron(InvalidInput):
    def __init__(self, cron: str, why: str) -> None:
        super().__init__(f"invalid cron expression {cron!r}: {why}", field="cron")
        self.cron = cron


class InvalidTimezone(InvalidInput):
    def __init__(self, tz: str) -> None:
        super().__init__(f"unknown timezone {tz!r}: use an IANA name such as 'Europe/Paris' or 'UTC'",
                         field="timezone")
        self.timezone = tz


class UnknownSchedule(FencepostError, LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}")
        self.name = name


class ScheduleExists(InvalidInput):
    def __init__(self, name: str) -> None:
        super().__init__(f"a schedule named {name!r} already exists (remove it first, or pick another name)",
                         field="name")
        self.name = name


class ScheduleSpec(msgspec.Struct, kw_only=True, frozen=True):
    """A recurring schedule as given by a caller (CLI or API). The constraints come from
    fencepost.core.validate (the API decodes with them; `validated` checks them again for
    specs built in Python)."""

    name: Annotated[str, validate.meta("name")]
    handler: Annotated[str, validate.meta("handler")]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    cron: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    interval_s: Annotated[float, validate.meta("interval_s")] | None = None
    timezone: Annotated[str, msgspec.Meta(max_length=64)] = "UTC"
    queue: str | None = None
    priority: Annotated[int, validate.meta("priority")] | None = None
    spread_s: Annotated[float, validate.meta("spread_s")] = 0.0
    """Fires land at fire_time + a stable offset in [0, spread_s) (0 or exact: on time)."""
    exact: bool = False
    catchup: bool = False
    catchup_window_s: Annotated[float, validate.meta("catchup_window_s")] | None = None
    """With catchup: backfill only missed fires at most this old (None: 1 day)."""
    allow_overlap: bool = False
    start_at: datetime | None = None
    """First fire no earlier than this (default: now)."""


# -- time arithmetic ---------------------------------------------------------------------------
@lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    if not name or name.startswith(("/", ".")) or ".." in name:
        raise InvalidTimezone(name)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidTimezone(name) from None


def validate_cron(expr: str) -> None:
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidCron(str(expr), "empty")
    if len(expr.split()) != 5:
        raise InvalidCron(expr, f"expected 5 fields (minute hour day month weekday), got {len(expr.split())}")
    if validate.unsafe_char(expr) is not None or len(expr) > 200:
        raise InvalidCron(expr, "must be at most 200 printable characters")
    try:
        it = croniter(expr, datetime(2000, 1, 1))
    except (ValueError, KeyError, TypeError) as exc:  # croniter's CroniterBadCronError is a ValueError
        raise InvalidCron(expr, str(exc) or type(exc).__name__) from None
    try:  # a valid line may still never fire ('0 0 30 2 *': February 30th)
        it.get_next(datetime)
    except (ValueError, KeyError, TypeError):  # CroniterBadDateError is a ValueError too
        raise InvalidCron(expr, "never fires (no date matches it)") from None


def _local_to_utc(naive: datetime, tz: ZoneInfo) -> datetime:
    """A local wall-clock time as a UTC instant: the first occurrence when it is repeated,
    the first valid instant after it (the moment of the jump) when it does not exist."""
    first = naive.replace(tzinfo=tz, fold=0)
    u0 = first.astimezone(_UTC)
    if u0.astimezone(tz).replace(tzinfo=None) == naive:
        u1 = naive.replace(tzinfo=tz, fold=1).astimezone(_UTC)
        return min(u0, u1)  # repeated: the earlier instant (fold=0 is the earlier for zoneinfo)
    # Skipped: the transition lies between the two readings; find it to the second.
    lo, hi = sorted((u0, naive.replace(tzinfo=tz, fold=1).astimezone(_UTC)))
    off_lo = lo.astimezone(tz).utcoffset()
    while (hi - lo) > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).utcoffset() == off_lo:
            lo = mid
        else:
            hi = mid
    return hi.replace(microsecond=0)


@lru_cache(maxsize=65536)
def _cron_next(expr: str, tz_name: str, after: datetime) -> datetime:
    """The first fire strictly after `after` (UTC). Cached: 100,000 schedules with the same
    line firing at the same time cost one computation."""
    tz = zone(tz_name)
    local = after.astimezone(tz).replace(tzinfo=None)
    # Start one hour back so a repeated (fall-back) hour is walked from its first reading.
    it = croniter(expr, local - timedelta(hours=1, seconds=1))
    for _ in range(100_000):
        cand = _local_to_utc(it.get_next(datetime), tz)
        if cand > after:
            return cand
    raise InvalidCron(expr, "never fires")


def next_fire_after(after: datetime, *, cron: str | None, interval_s: float | None, tz: str = "UTC",
                    anchor: datetime | None = None) -> datetime:
    """The next logical fire time strictly after `after`. Interval fires are anchor + k*interval."""
    if cron is not None:
        return _cron_next(cron, tz, after.astimezone(_UTC))
    assert interval_s is not None
    step = timedelta(seconds=interval_s)
    if anchor is None or anchor > after:
        return anchor if anchor is not None else after + step
    k = math.floor((after - anchor) / step) + 1
    return anchor + k * step


def next_fires(after: datetime, n: int, *, cron: str | None = None, interval_s: float | None = None,
               tz: str = "UTC") -> list[datetime]:
    """The next `n` fire times after `after` (what `fencepost schedule next` prints)."""
    zone(tz)
    if cron is not None:
        validate_cron(cron)
    if interval_s is not None:
        validate.number("interval_s", interval_s)
    out: list[datetime] = []
    t = after
    anchor = after + timedelta(seconds=interval_s) if interval_s else None
    for _ in range(n):
        t = next_fire_after(t, cron=cron, interval_s=interval_s, tz=tz, anchor=anchor)
        out.append(t)
    return out


def fires_between(start: datetime, until: datetime, *, cron: str | None, interval_s: float | None,
                  tz: str, limit: int) -> Iterator[datetime]:
    """Fire times f with start <= f <= until (start itself is a fire time), at most `limit`."""
    t = start
    n = 0
    while t <= until and n < limit:
        yield t
        n += 1
        t = next_fire_after(t, cron=cron, interval_s=interval_s, tz=tz, anchor=start)


def spread_offset_ms(schedule_id: int, spread_s: float) -> int:
    """A stable offset in [0, spread) from a hash of the schedule id (same on every host)."""
    spread_ms = int(spread_s * 1000)
    if spread_ms <= 0:
        return 0
    h = int.from_bytes(hashlib.blake2b(str(schedule_id).encode(), digest_size=8).digest(), "big")
    return h % spread_ms


# -- the store ---------------------------------------------------------------------------------
def validated(spec: ScheduleSpec) -> None:
    """Every rule of a schedule definition (fencepost.core.validate's table plus the cross-field
    ones), checked before anything is written: a stored schedule can always be fired."""
    validate.text("name", spec.name)
    validate.text("handler", spec.handler)
    if (spec.cron is None) == (spec.interval_s is None):
        raise InvalidInput("give exactly one of cron or interval", field="cron")
    if not isinstance(spec.timezone, str) or validate.unsafe_char(spec.timezone) is not None:
        raise InvalidTimezone(str(spec.timezone))
    zone(spec.timezone)
    if spec.cron is not None:
        validate_cron(spec.cron)
    if spec.interval_s is not None:
        validate.number("interval_s", spec.interval_s)
    validate.number("spread_s", spec.spread_s)
    if spec.exact and spec.spread_s:
        raise InvalidInput("give a spread or exact, not both", field="spread_s")
    if spec.catchup_window_s is not None:
        validate.number("catchup_window_s", spec.catchup_window_s)
    if spec.queue is not None and not valid_queue_name(spec.queue):
        raise InvalidInput(f"queue name {spec.queue!r} is not valid", field="queue")
    if spec.priority is not None:
        validate.integer("priority", spec.priority)
    if spec.start_at is not None and (not isinstance(spec.start_at, datetime) or spec.start_at.tzinfo is None):
        raise InvalidInput("start_at must be timezone-aware", field="start_at")
