"""`fencepost scale-hint`: the worker replica count a queue needs now (Little's law, see
fencepost.core.scaling), with the arithmetic printed."""

from __future__ import annotations

import json

import click

from fencepost.cli.common import async_command, require_store
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput, UnknownQueue
from fencepost.core.record import Database
from fencepost.core.scaling import explain
from fencepost.core.scaling import scale_hint as hint

__all__ = ["scale_hint"]


@click.command("scale-hint")
@click.option("--queue", required=True, help="The queue to size.")
@click.option("--target-lag", "target_lag", type=float, default=10.0, show_default=True,
              help="Seconds within which the current backlog should be drained.")
@click.option("--window", type=float, default=300.0, show_default=True,
              help="Seconds of history to measure the arrival rate and run time over.")
@click.option("--concurrency", type=int, default=100, show_default=True,
              help="Concurrent runs per worker replica (the worker's --concurrency).")
@click.option("--utilisation", type=float, default=0.8, show_default=True,
              help="Target busy fraction of the worker slots (headroom).")
@click.option("--run-time", "run_time", type=float, default=None,
              help="Use this mean run time (s) instead of the measured one.")
@click.option("--min-replicas", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@async_command
async def scale_hint(settings: Settings, queue: str, target_lag: float, window: float, concurrency: int,
                     utilisation: float, run_time: float | None, min_replicas: int, as_json: bool) -> None:
    """Recommend the worker replica count for a queue from its arrival rate, run time and target lag."""
    require_store("scale-hint")
    db = await Database(settings.database_url, min_size=1, max_size=1).connect()
    try:
        if await db.row("queue_row", queue) is None:  # no replicas for a queue that does not exist
            raise UnknownQueue(queue)
        try:
            h = await hint(db, queue, window_s=window, target_lag_s=target_lag, concurrency=concurrency,
                           utilisation=utilisation, min_replicas=min_replicas, run_time_s=run_time)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    finally:
        await db.close()
    if as_json:
        click.echo(json.dumps(h.as_dict()))
        return
    for line in explain(h):
        click.echo(line)
    click.echo(f"recommendation: {h.replicas} worker replica{'s' if h.replicas != 1 else ''} "
               f"(--concurrency {concurrency})")
