"""`fencepost audit`: who did what. Configuration changes (dispatch, schedules, tokens, queue
pause) from the audit log and operators' commands on runs from the history, newest first,
filtered by actor, queue and time; from the stores, or through the API with --api (one body,
written against fencepost.core.views.Operator)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import click

from fencepost.cli.common import async_command, operator, print_json, table
from fencepost.cli.runs import cursor_options, pages
from fencepost.core import cursors, validate
from fencepost.core.config import Settings
from fencepost.core.views import AuditEntry

__all__ = ["audit"]

_AGO = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def _when(value: str | None, option: str) -> datetime | None:
    """`2h` (that long ago) or an ISO 8601 time (UTC when it has no offset)."""
    if value is None:
        return None
    m = _AGO.fullmatch(value.strip())
    if m:
        return datetime.now(UTC) - timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"must look like 30m, 2h, 7d or an ISO 8601 time, not {value!r}",
                                 param_hint=option) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@click.command("audit")
@click.option("--actor", help="Only this actor (token:7@10.0.0.5, cli:alice), or a prefix ending in ':' or '@' "
                              "(token:7@: every address of token 7).")
@click.option("--queue", help="Only this queue.")
@click.option("--since", help="From this long ago (30m, 2h, 7d) or this ISO 8601 time (default: 7d).")
@click.option("--until", help="Before this long ago or this time.")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@cursor_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one document) instead of a table.")
@async_command
async def audit(settings: Settings, actor: str | None, queue: str | None, since: str | None, until: str | None,
                limit: int, cursor: str | None, all_pages: bool, as_json: bool) -> None:
    """Who did what: configuration changes and commands, newest first."""
    start, end = _when(since or "7d", "--since"), _when(until, "--until")
    if actor is not None:
        validate.text("name", actor)
    cursors.decode("audit", cursor)  # a bad --cursor fails before anything connects
    async with operator(settings, redis=False) as op:  # the stores, or the API with --api (core.views.Operator)
        async def page(c: str | None) -> list[AuditEntry]:
            return await op.audit(actor=actor, queue=queue, since=start, until=end, limit=limit, cursor=c)

        rows = await pages(page, "audit", limit, cursor, all_pages)
    if as_json:
        print_json(rows)
        return
    shown = [{**{f: r[f] for f in r}, "detail": ", ".join(f"{k}={v}" for k, v in (r.data or {}).items()
                                                          if v is not None)} for r in rows]
    table(shown, ["at", "actor", "action", "queue", "target", "reason", "detail"])
