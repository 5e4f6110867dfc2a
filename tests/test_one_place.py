"""Concepts restated in another language are tied to their one Python definition by a test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fencepost.client import Client
from fencepost.core.errors import PayloadTooLarge
from fencepost.core.models import Submit
from fencepost.core.schedules import ScheduleSpec
from fencepost.core.stats import BOUNDS_MS
from fencepost.workflows import Node

ROOT = Path(__file__).resolve().parent.parent


def test_the_rollups_histogram_bounds_are_the_ones_percentiles_read() -> None:
    """The recorder's rollup buckets lag and run time in SQL; stats.percentile reads the buckets
    back with BOUNDS_MS. A bound changed on one side only would shift every chart's percentiles."""
    sql = (ROOT / "sql" / "queries_queues.sql").read_text()  # rollup_minutes, queue_stats
    arrays = re.findall(r"width_bucket\(\w+,\s*ARRAY\[([\d,\s]+)\]", sql)
    assert arrays, "no width_bucket arrays found"
    for arr in arrays:
        assert tuple(int(x) for x in arr.replace("\n", " ").split(",")) == BOUNDS_MS
    doc = (ROOT / "sql" / "013_queue_minutes.sql").read_text()
    assert f"{len(BOUNDS_MS) + 1} buckets" in doc


def test_the_reconciler_doc_lists_every_maintenance_loop() -> None:
    names = set(re.findall(r'Loop\("(\w+)"', (ROOT / "reconciler" / "service.py").read_text()))
    doc = (ROOT / "docs" / "reconciler.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)` \|", doc, flags=re.M))
    assert names and names <= listed, f"loops missing from docs/reconciler.md: {sorted(names - listed)}"


def test_every_image_a_doc_shows_is_in_the_checkout() -> None:
    """A screenshot written by a test run is not in a clean checkout: docs link committed copies."""
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", doc.read_text()):
            if "://" not in target and not (doc.parent / target).resolve().is_file():
                missing.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not missing, missing


async def test_every_submit_path_refuses_an_oversize_payload_with_the_same_error(client: Client) -> None:
    """One set of checks (core/submit.py): a submit, a batch, a workflow node and a schedule (whose
    arguments become each fire's payload) refuse arguments over max_payload_bytes with PayloadTooLarge
    naming the size and the limit; the schedule raised a bare InvalidInput('payload too large') before."""
    big = "x" * (client.settings.max_payload_bytes + 1)
    attempts = {
        "submit": client.submit("t.echo", big),
        "batch": client.submit_batch([Submit(handler="t.echo", args=(big,))], on_complete=Submit(handler="t.noop")),
        "workflow": client.submit_workflow([Node(name="a", handler="t.echo", args=(big,))]),
        "schedule": client.add_schedule(ScheduleSpec(name="big", handler="t.echo", args=(big,), interval_s=60)),
    }
    for what, call in attempts.items():
        with pytest.raises(PayloadTooLarge) as refused:
            await call
        assert refused.value.limit == client.settings.max_payload_bytes, what
        assert refused.value.size > refused.value.limit, what
    assert await client.schedules() == [] and await client.list_runs() == [], "a refused submit wrote something"
