"""`fencepost reconcile --check --fast` (issue 24 item 12): drift found by comparing sets (existence and
sorted-set membership against PostgreSQL's states) in a few bulk reads, the runs that differ examined in
full; it reports every kind the sets can show, and the full --check (tests/test_drift.py) the rest."""

from __future__ import annotations

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from tests.test_drift import inject, reconcile, reported, snapshot


async def test_the_fast_check_reports_what_the_sets_show_and_changes_nothing(client: Client, stores: Stores,
                                                                              settings: Settings) -> None:
    runs = await inject(client, stores, settings)
    before = await snapshot(stores)
    check = reconcile(settings, "--check", "--fast", "--grace", "0")
    assert check.returncode == 1, check.stderr
    found = reported(check.stdout)
    for kind in ("lost_lease", "unrecorded", "missing", "unqueued", "terminal_in_pg", "orphan_hash", "orphan_member"):
        assert (kind, runs[kind]) in found, f"{kind} not reported:\n{check.stdout}"
    assert not any(rid in (runs["_ok"], runs["_running"]) for _, rid in found), check.stdout
    assert await snapshot(stores) == before, "--check --fast changed Redis"
    fix = reconcile(settings, "--repair", "--grace", "0")
    assert fix.returncode == 0, fix.stderr
    again = reconcile(settings, "--check", "--fast", "--grace", "0")
    assert again.returncode == 0, again.stdout + again.stderr
