"""History maintenance: monthly partitions, finished runs out of the hot table, and
retention by partition drop (never a DELETE); and the dashboard's per-minute chart rollup
(queue_minutes, migration 013) pruned past FENCEPOST_CHART_RETENTION, a bounded batch at a time.

The SQL lives in sql/007_history_partitions.sql (functions) and sql/queries_maintenance.sql.
`fencepost retention` (fencepost/cli/retention.py) drops old partitions; the reconciler runs
`Maintenance.tick` each tick, which does real work about once an hour.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import msgspec

from fencepost.core.errors import InvalidInput
from fencepost.core.record import Conn, Database, Session
from fencepost.core.states import TERMINAL

__all__ = [
    "CHART_WINDOW",
    "Dropped",
    "Maintenance",
    "Partition",
    "archive_path",
    "archive_runs",
    "drop_partition",
    "ensure_partitions",
    "expired_partitions",
    "month_of",
    "parse_archive_after",
    "parse_chart_retention",
    "parse_duration",
    "prune_rollup",
]

log = logging.getLogger("fencepost.retention")
_FINISHED = sorted(s.value for s in TERMINAL)
"""A run in any other state is not finished: retention keeps its history."""

_UTC = UTC
_T = TypeVar("_T")
_DURATION = re.compile(r"(\d+)([mhdw])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(text: str, *, what: str = "--keep") -> timedelta:
    """`30d`, `12h`, `90m`, `2w` -> timedelta; anything else (or zero) is InvalidInput."""
    m = _DURATION.fullmatch(text.strip())
    if m is None or int(m.group(1)) == 0:
        raise InvalidInput(f"{what} must be a positive duration such as 30d, 12h, 90m or 2w, not {text!r}",
                           field=what.lstrip("-").replace("-", "_").lower())
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def parse_archive_after(text: str) -> timedelta | None:
    """FENCEPOST_ARCHIVE_AFTER: a duration, or `0` / empty for never."""
    if text.strip() in ("", "0"):
        return None
    return parse_duration(text, what="FENCEPOST_ARCHIVE_AFTER")


CHART_WINDOW = timedelta(days=7)
"""The longest window the dashboard's charts show (GET /v1/stats?window=7d): the rollup is kept at least this long."""


def parse_chart_retention(text: str) -> timedelta:
    """FENCEPOST_CHART_RETENTION: a duration of at least CHART_WINDOW (a shorter one would cut the 7 d charts)."""
    try:
        keep = parse_duration(text, what="FENCEPOST_CHART_RETENTION")
    except InvalidInput as exc:
        raise InvalidInput(str(exc), field="chart_retention") from None  # the Settings field it came from
    if keep < CHART_WINDOW:
        raise InvalidInput(f"FENCEPOST_CHART_RETENTION must be at least 7d (the longest chart window), not {text!r}",
                           field="chart_retention")
    return keep


def month_of(at: datetime) -> date:
    """First day of `at`'s UTC month (partitions are UTC months)."""
    at = at.astimezone(_UTC)
    return date(at.year, at.month, 1)


class Partition(msgspec.Struct, frozen=True):
    """One monthly partition of events, attempts or runs_archive; `rows` when counted."""

    parent: str
    name: str
    lower: datetime
    upper: datetime
    rows: int | None = None


class Dropped(msgspec.Struct, frozen=True):
    partition: Partition
    rows: int
    """Rows the partition held (all of them are in the archive)."""
    archive: Path | None
    kept: int = 0
    """Of `rows`, those of runs not finished: kept (in the DEFAULT partition), not dropped."""


async def ensure_partitions(conn: Conn, month: date, ahead: int = 2) -> list[str]:
    """Create `month` and the `ahead` months after it where missing; returns what was created."""
    return [r.created for r in await Session.of(conn).rows("ensure_partitions", month, ahead)]


async def archive_runs(conn: Conn, cutoff: datetime, batch: int = 5000) -> int:
    """Move up to `batch` terminal runs finished before `cutoff` to runs_archive; returns how many."""
    status = await Session.of(conn).execute("archive_runs", cutoff, batch)
    return int(status.rsplit(" ", 1)[-1])  # INSERT 0 <n>


async def expired_partitions(conn: Conn, cutoff: datetime, *, count: bool = False) -> list[Partition]:
    """Monthly partitions whose whole range is older than `cutoff`, oldest first."""
    s = Session.of(conn)
    parts = [Partition(r.parent, r.name, r.lower_bound, r.upper_bound)
             for r in await s.rows("history_partitions") if r.upper_bound <= cutoff]
    if count:
        parts = [msgspec.structs.replace(p, rows=await s.fetchval("partition_rows", p.name, False))
                 for p in parts]
    return parts


async def prune_rollup(conn: Conn, cutoff: datetime, batch: int = 10_000) -> int:
    """Delete up to `batch` rollup minutes before `cutoff`, oldest first; returns how many."""
    status = await Session.of(conn).execute("rollup_prune", cutoff, batch)
    return int(status.rsplit(" ", 1)[-1])  # DELETE <n>


