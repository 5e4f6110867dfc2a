"""`fencepost reconcile --check | --repair`: drift between Redis and PostgreSQL, on demand.

--check reports every drift found (one line each) and changes nothing; exit code 1 if any.
--repair does one pass: rebuilds untrusted queues, then repairs every drift found.
Both compare every run of each queue in bulk reads (DriftRepair.suspects: each run's state and version
on both sides, its sorted sets, its hash's fields; seconds at 1,000,000 runs) and examine in full only
the runs that differ (DriftRepair.examine), so they report every kind of drift.
"""

from __future__ import annotations

import sys
from collections import Counter

import click

from fencepost.cli.common import EXIT_REFUSED, async_command, require_store
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from fencepost.reconciler.drift import DriftRepair
from fencepost.reconciler.rebuild import ensure_stamped, untrusted_queues

__all__ = ["reconcile"]


@click.command()
@click.option("--check", "mode", flag_value="check", help="Report drift, change nothing (exit 1 if any).")
@click.option("--repair", "mode", flag_value="repair", help="One repair pass over every queue.")
@click.option("--queue", "queues", multiple=True, help="Only these queues (default: every queue).")
@click.option("--fast", is_flag=True, hidden=True, help="Accepted for older scripts: every check is the fast one.")
@click.option("--grace", type=float, default=5.0, show_default=True,
              help="Ignore runs PostgreSQL changed this recently (a submit or command still on its way to Redis).")
@async_command
async def reconcile(settings: Settings, mode: str | None, queues: tuple[str, ...], fast: bool,
                    grace: float) -> None:
    """Compare Redis with PostgreSQL: report (--check) or repair (--repair) drift."""
    require_store("reconcile")
    if mode is None:
        raise click.UsageError("give --check or --repair")
    stores = await Stores(settings, db_pool_size=2).connect()
    try:
        names = list(queues) or [r.name for r in await stores.db.rows("queue_epochs")]
        if mode == "check":
            for q in await untrusted_queues(stores):
                if q in names:
                    click.echo(f"{q}\tunstamped\t-\tRedis is not stamped with the current epoch; "
                               "claims wait for a rebuild")
        else:
            for q in await ensure_stamped(stores):
                if q in names:
                    click.echo(f"{q}\trebuilt\t-\trestored from PostgreSQL at a new epoch")
        drift = DriftRepair(stores, grace_s=grace)
        found = []
        for q in names:
            found += await drift.full_pass(q, repair=mode == "repair", grace_s=grace)
    finally:
        await stores.close()
    for d in found:
        click.echo(d.line())
    kinds = Counter(d.kind for d in found)
    summary = ", ".join(f"{k}={n}" for k, n in sorted(kinds.items())) or "none"
    click.echo(f"{'repaired' if mode == 'repair' else 'drift'}: {summary}", err=True)
    if mode == "check" and found:
        sys.exit(EXIT_REFUSED)
