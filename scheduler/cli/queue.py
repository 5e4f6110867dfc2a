"""`fencepost queue ...`: a queue's dispatch settings (tenant weights, concurrency limits,
priority aging) and what its tenants and keys hold now. Logic in scheduler/fairness.py."""

from __future__ import annotations

import json
from typing import Any

import click

from fencepost.core.config import Settings

__all__ = ["register"]


def _print(d: dict[str, Any]) -> None:
    from fencepost.cli.main import _table

    s = d["settings"]
    age = s["priority_age_ms"]
    click.echo(f"queue {s['queue']}: max running {s['max_running'] or 'unlimited'} (leased now {d['leased']}), "
               f"priority aging {(age or 60_000) / 1000:g} s per level{'' if age else ' (default)'}")
    click.echo("tenants with due runs:" if d["tenants"] else "no tenant has due runs")
    if d["tenants"]:
        _table(d["tenants"], ["tenant", "weight", "due", "virtual_time"])
    if s["weights"]:
        click.echo("weights: " + ", ".join(f"{t or '(none)'}={w:g}" for t, w in sorted(s["weights"].items())))
    if d["keys"]:
        click.echo("concurrency key overrides:")
        _table(d["keys"], ["key", "limit", "leased", "held"])


def register(cli: click.Group) -> None:
    from fencepost.cli.main import command

    queue = cli.commands.get("queue")  # cli_control's group (pause / resume) when present
    if not isinstance(queue, click.Group):
        @cli.group()
        def queue() -> None:
            """A whole queue: dispatch settings."""

    async def _do(settings: Settings, fn: Any, *args: Any, as_json: bool = False) -> None:
        from fencepost.apiclient import require_store
        from fencepost.client import Client
        from fencepost.core import fairness

        require_store("queue")
        async with Client(settings=settings, actor="cli") as client:
            if fn is not None:
                await fn(client.stores, *args)
            d = await fairness.describe(client.stores, args[0])
        if as_json:
            click.echo(json.dumps(d, default=str))
        else:
            _print(d)

    @queue.command("show")
    @click.argument("name")
    @click.option("--json", "as_json", is_flag=True)
    @command
    async def show(settings: Settings, name: str, as_json: bool) -> None:
        """Settings, tenants with due runs, and leased / held runs per overridden key."""
        await _do(settings, None, name, as_json=as_json)

    @queue.command("weight")
    @click.argument("name")
    @click.argument("tenant")
    @click.argument("weight", type=float, required=False)
    @click.option("--reset", is_flag=True, help="Back to the default weight, 1.")
    @command
    async def weight(settings: Settings, name: str, tenant: str, weight: float | None, reset: bool) -> None:
        """Give TENANT a share of dispatch proportional to WEIGHT (default 1; '' = runs without a tenant)."""
        from fencepost.core import fairness
        from fencepost.core.errors import InvalidInput

        if (weight is None) == (not reset):
            raise InvalidInput("give a WEIGHT or --reset", field="weight")
        await _do(settings, fairness.set_weight, name, tenant, None if reset else weight)

    @queue.command("limit")
    @click.argument("name")
    @click.argument("limit", type=int, required=False)
    @click.option("--key", help="Limit this concurrency key (e.g. export:customer-42) instead of the whole queue.")
    @click.option("--reset", is_flag=True, help="Remove the limit (a key goes back to its runs' declared limit).")
    @command
    async def limit(settings: Settings, name: str, limit: int | None, key: str | None, reset: bool) -> None:
        """At most LIMIT runs leased at once: of the queue, or of one concurrency --key."""
        from fencepost.core import fairness
        from fencepost.core.errors import InvalidInput

        if (limit is None) == (not reset):
            raise InvalidInput("give a LIMIT or --reset", field="limit")
        value = None if reset else limit
        if key is None:
            await _do(settings, fairness.set_max_running, name, value)
        else:
            await _do(settings, fairness.set_limit, name, key, value)

    @queue.command("aging")
    @click.argument("name")
    @click.argument("seconds", type=float, required=False)
    @click.option("--reset", is_flag=True, help="Back to the default, 60 s per priority level.")
    @command
    async def aging(settings: Settings, name: str, seconds: float | None, reset: bool) -> None:
        """One priority level is a head start of SECONDS of waiting."""
        from fencepost.core import fairness
        from fencepost.core.errors import InvalidInput

        if (seconds is None) == (not reset):
            raise InvalidInput("give SECONDS or --reset", field="seconds")
        await _do(settings, fairness.set_aging, name, None if reset else seconds)
