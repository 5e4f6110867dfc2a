"""`fencepost review`: runs whose non-idempotent side effect failed wait here for an operator."""

from __future__ import annotations

import click

from fencepost.cli.common import actor, async_command, json_option, operator, print_json, table
from fencepost.core.config import Settings

__all__ = ["review"]

_COLS = ["id", "handler", "queue", "attempt", "finished_at", "last_error_class", "last_error"]


@click.group()
def review() -> None:
    """The review queue: reconcile side effects by hand, then resolve."""


@review.command("ls")
@click.option("--queue")
@click.option("--limit", type=int, default=50, show_default=True)
@json_option
@async_command
async def review_ls(settings: Settings, queue: str | None, limit: int, as_json: bool) -> None:
    """Runs waiting for an operator, newest first."""
    async with operator(settings) as op:  # the stores, or the API with --api (core.views.Operator)
        if queue is not None:
            await op.known_queue(queue)
        rows = await op.review_queue(queue=queue, limit=limit)
    if as_json:
        print_json(rows)
    else:
        table(rows, _COLS)


@review.command("resolve")
@click.argument("run_id", type=int)
@click.option("--as", "as_", type=click.Choice(["succeeded", "failed", "retry"]), required=True,
              help="What really happened (or run it again).")
@click.option("--reason", default="")
@async_command
async def review_resolve(settings: Settings, run_id: int, as_: str, reason: str) -> None:
    """Close a review-queue run as what really happened, or run it again."""
    async with operator(settings, actor=actor()) as op:
        state = await op.resolve(run_id, as_=as_, reason=reason)
    click.echo(f"run {run_id}: {state}")
