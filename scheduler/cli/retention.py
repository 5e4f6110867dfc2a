"""`fencepost retention --keep 30d`: drop the monthly history partitions (events, attempts,
runs_archive) whose whole month is older than the keep window, each optionally copied to
DIR/<partition>.csv.gz first. A partition drop, never a DELETE: the space is free at once
and there are no dead rows to vacuum. The work is in fencepost.reconciler.retention."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from fencepost.cli.common import async_command, require_store
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.record import Database
from fencepost.reconciler.retention import archive_path, drop_partition, expired_partitions, parse_duration

__all__ = ["retention"]


def _parse_now(value: str | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"--now must be an ISO 8601 time such as 2026-11-29T12:00:00+00:00, not {value!r}",
                           field="now") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


@click.command("retention")
@click.option("--keep", required=True,
              help="History to keep, e.g. 30d, 12h, 90m, 2w: a partition is dropped once its whole month is older.")
@click.option("--archive-dir", type=click.Path(file_okay=False, path_type=Path),
              help="First copy each partition to DIR/<partition>.csv.gz (never overwrites a file).")
@click.option("--dry-run", is_flag=True,
              help="Print the partitions that would be dropped, with row counts; change nothing.")
@click.option("--now", "now_", help="Measure --keep back from this ISO time instead of now (UTC when no offset).")
@async_command
async def retention(settings: Settings, keep: str, archive_dir: Path | None, dry_run: bool, now_: str | None) -> None:
    """Drop history partitions older than --keep (optionally archiving them first)."""
    require_store("retention")
    cutoff = _parse_now(now_) - parse_duration(keep)  # bad input fails before any connection
    db = await Database(settings.database_url, max_size=1).connect()
    try:
        async with db.session() as conn:
            plan = await expired_partitions(conn, cutoff, count=dry_run)
            if archive_dir is not None:
                taken = [archive_path(archive_dir, p) for p in plan if archive_path(archive_dir, p).exists()]
                if taken:
                    raise InvalidInput(f"{taken[0]} already exists and an archive is never overwritten; nothing "
                                       "was dropped (move it away first)", field="archive_dir")
            if not plan:
                click.echo(f"nothing to drop: no partition ends before {cutoff.isoformat()}")
                return
            for p in plan:
                if dry_run:
                    where = f" -> {archive_path(archive_dir, p)}" if archive_dir is not None else ""
                    click.echo(f"would drop {p.name}: {p.rows} rows before {p.upper.isoformat()}{where}")
                    continue
                if archive_dir is not None:
                    archive_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - a local mkdir, once
                done = await drop_partition(conn, p, archive_dir)
                if done is None:
                    click.echo(f"skipped {p.name}: already gone")
                else:
                    where = f"archived to {done.archive}" if done.archive is not None else "not archived"
                    kept = f"; kept {done.kept} rows of runs not finished" if done.kept else ""
                    click.echo(f"dropped {p.name}: {done.rows - done.kept} rows, {where}{kept}")
    finally:
        await db.close()
