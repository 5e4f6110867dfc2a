"""`fencepost queue ...`: pause / resume a whole queue, its dispatch settings (tenant weights,
concurrency limits, rate limits, priority aging) and what its tenants and keys hold now. Logic in
fencepost.core.fairness."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import click

from fencepost.cli.common import (
    actor,
    async_command,
    json_option,
    operator,
    print_json,
    require_store,
    table,
    to_json,
    warn_if_recorder_silent,
)
from fencepost.client import Client
from fencepost.core import fairness
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.queues import require_queue

__all__ = ["queue"]

_COLS = ["queue", "paused", "due", "delayed", "active", "oldest_due_age_s", "throughput_per_min"]
"""`queue ls` columns (fencepost.core.views.QueueStats): counted in Redis, the live store."""


@click.group()
def queue() -> None:
    """A whole queue: pause / resume (nothing new is dispatched while paused); dispatch
    settings: tenant weights, concurrency limits, rate limits, priority aging."""


@queue.command("ls")
@json_option
@async_command
async def queue_ls(settings: Settings, as_json: bool) -> None:
    """Every queue: paused or not, and its runs as the live store (Redis) holds them now: due,
    delayed (a delay or a retry's backoff) and active (leased), with finished runs per minute."""
    async with operator(settings) as op:
        rows = await op.queues()
        await warn_if_recorder_silent(op)
    if as_json:
        print_json(rows)
        return
    table([{**to_json(r), "paused": "paused" if r.paused else ""} for r in rows], _COLS)


@queue.command("pause")
@click.argument("name")
@click.option("--reason", default="")
@async_command
async def queue_pause(settings: Settings, name: str, reason: str) -> None:
    """Dispatch nothing new from queue NAME (running runs carry on); works before its first job."""
    async with operator(settings, actor=actor()) as op:
        await op.pause_queue(name, reason=reason)
    click.echo(f"queue {name}: paused")


@queue.command("resume")
@click.argument("name")
@click.option("--reason", default="")
@async_command
async def queue_resume(settings: Settings, name: str, reason: str) -> None:
    """Dispatch from queue NAME again."""
    async with operator(settings, actor=actor()) as op:
        await op.resume_queue(name, reason=reason)
    click.echo(f"queue {name}: resumed")


def _print(d: dict[str, Any]) -> None:
    s = d["settings"]
    age = s["priority_age_ms"]
    if d.get("paused"):
        click.echo(f"queue {s['queue']} is PAUSED: nothing new is dispatched (`fencepost queue resume {s['queue']}`)")
    click.echo(f"queue {s['queue']}: max running {s['max_running'] or 'unlimited'} (leased now {d['leased']}), "
               f"priority aging {(age or 60_000) / 1000:g} s per level{'' if age else ' (default)'}")
    click.echo("tenants with due runs:" if d["tenants"] else "no tenant has due runs")
    if d["tenants"]:
        table(d["tenants"], ["tenant", "weight", "due", "virtual_time"])
    if s["weights"]:
        click.echo("weights: " + ", ".join(f"{t or '(none)'}={w:g}" for t, w in sorted(s["weights"].items())))
    if d["keys"]:
        click.echo("concurrency key overrides:")
        table(d["keys"], ["key", "limit", "leased", "held"])
    if d.get("rates"):
        click.echo("rate limits (starts in the window now, on the Redis server's clock):")
        table([{**r, "key": r["key"] or "(queue)", "rate": r["rate"] or "-",
                "set by": "operator" if r["override"] else "runs"} for r in d["rates"]],
              ["key", "rate", "used", "held", "set by"])


async def _change_and_show(settings: Settings, change: Callable[..., Awaitable[Any]] | None, name: str, *args: Any,
                           as_json: bool = False) -> None:
    """Apply one dispatch setting of queue NAME (none: only look), then print the queue's settings."""
    require_store("queue")
    async with Client(settings=settings, actor="cli") as client:
        row = await require_queue(client.stores, name)  # an unknown queue is refused, not described
        if change is not None:
            await change(client.stores, name, *args, actor=actor())  # audited with the operator's name
        d = await fairness.describe(client.stores, name)
        d["paused"] = row["paused"]
    if as_json:
        click.echo(json.dumps(d, default=str))
    else:
        _print(d)


@queue.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@async_command
async def show(settings: Settings, name: str, as_json: bool) -> None:
    """Settings, tenants with due runs, and leased / held runs per overridden key."""
    await _change_and_show(settings, None, name, as_json=as_json)


@queue.command("weight")
@click.argument("name")
@click.argument("tenant")
@click.argument("weight", type=float, required=False)
@click.option("--reset", is_flag=True, help="Back to the default weight, 1.")
@async_command
async def weight(settings: Settings, name: str, tenant: str, weight: float | None, reset: bool) -> None:
    """Give TENANT a share of dispatch proportional to WEIGHT (default 1; '' = runs without a tenant)."""
    if (weight is None) == (not reset):
        raise InvalidInput("give a WEIGHT or --reset", field="weight")
    await _change_and_show(settings, fairness.set_weight, name, tenant, None if reset else weight)


@queue.command("limit")
@click.argument("name")
@click.argument("limit", type=int, required=False)
@click.option("--key", help="Limit this concurrency key (e.g. export:customer-42) instead of the whole queue.")
@click.option("--reset", is_flag=True, help="Remove the limit (a key goes back to its runs' declared limit).")
@async_command
async def limit(settings: Settings, name: str, limit: int | None, key: str | None, reset: bool) -> None:
    """At most LIMIT runs leased at once: of the queue, or of one concurrency --key."""
    if (limit is None) == (not reset):
        raise InvalidInput("give a LIMIT or --reset", field="limit")
    value = None if reset else limit
    if key is None:
        await _change_and_show(settings, fairness.set_max_running, name, value)
    else:
        await _change_and_show(settings, fairness.set_limit, name, key, value)


@queue.command("rate")
@click.argument("name")
@click.argument("rate", required=False)
@click.option("--key", help="Limit this rate key (e.g. sync:customer-42) instead of the whole queue.")
@click.option("--reset", is_flag=True, help="Remove the rate (a key goes back to its runs' declared rate).")
@async_command
async def rate(settings: Settings, name: str, rate: str | None, key: str | None, reset: bool) -> None:
    """At most RATE starts, like 100/1s or 5/250ms (units ms, s, m, h, d): of the whole queue, or
    of one rate --key, over all workers."""
    if (rate is None) == (not reset):
        raise InvalidInput("give a RATE (like 100/1s) or --reset", field="rate")
    if key is None:
        await _change_and_show(settings, fairness.set_rate, name, rate)
    else:
        await _change_and_show(settings, fairness.set_key_rate, name, key, rate)


@queue.command("aging")
@click.argument("name")
@click.argument("seconds", type=float, required=False)
@click.option("--reset", is_flag=True, help="Back to the default, 60 s per priority level.")
@async_command
async def aging(settings: Settings, name: str, seconds: float | None, reset: bool) -> None:
    """One priority level is a head start of SECONDS of waiting."""
    if (seconds is None) == (not reset):
        raise InvalidInput("give SECONDS or --reset", field="seconds")
    await _change_and_show(settings, fairness.set_aging, name, None if reset else seconds)
