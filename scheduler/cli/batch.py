"""`fencepost batch show`: a batch's members counted by state and its callbacks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from fencepost.cli.common import async_command, fmt, json_option, operator, print_json
from fencepost.core.config import Settings
from fencepost.core.views import Batch

__all__ = ["batch"]


@click.group()
def batch() -> None:
    """Batches of runs with on_complete / on_success callbacks."""


def describe(view: Batch) -> list[str]:
    """The batch as text: one line for the members, one per callback."""
    counts = ", ".join(f"{n} {state}" for state, n in sorted(view["counts"].items()))
    name = f" ({fmt(view['name'])})" if view.get("name") else ""
    settled = f"settled {fmt(_when(view['settled_at']))}" if view.get("settled_at") else \
        "not settled (members still running)"
    lines = [f"batch {view['id']}{name}: {view['total']} runs, {counts}; {settled}"]
    for kind in ("on_complete", "on_success"):
        cb = view.get(kind)
        if cb:
            why = f" ({fmt(cb['reason'])})" if cb.get("reason") else ""
            lines.append(f"  {kind:<11} run {cb['id']}  {cb['status']}{why}")
    return lines


def _when(v: Any) -> Any:
    """A time as the stores give it (datetime) or the API does (ISO 8601 text), printed the same."""
    return datetime.fromisoformat(v) if isinstance(v, str) else v


@batch.command("show")
@click.argument("batch_id")
@json_option
@async_command
async def show(settings: Settings, batch_id: str, as_json: bool) -> None:
    """Members by state, when the batch settled, and each callback's run and state (BATCH_ID: the full id)."""
    async with operator(settings) as op:
        view = await op.batch_view(batch_id)
    if as_json:
        print_json(view)
        return
    for line in describe(view):
        click.echo(line)
