"""Drift injected by hand between Redis and PostgreSQL: `fencepost reconcile --check` reports
each kind (and changes nothing), `--repair` fixes each, and the continuous reconciler finds
and repairs drift incrementally, counted in a metric and written as an event."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit
from fencepost.core.stores import Stores
from fencepost.reconciler.rebuild import rebuild_queue
from fencepost.reconciler.service import Reconciler
from tests.conftest import ROOT, record_all, wait_until, worker_env
from tests.test_state_machine import CLAIM_FIELDS

pytestmark = pytest.mark.slow

Q = "tq"


def reconcile(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fencepost.cli", "reconcile", *args], cwd=ROOT,
                          env=worker_env(settings), capture_output=True, text=True, timeout=60)


def reported(out: str) -> dict[tuple[str, int], str]:
    found = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[2].isdigit():
            found[(parts[1], int(parts[2]))] = parts[3]
    return found


async def claim(stores: Stores, n: int = 1) -> list[tuple[int, int]]:
    raw = await stores.scripts.run("claim_due", stores.keys(Q), [n, "w-test", 60_000, 0])
    n = len(CLAIM_FIELDS)  # claim_due's fields per run
    return [(int(raw[i]), int(raw[i + 1])) for i in range(0, len(raw), n)]


async def finish(stores: Stores, run_id: int, token: int) -> str:
    out = await stores.scripts.run("finish_runs", stores.keys(Q), [3,
                                                                 run_id, token, "ok", b"\x90", "", 0])
    return out[0].decode()


async def state(stores: Stores, run_id: int) -> str | None:
    v = await stores.redis.hget(stores.keys(Q).run(run_id), "state")
    return v.decode() if v else None


async def inject(client: Client, stores: Stores, settings: Settings) -> dict[str, int]:
    """One run per kind of drift; returns kind -> run id."""
    ids = await client.submit_many([Submit(handler="t.noop") for _ in range(12)])
    k, r = stores.keys(Q), stores.redis
    # Claimed and recorded: PostgreSQL has RUNNING runs.
    claimed = dict(await claim(stores, 3))
    await record_all(stores)
    lost, unrec, stale_claim = sorted(claimed)
    # unrecorded: finished in Redis, stream entry gone before the recorder saw it.
    assert await finish(stores, unrec, claimed[unrec]) == "SUCCEEDED"
    await r.xtrim(k.events, maxlen=0)
    # lost_lease: PostgreSQL RUNNING, the hash is gone.
    await r.delete(k.run(lost))
    await r.zrem(k.active, lost)
    pending = [i for i in ids if i not in claimed]
    missing, unqueued, corrupt, corrupt2, terminal, stale, orphan_member_of = pending[:7]
    # missing: the hash and its member are gone.
    await r.delete(k.run(missing))
    await r.zrem(k.due, missing)
    # unqueued: the queued member is deleted, the hash says PENDING.
    await r.zrem(k.due, unqueued)
    # corrupt: garbage state; and a hash that lost its handler.
    await r.hset(k.run(corrupt), "state", "GARBAGE")
    await r.hdel(k.run(corrupt2), "handler")
    # terminal_in_pg: PostgreSQL cancelled the run, Redis never heard of it.
    # stale_hash: PostgreSQL is ahead of the hash (a replica that missed writes).
    conn = await asyncpg.connect(settings.database_url)
    await conn.execute("UPDATE runs SET status = 'CANCELLED', finished_at = now(), version = version + 1, "
                       "updated_at = now() - interval '1 hour' WHERE id = $1", terminal)
    await conn.execute("UPDATE runs SET version = version + 3, updated_at = now() - interval '1 hour' "
                       "WHERE id = $1", stale)
    await conn.close()
    # orphans: a hash with no PostgreSQL row (queued), and a member with no hash.
    orphan_hash = 9_000_000_001
    await r.hset(k.run(orphan_hash), mapping={"state": "PENDING", "version": 0, "handler": "t.noop",
                                              "payload": b"\x90", "priority": 0, "run_at": 0})
    await r.zadd(k.due, {orphan_hash: 1})
    orphan_member = 9_000_000_002
    await r.zadd(k.delayed, {orphan_member: 1})
    return {"lost_lease": lost, "unrecorded": unrec, "missing": missing, "unqueued": unqueued,
            "corrupt": corrupt, "corrupt2": corrupt2, "terminal_in_pg": terminal, "stale_hash": stale,
            "orphan_hash": orphan_hash, "orphan_member": orphan_member, "_ok": orphan_member_of,
            "_running": stale_claim}


async def snapshot(stores: Stores) -> dict[str, Any]:
    k = stores.keys(Q)
    pipe = stores.redis.pipeline(transaction=False)
    for z in (k.due, k.delayed, k.active):
        pipe.zrange(z, 0, -1, withscores=True)
    out = await pipe.execute()
    keys = sorted([x async for x in stores.redis.scan_iter(match=k.base + "run:*", count=20_000)])
    hashes = [await stores.redis.hgetall(x) for x in keys]
    return {"sets": out, "hashes": list(zip(keys, hashes))}


async def test_check_reports_each_drift_and_repair_fixes_each(client: Client, stores: Stores,
                                                                settings: Settings) -> None:
    runs = await inject(client, stores, settings)
    before = await snapshot(stores)
    check = reconcile(settings, "--check", "--grace", "0")
    assert check.returncode == 1, check.stderr
    found = reported(check.stdout)
    for kind in ("lost_lease", "unrecorded", "missing", "unqueued", "corrupt", "terminal_in_pg", "stale_hash",
                 "orphan_hash", "orphan_member"):
        assert (kind, runs[kind]) in found, f"{kind} not reported:\n{check.stdout}"
    assert ("corrupt", runs["corrupt2"]) in found
    assert not any(rid in (runs["_ok"], runs["_running"]) for _, rid in found), check.stdout
    assert await snapshot(stores) == before, "--check changed Redis"

    fix = reconcile(settings, "--repair", "--grace", "0")
    assert fix.returncode == 0, fix.stderr
    assert set(reported(fix.stdout)) == set(found)
    again = reconcile(settings, "--check", "--grace", "0")
    assert again.returncode == 0, again.stdout + again.stderr

    k, r = stores.keys(Q), stores.redis
    # Restored and claimable again: missing, unqueued, corrupt, stale, lost lease.
    due = {int(m) for m in await r.zrange(k.due, 0, -1)}
    for kind in ("missing", "unqueued", "corrupt", "corrupt2", "stale_hash", "lost_lease"):
        assert runs[kind] in due, kind
        assert await state(stores, runs[kind]) == "PENDING"
    assert runs["terminal_in_pg"] not in due and await state(stores, runs["terminal_in_pg"]) == "CANCELLED"
    assert not await r.exists(k.run(runs["orphan_hash"]))
    assert not await r.zscore(k.due, runs["orphan_hash"])
    assert not await r.zscore(k.delayed, runs["orphan_member"])
    row = await client.get(runs["unrecorded"])
    assert row["status"] == "SUCCEEDED" and row["lease_owner"] is None
    lost = await client.get(runs["lost_lease"])
    assert lost["status"] == "PENDING" and lost["reason"] == "redis_lost"
    assert (await client.attempts(runs["lost_lease"]))[0]["outcome"] == "interrupted"
    # One drift_repaired event per repair, reason = kind, actor reconciler.
    conn = await asyncpg.connect(settings.database_url)
    evs = await conn.fetch("SELECT run_id, reason, actor FROM events WHERE type = 'drift_repaired'")
    await conn.close()
    assert {(e["reason"], e["run_id"]) for e in evs} == set(found)
    assert {e["actor"] for e in evs} == {"reconciler"}


async def test_reconciler_repairs_drift_incrementally(client: Client, stores: Stores, settings: Settings) -> None:
    runs = await inject(client, stores, settings)
    rec = Reconciler(settings, drift_grace_s=0.0)
    rec.drift.page = 4  # several ticks to walk everything: incremental, bounded per tick
    rec.drift.recent = 2
    await rec.stores.connect()
    try:
        def repaired(kind: str) -> float:
            return REGISTRY.get_sample_value("fencepost_drift_repaired_total", {"kind": kind, "queue": Q}) or 0.0

        base = {kind: repaired(kind) for kind in ("missing", "unqueued", "orphan_hash", "orphan_member",
                                                   "terminal_in_pg", "lost_lease")}
        for _ in range(12):
            await rec.maintain_once()
        for kind in base:
            assert repaired(kind) > base[kind], kind
        check = reconcile(settings, "--check", "--grace", "0")
        assert check.returncode == 0, check.stdout
    finally:
        await rec.stores.close()
    assert await state(stores, runs["missing"]) == "PENDING"


async def test_rebuild_restores_queue_pause_and_bumps_the_epoch(client: Client, stores: Stores,
                                                                 settings: Settings) -> None:
    ids = await client.submit_many([Submit(handler="t.noop") for _ in range(5)])
    k = stores.keys(Q)
    conn = await asyncpg.connect(settings.database_url)
    await conn.execute("UPDATE queues SET paused = true WHERE name = $1", Q)
    epoch = await conn.fetchval("SELECT epoch FROM queues WHERE name = $1", Q)
    await stores.redis.delete(*[k.run(i) for i in ids], k.due, k.epoch)
    stats = await rebuild_queue(stores, Q)
    assert stats["restored"] == 5 and stats["epoch"] == epoch + 1
    assert await conn.fetchval("SELECT epoch FROM queues WHERE name = $1", Q) == epoch + 1
    await conn.close()
    assert await stores.redis.exists(k.paused)
    assert await claim(stores) == []  # paused: nothing claimed, no error (stamped)
    await stores.redis.delete(k.paused)
    [(_rid, token)] = await claim(stores)
    assert token >> 40 == epoch + 1


async def _finish_then_restore_stale_copies(stores: Stores, ids: list[int], sets: dict[str, dict[str, float]]) -> None:
    """Run the runs to SUCCEEDED (recorded), then "promote a replica" that saw only the
    submits: their old hashes back, members in `sets` (suffix after the queue base), unstamped."""
    k, r = stores.keys(Q), stores.redis
    snap = {x: await r.hgetall(k.run(x)) for x in ids}
    claimed = dict(await claim(stores, len(ids)))
    for rid, tok in claimed.items():
        assert await finish(stores, rid, tok) == "SUCCEEDED"
    await record_all(stores)
    for x in ids:
        await r.delete(k.run(x))
        await r.hset(k.run(x), mapping=snap[x])
    for suffix, members in sets.items():
        await r.zadd(k.base + suffix, members)
    await r.delete(k.epoch)


async def test_a_run_completed_in_postgres_is_not_claimed_after_a_rebuild(client: Client, stores: Stores,
                                                                         settings: Settings) -> None:
    """A replica that missed the finish still has the run queued: the rebuild drops it."""
    [a, b] = await client.submit_many([Submit(handler="t.noop"), Submit(handler="t.noop")])
    due = await stores.redis.zrange(stores.keys(Q).due, 0, -1, withscores=True)
    await _finish_then_restore_stale_copies(stores, [a, b], {"due": {m.decode(): s for m, s in due}})
    stats = await rebuild_queue(stores, Q)
    assert stats["synced"] == 2
    assert await claim(stores, 2) == []
    assert await state(stores, a) == "SUCCEEDED"


async def test_a_completed_run_waiting_in_a_tenant_or_held_set_is_not_claimed_after_a_rebuild(
        client: Client, stores: Stores) -> None:
    """The same, for the sets fairness and limits add: a tenant's due set (whose tenant
    entry the replica lost) and a concurrency key's held set (not in the heldkeys
    registry: found by SCAN)."""
    a = await client.submit("t.noop", tenant="acme")
    b = await client.submit("t.noop", concurrency_key="k", concurrency_limit=1)
    k, r = stores.keys(Q), stores.redis
    await _finish_then_restore_stale_copies(stores, [a, b], {"due:t:acme": {str(a): 1}, "held:k": {str(b): 1}})
    await r.delete(k.base + "tenants")
    stats = await rebuild_queue(stores, Q)
    assert stats["synced"] == 2, stats
    assert not await r.exists(k.base + "due:t:acme") and not await r.exists(k.base + "held:k")
    assert await claim(stores, 2) == []


async def test_wait_until_sees_the_rebuilt_queue(stores: Stores, client: Client, settings: Settings) -> None:
    """Workers' claims refuse an unstamped queue and succeed after the reconciler's pass."""
    from fencepost.core.errors import NotStamped

    await client.submit("t.noop")
    await stores.redis.delete(stores.keys(Q).epoch)
    with pytest.raises(NotStamped):
        await claim(stores)
    rec = Reconciler(settings)
    await rec.stores.connect()
    try:
        await rec.maintain_once()
    finally:
        await rec.stores.close()
    assert await wait_until(lambda: claim(stores), timeout=5, what="a claim after the rebuild")
