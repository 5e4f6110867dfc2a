"""`fencepost reconcile --check | --repair`: drift between Redis and PostgreSQL, on demand.

--check reports every drift found (one line each) and changes nothing; exit code 1 if any.
--check --fast compares sets only (a few bulk reads per queue: seconds at 1,000,000 runs): the runs
PostgreSQL says Redis must hold against the run hashes Redis has, and each run's state against the
sorted set it waits or runs in; only the runs where those differ are examined in full. It does not see
a hash at the right membership with another version or a damaged field (stale_hash, corrupt), which
the full --check reads every hash for (minutes at 1,000,000 runs).
--repair does one full pass: rebuilds untrusted queues, then repairs every drift found.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import cast

import click

from fencepost.cli.common import EXIT_REFUSED, async_command, require_store
from fencepost.core.config import Settings
from fencepost.core.fairness import due_and_held_sets, scan_queue
from fencepost.core.states import ACTIVE
from fencepost.core.stores import Stores
from fencepost.reconciler.drift import DriftRepair
from fencepost.reconciler.rebuild import ensure_stamped, untrusted_queues

__all__ = ["reconcile", "suspects"]

_PAGE = 50_000


async def _zrange(stores: Stores, z: str) -> list[bytes]:
    out: list[bytes] = []
    start = 0
    while True:  # in pages: one reply of a million members would be one huge buffer
        page = cast("list[bytes]", await stores.redis.zrange(z, start, start + _PAGE - 1))
        out.extend(page)
        if len(page) < _PAGE:
            return out
        start += _PAGE


async def _members(stores: Stores, names: list[str]) -> set[int]:
    out: set[int] = set()
    for z in names:
        out.update(int(m) for m in await _zrange(stores, z) if m.isdigit())
    return out


async def suspects(stores: Stores, queue: str) -> list[int]:
    """The runs of `queue` whose Redis side may not match PostgreSQL, found by comparing sets: a run Redis
    must hold without a hash, a hash or sorted-set member without such a run, a PENDING run in no due,
    held or delayed set, a RETRY_WAIT run not in the delayed set, a leased run not in the active set or
    an unleased one in it, a run that does not wait in a waiting set. DriftRepair.examine decides."""
    keys = stores.keys(queue)
    base = keys.base
    hashes: set[int] = set()
    sets: set[str] = {keys.due}
    cur = 0
    while True:  # one SCAN of the queue's keys: run hashes and the tenants' due and the held sets
        cur, names = await scan_queue(stores, queue, "*", cur, _PAGE)
        for n in names:
            tail = n[len(base):]
            if tail.startswith("run:") and tail[4:].isdigit():
                hashes.add(int(tail[4:]))
            elif tail.startswith(("due:t:", "held:", "rheld:")):
                sets.add(n)
        if cur == 0:
            break
    # A run waits only in a set a claim reads: its tenant's due set with the tenant registered, or a held
    # set of a registered key (due_and_held_sets from the registries, as the Lua `queued` counts it); a
    # member of any other set (an unregistered tenant's) is no waiter, so its run is examined.
    tenants = {t.decode() for t in await _zrange(stores, keys.tenants)}
    live = set(await due_and_held_sets(stores, queue))
    if keys.due not in {keys.tenant_due(t) for t in tenants}:
        live.discard(keys.due)
    waiting = await _members(stores, sorted(live))
    stray = await _members(stores, sorted(sets - live))
    delayed = await _members(stores, [keys.delayed])
    active = await _members(stores, [keys.active])
    out: set[int] = set()
    pg: set[int] = set()
    last = 0
    while True:
        rows = await stores.db.fetch("reconcile_check_page", queue, last, _PAGE)
        if not rows:
            break
        last = rows[-1]["id"]
        for r in rows:
            rid, st = r["id"], r["status"]
            pg.add(rid)
            if rid not in hashes:
                out.add(rid)
            elif st == "PENDING":
                if (rid not in waiting and rid not in delayed) or rid in active:
                    out.add(rid)
            elif st == "RETRY_WAIT":
                if rid not in delayed or rid in waiting or rid in active:
                    out.add(rid)
            elif st in ACTIVE:
                if rid not in active or rid in waiting or rid in delayed:
                    out.add(rid)
            elif rid in waiting or rid in delayed or rid in active:  # PAUSED, BLOCKED
                out.add(rid)
    out.update((waiting | stray | delayed | active) - pg)
    out.update(hashes - pg)  # finished runs' hashes (kept until they expire) are examined: one per finish
    return sorted(out)


@click.command()
@click.option("--check", "mode", flag_value="check", help="Report drift, change nothing (exit 1 if any).")
@click.option("--repair", "mode", flag_value="repair", help="One repair pass over every queue.")
@click.option("--queue", "queues", multiple=True, help="Only these queues (default: every queue).")
@click.option("--fast", is_flag=True, help="--check: compare sets, examine only the runs that differ (misses "
              "stale_hash and corrupt).")
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
        names = list(queues) or [r["name"] for r in await stores.db.fetch("queue_epochs")]
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
            if mode == "check" and fast:
                found += await drift.examine(q, await suspects(stores, q), grace_s=grace)
            else:
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