def archive_path(archive_dir: Path, part: Partition) -> Path:
    return archive_dir / f"{part.name}.csv.gz"


async def drop_partition(conn: Conn, part: Partition, archive_dir: Path | None) -> Dropped | None:
    """Detach and drop one partition, first copying it (client side, gzipped CSV with a
    header) into `archive_dir` when given. One transaction: the partition is locked against
    writes before the copy, so the archive holds exactly the partition's rows; the file is in
    place (fsynced, renamed) before the drop commits. The rows of runs that are not finished
    are kept (sql/018_retention_keeps_live_history.sql): a waiting run keeps its `submitted`
    event, a running attempt its row and start. None if the partition is already gone."""
    s = Session.of(conn)
    async with s.transaction():
        await s.execute("retention_lock")
        await s.execute("retention_lock_timeout")
        rows = await s.fetchval("partition_rows", part.name, True)
        if rows is None:
            return None
        path = None
        if archive_dir is not None:
            path = archive_path(archive_dir, part)
            copied = await _copy_out(s, part.name, path)
            if copied != rows:  # cannot happen under the SHARE lock; never drop what was not archived
                raise RuntimeError(f"{part.name}: copied {copied} rows of {rows}; nothing dropped")
        kept = await s.fetchval("drop_partition", part.name, _FINISHED)
    return Dropped(part, rows, path, int(kept or 0))


async def _copy_out(s: Session, table: str, path: Path) -> int:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with gzip.open(tmp, "wb") as out:
            async def write(chunk: bytes) -> None:
                out.write(chunk)

            copied = await s.copy_out(table, write, format="csv", header=True)
        with open(tmp, "rb") as f:  # noqa: ASYNC230 - one local fsync before the rename that publishes it
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return copied


def _utcnow() -> datetime:
    return datetime.now(_UTC)


class Maintenance:
    """The reconciler's history step. Creates the partitions of this month and the next two
    (once an hour), and moves terminal runs finished more than `archive_after` ago to
    runs_archive, `batch` per tick: every tick while batches come back full (a backlog),
    else once an hour. Chart rollup minutes older than `chart_retention` are deleted the same
    way, `rollup_batch` per tick. An advisory lock lets one replica do it; the others skip."""

    def __init__(self, db: Database, *, archive_after: timedelta | None, every_s: float = 3600.0,
                 batch: int = 5000, clock: Callable[[], datetime] = _utcnow,
                 chart_retention: timedelta = timedelta(days=8), rollup_batch: int = 10_000) -> None:
        self.db = db
        self.archive_after = archive_after
        self.chart_retention = chart_retention
        self.rollup_batch = rollup_batch
        self._rollup_due = 0.0
        self.rollup_pruned = 0
        self.every_s = every_s
        self.batch = batch
        self.clock = clock
        self._partitions_due = 0.0
        self._archive_due = 0.0
        self.archived = 0

    async def tick(self) -> None:
        """Both steps, each when due (the reconciler runs them as two loops with these intervals)."""
        mono = time.monotonic()
        if mono >= self._partitions_due:
            await self.partitions()
            self._partitions_due = mono + self.every_s
        if self.archive_after is not None and mono >= self._archive_due:
            moved = await self.archive()
            self._archive_due = mono if moved == self.batch else mono + self.every_s
        if mono >= self._rollup_due:
            pruned = await self.prune_rollup()
            self._rollup_due = mono if pruned == self.rollup_batch else mono + self.every_s

    async def partitions(self) -> list[str]:
        """Create this month's partitions and the next two where missing; returns what was created."""
        created = await self._locked(lambda conn: ensure_partitions(conn, month_of(self.clock()), 2)) or []
        if created:
            log.info("history partitions created: %s", ", ".join(created), extra={"event": "partitions_created"})
        return created

    async def archive(self) -> int:
        """Move one batch of old finished runs to runs_archive; returns how many (a full batch: a backlog)."""
        if self.archive_after is None:
            return 0
        cutoff = self.clock() - self.archive_after
        moved = await self._locked(lambda conn: archive_runs(conn, cutoff, self.batch)) or 0
        self.archived += moved
        if moved:
            log.info("archived %d finished runs", moved, extra={"event": "runs_archived"})
        return moved

    async def prune_rollup(self) -> int:
        """Delete one batch of chart rollup minutes older than chart_retention; returns how many
        (a full batch: a backlog)."""
        cutoff = self.clock() - self.chart_retention
        pruned = await self._locked(lambda conn: prune_rollup(conn, cutoff, self.rollup_batch)) or 0
        self.rollup_pruned += pruned
        if pruned:
            log.info("pruned %d chart rollup minutes", pruned, extra={"event": "rollup_pruned"})
        return pruned

    async def _locked(self, fn: Callable[[Session], Awaitable[_T]]) -> _T | None:
        """Run `fn` in a transaction holding the maintenance lock; None if another holds it."""
        async with self.db.transaction() as tx:
            if not await tx.fetchval("retention_try_lock"):
                return None
            return await fn(tx)
