"""No per-batch cost that grows with history (issue 23 item 2): every statement of a recorder batch reads
only the history partitions its entries touch, whatever months of history lie beside them. Each statement
the recorder runs is run as EXPLAIN ANALYZE (it still does its work) and the partitions its executed plan
nodes read are collected."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core import record
from fencepost.core.hot import ClaimArgs, Finish, FinishArgs
from fencepost.core.stores import Stores
from fencepost.reconciler.recorder import Recorder


def _read(plan: dict[str, Any], out: set[str]) -> None:
    """Relations of the plan nodes that ran at least once."""
    if plan.get("Actual Loops", 0) > 0 and "Relation Name" in plan:
        out.add(plan["Relation Name"])
    for sub in plan.get("Plans", []):
        _read(sub, out)


@pytest.fixture
def explained(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """Every Session.execute runs as EXPLAIN (ANALYZE, FORMAT JSON): name -> the relations it read."""
    seen: dict[str, set[str]] = {}

    async def execute(self: record.Session, name: str, *args: Any) -> str:
        plan = json.loads(await self.conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + record.query(name), *args))
        _read(plan[0]["Plan"], seen.setdefault(name, set()))
        return "UPDATE 1000000000"  # the counts only tell a late or already-recorded batch: these are neither

    monkeypatch.setattr(record.Session, "execute", execute)
    return seen


async def test_a_recorder_batch_reads_only_the_partitions_it_touches(
        client: Client, stores: Stores, explained: dict[str, set[str]]) -> None:
    pool = stores.db.pool
    assert pool is not None
    now = datetime.now(UTC)
    first = datetime(now.year - 1, now.month, 1, tzinfo=UTC).date()
    await pool.execute("SELECT count(*) FROM fencepost_ensure_partitions($1, 14)", first)  # 12 months back, 2 ahead
    months = [r["m"] for r in await pool.fetch(
        "SELECT generate_series($1::date, $2::date, interval '1 month') AS m", first,
        datetime(now.year, now.month, 1, tzinfo=UTC).date())]
    for m in months[:-1]:  # a history in every earlier month
        at = datetime(m.year, m.month, 10, tzinfo=UTC)
        await pool.execute("INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, "
                           "outcome) SELECT g, 1, g, 'old', $1, $1, 'succeeded' "
                           "FROM generate_series(1000000000, 1000000199) g", at)
        await pool.execute("INSERT INTO events (run_id, type, to_status, version, at) "
                           "SELECT g, 'submitted', 'PENDING', 0, $1 FROM generate_series(1000000000, 1000000199) g", at)
    await pool.execute("ANALYZE attempts; ANALYZE events")

    ids = [await client.submit("t.noop") for _ in range(20)]
    keys = stores.keys("tq")
    jobs = await stores.scripts.claim_due(keys, ClaimArgs(20, "w", 30_000, 100))
    assert len(jobs) == 20
    stream = keys.events
    rec = Recorder(stores, consumer="a")
    await rec._ensure_groups(["tq"])
    await rec.record([(stream, eid, f) for eid, f in await stores.redis.xrange(stream)], fresh=True)  # the claims
    last = (await stores.redis.xrange(stream))[-1][0]
    await stores.scripts.finish_runs(keys, FinishArgs(3), [Finish(j.id, j.token, "ok", b"\xc0", "", 0) for j in jobs])
    # the finishes, a later batch: each closes an attempt an earlier batch wrote
    await rec.record([(stream, eid, f) for eid, f in await stores.redis.xrange(stream, min=b"(" + last)], fresh=True)

    statuses = {r["status"] for r in await stores.db.fetch("run_status", ids)}
    assert statuses == {"SUCCEEDED"}
    att = await pool.fetch("SELECT tableoid::regclass::text AS part, outcome FROM attempts WHERE run_id = ANY($1)", ids)
    this_month = f"attempts_y{now:%Y}m{now:%m}"
    assert {(r["part"], r["outcome"]) for r in att} == {(this_month, "succeeded")} and len(att) == 20
    assert "apply_attempts" in explained and "apply_runs" in explained
    assert "apply_attempts_by_run" not in explained, "every close carried its attempt's start"
    history = {rel for rels in explained.values() for rel in rels if rel.startswith(("attempts", "events"))}
    old = {f"{t}_y{m:%Y}m{m:%m}" for t in ("attempts", "events") for m in months[:-1]}
    assert not history & old, f"a recorder statement read history partitions it does not touch: {explained}"
