"""`fencepost review`: runs whose non-idempotent side effect failed wait here for an operator."""

from __future__ import annotations

import click

from fencepost.cli.common import actor, async_command, from_context, json_option, print_json, table
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.queues import require_queue

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
    if (api := from_context()) is not None:
        rows = api.review_queue(queue=queue, limit=limit)
    else:
        async with Client(settings=settings) as client:
            if queue is not None:
                await require_queue(client.stores, queue)
            rows = await client.review_queue(queue=queue, limit=limit)
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
    if (api := from_context()) is not None:
        state = api.resolve(run_id, as_=as_, reason=reason)
    else:
        async with Client(settings=settings, actor=actor()) as client:
            state = await client.resolve(run_id, as_=as_, reason=reason)
    click.echo(f"run {run_id}: {state}")
