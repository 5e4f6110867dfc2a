"""Operator commands on the CLI: `fencepost pause / stop / cancel / resume / restart / retry`, on one
run or on a bounded bulk selection of a queue's runs. The commands share their options and body
(`_act`); each is declared here so that `fencepost <verb> --help` reads from its docstring."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from fencepost.cli.common import actor, async_command, operator
from fencepost.control import BULK_DEFAULT_LIMIT, explain_reply
from fencepost.core.config import Settings
from fencepost.core.views import BulkResult

__all__ = ["RUN_COMMANDS", "cancel", "pause", "restart", "resume", "retry", "stop"]


def _run_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The arguments every run command takes: one RUN_ID, or a bulk selection of a queue."""
    for option in reversed([
        click.argument("run_id", type=int, required=False),
        click.option("--reason", default="", help="Recorded in the run's history with your name."),
        click.option("--queue", help="Bulk: act on the runs of this queue that match."),
        click.option("--status", "status_", help="Bulk: only runs in this state."),
        click.option("--handler", help="Bulk: only runs of this handler."),
        click.option("--limit", type=int, default=BULK_DEFAULT_LIMIT, show_default=True,
                     help="Bulk: at most this many runs."),
        click.option("--yes", is_flag=True, help="Bulk: really do it (without it, only count the matches)."),
        click.option("--version", "expected_version", type=int, help="Act only if the run is still at this version."),
    ]):
        fn = option(fn)
    return fn


@click.command("pause")
@_run_options
@async_command
async def pause(settings: Settings, **opts: Any) -> None:
    """Pause a run (PENDING/RETRY_WAIT now; RUNNING at its next safe boundary)."""
    await _act("pause", settings, **opts)


@click.command("stop")
@_run_options
@async_command
async def stop(settings: Settings, **opts: Any) -> None:
    """Stop a running run gracefully (checkpoint, then STOPPED; forced after the grace period)."""
    await _act("stop", settings, **opts)


@click.command("cancel")
@_run_options
@async_command
async def cancel(settings: Settings, **opts: Any) -> None:
    """Cancel a run (running runs are stopped first, then CANCELLED)."""
    await _act("cancel", settings, **opts)


@click.command("resume")
@_run_options
@async_command
async def resume(settings: Settings, **opts: Any) -> None:
    """Resume a PAUSED or STOPPED run from its latest checkpoint (same run id, new attempt)."""
    await _act("resume", settings, **opts)


@click.command("restart")
@_run_options
@async_command
async def restart(settings: Settings, **opts: Any) -> None:
    """Run again from the beginning, discarding the checkpoint."""
    await _act("restart", settings, **opts)


@click.command("retry")
@_run_options
@async_command
async def retry(settings: Settings, **opts: Any) -> None:
    """Retry a dead-lettered run (FAILED / TIMED_OUT / CANCELLED)."""
    await _act("retry", settings, **opts)


RUN_COMMANDS: list[click.Command] = [pause, stop, cancel, resume, restart, retry]
"""One per verb of fencepost.control.COMMANDS, in that order."""


async def _act(verb: str, settings: Settings, *, run_id: int | None, reason: str, queue: str | None,
               status_: str | None, handler: str | None, limit: int, yes: bool, expected_version: int | None) -> None:
    if (run_id is None) == (queue is None):
        raise click.UsageError(f"give a RUN_ID, or --queue (with --status/--handler) for a bulk {verb}")
    async with operator(settings, actor=actor()) as op:  # the stores, or the API (core.views.Operator)
        if run_id is not None:  # one run
            state = await op.command(verb, run_id, reason=reason, expected_version=expected_version)
            click.echo(f"run {run_id}: {explain_reply(verb, state)}")
            return
        assert queue is not None  # exactly one of RUN_ID and --queue (checked above)
        # bulk: count first (nothing changes), then act on exactly the runs counted
        count = await op.bulk_count(verb, queue=queue, status=status_.upper() if status_ else None, handler=handler,
                                    limit=limit)
        if not yes:  # a dry run: it counted, as asked (exit 0)
            click.echo(f"{count.matched} runs in queue {queue!r} match; nothing changed.")
            click.echo(f"Re-run with --yes to {verb} up to {count.acting} of them (--limit {count.limit}).")
            return
        out = await op.bulk_confirm(count, reason=reason)
    _print_bulk(out)


def _print_bulk(out: BulkResult) -> None:
    summary = ", ".join(f"{n} {s}" for s, n in sorted(out.results.items())) or "none changed"
    click.echo(f"{out.matched} matched, {out.acted} acted on: {summary}")
    for rid, why in list(out.refused.items())[:20]:
        click.echo(f"  run {rid}: {why}")
