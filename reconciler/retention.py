"""History maintenance: monthly partitions, finished runs out of the hot table, and
retention by partition drop (never a DELETE).

The SQL lives in sql/007_history_partitions.sql (functions) and sql/queries_retention.sql.
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

__all__ = [
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
    "parse_duration",
]

log = logging.getLogger("fencepost.retention")

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
    archive: Path | None


async def ensure_partitions(conn: Conn, month: date, ahead: int = 2) -> list[str]:
    """Create `month` and the `ahead` months after it where missing; returns what was created."""
    return [r["created"] for r in await Session.of(conn).fetch("ensure_partitions", month, ahead)]


async def archive_runs(conn: Conn, cutoff: datetime, batch: int = 5000) -> int:
    """Move up to `batch` terminal runs finished before `cutoff` to runs_archive; returns how many."""
    status = await Session.of(conn).execute("archive_runs", cutoff, batch)
    return int(status.rsplit(" ", 1)[-1])  # INSERT 0 <n>


async def expired_partitions(conn: Conn, cutoff: datetime, *, count: bool = False) -> list[Partition]:
    """Monthly partitions whose whole range is older than `cutoff`, oldest first."""
    s = Session.of(conn)
    parts = [Partition(r["parent"], r["name"], r["lower_bound"], r["upper_bound"])
             for r in await s.fetch("history_partitions") if r["upper_bound"] <= cutoff]
    if count:
        parts = [msgspec.structs.replace(p, rows=await s.fetchval("partition_rows", p.name, False))
                 for p in parts]
    return parts


def archive_path(archive_dir: Path, part: Partition) -> Path:
    return archive_dir / f"{part.name}.csv.gz"


async def drop_partition(conn: Conn, part: Partition, archive_dir: Path | None) -> Dropped | None:
    """Detach and drop one partition, first copying it (client side, gzipped CSV with a
    header) into `archive_dir` when given. One transaction: the partition is locked against
    writes before the copy, so the archive holds exactly the rows dropped; the file is in
    place (fsynced, renamed) before the drop commits. None if the partition is already gone."""
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
        await s.execute("drop_partition", part.name)
    return Dropped(part, rows, path)


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
    else once an hour. An advisory lock lets one replica do it; the others skip."""

    def __init__(self, db: Database, *, archive_after: timedelta | None, every_s: float = 3600.0,
                 batch: int = 5000, clock: Callable[[], datetime] = _utcnow) -> None:
        self.db = db
        self.archive_after = archive_after
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

    async def _locked(self, fn: Callable[[Session], Awaitable[_T]]) -> _T | None:
        """Run `fn` in a transaction holding the maintenance lock; None if another holds it."""
        async with self.db.transaction() as tx:
            if not await tx.fetchval("retention_try_lock"):
                return None
            return await fn(tx)
