"""`fencepost reconcile --check` compares every run in bulk reads (issue 24 item 12): each run hash and
sorted-set member as `id state version` against PostgreSQL's rows, the runs that differ examined in
full. It reports every kind of drift (stale_hash and corrupt too, which the old `--fast` set comparison
missed), reads the same through HMGET where Redis refuses SORT's GET patterns (Redis Cluster before 8.0),
and examines no run of a queue whose runs sit where their states say, whatever those states are.
bench/reconcile_check.py times it at 1,000,000 runs."""

from __future__ import annotations

from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core.bulkread import read_queue
from fencepost.core.config import Settings
from fencepost.core.hot import ClaimArgs, Finish, FinishArgs
from fencepost.core.models import Submit
from fencepost.core.stores import Stores
from fencepost.reconciler.drift import DriftRepair
from tests.conftest import record_all
from tests.test_drift import Q, inject, reconcile, reported, snapshot

pytestmark = pytest.mark.slow

KINDS = ("lost_lease", "unrecorded", "missing", "unqueued", "corrupt", "terminal_in_pg", "stale_hash",
         "orphan_hash", "orphan_member")


async def test_the_check_reports_every_kind_of_drift_and_changes_nothing(client: Client, stores: Stores,
                                                                          settings: Settings) -> None:
    runs = await inject(client, stores, settings)
    # a tenant's run whose member sits in the default tenant's due set: claims read it there, but
    # it is not queued where its hash says it belongs (the tenant's own set)
    k, r = stores.keys(Q), stores.redis
    elsewhere = await client.submit_many([Submit(handler="t.noop", tenant="acme")])
    await r.zrem(k.tenant_due("acme"), elsewhere[0])
    await r.zadd(k.due, {str(elsewhere[0]): 5})
    before = await snapshot(stores)

    # sort=False: what a Redis Cluster before 8.0 gets (ZRANGE and pipelined HMGET)
    assert await read_queue(stores, Q, sort=False) == await read_queue(stores, Q), "HMGET reads differ from SORT_RO's"

    check = reconcile(settings, "--check", "--grace", "0")
    assert check.returncode == 1, check.stderr
    found = reported(check.stdout)
    for kind in KINDS:
        assert (kind, runs[kind]) in found, f"{kind} not reported:\n{check.stdout}"
    assert ("corrupt", runs["corrupt2"]) in found, check.stdout
    assert ("unqueued", elsewhere[0]) in found, check.stdout
    assert not any(rid in (runs["_ok"], runs["_running"]) for _, rid in found), check.stdout
    assert len(found) == len(KINDS) + 2, check.stdout
    assert await snapshot(stores) == before, "--check changed Redis"
    old = reconcile(settings, "--check", "--fast", "--grace", "0")  # the flag older scripts pass: the same check
    assert reported(old.stdout) == found and old.returncode == 1, old.stdout + old.stderr

    fix = reconcile(settings, "--repair", "--grace", "0")
    assert fix.returncode == 0, fix.stderr
    assert set(reported(fix.stdout)) == set(found)
    again = reconcile(settings, "--check", "--grace", "0")
    assert again.returncode == 0, again.stdout + again.stderr


async def _claim(stores: Stores, n: int) -> list[tuple[int, int]]:
    return [(c.id, c.token) for c in await stores.scripts.claim_due(stores.keys(Q), ClaimArgs(n, "w-test", 600_000, 0))]


async def _finish(stores: Stores, run_id: int, token: int, outcome: str, delay_ms: int = 0) -> str:
    data: bytes | str = b"\x90" if outcome == "ok" else "boom"
    out = await stores.scripts.finish_runs(stores.keys(Q), FinishArgs(3), [
        Finish(run_id, token, outcome, data, "" if outcome == "ok" else "ValueError", delay_ms)])
    return out[0].state


async def test_a_queue_in_every_state_and_set_is_checked_without_examining_a_run(client: Client, stores: Stores,
                                                                                 settings: Settings) -> None:
    async def submit(**kw: Any) -> int:
        return (await client.submit_many([Submit(handler=kw.pop("handler", "t.noop"), **kw)]))[0]

    # one run at a time in the due set, claimed or finished before the next is submitted
    retrying = await submit(handler="t.fail")
    [(rid, tok)] = await _claim(stores, 1)
    assert rid == retrying and await _finish(stores, rid, tok, "error", 3_600_000) == "RETRY_WAIT"
    done = await submit()
    [(rid, tok)] = await _claim(stores, 1)
    assert rid == done and await _finish(stores, rid, tok, "ok") == "SUCCEEDED"
    running = await submit()
    assert [r for r, _ in await _claim(stores, 1)] == [running]
    slot = [await submit(concurrency_key="k", concurrency_limit=1) for _ in range(2)]
    assert [r for r, _ in await _claim(stores, 2)] == slot[:1]  # the second waits in held:k
    rated = [await submit(rate_key="r", rate_limit="1/1d") for _ in range(2)]
    assert [r for r, _ in await _claim(stores, 2)] == rated[:1]  # the second waits in rheld:r
    k, r = stores.keys(Q), stores.redis
    assert await r.zscore(k.held("k"), slot[1]) and await r.zscore(k.rate_held("r"), rated[1])
    tenant = await submit(tenant="acme")
    waiting = await submit()
    later = await submit(delay=3600)
    paused = await submit()
    await client.pause(paused)
    cancelled = await submit()
    await client.cancel(cancelled)
    await record_all(stores)
    assert {x["status"] for x in [await client.get(i) for i in (retrying, done, running, slot[1], rated[1], tenant,
                                                                 waiting, later, paused, cancelled)]} == {
        "RETRY_WAIT", "SUCCEEDED", "RUNNING", "PENDING", "PAUSED", "CANCELLED"}

    inspected: list[int] = []
    inspect = stores.scripts.repair_inspect

    async def counting(keys: Any, ids: Any) -> Any:
        ids = list(ids)
        inspected.extend(ids)
        return await inspect(keys, ids)

    stores.scripts.repair_inspect = counting  # type: ignore[method-assign]
    drift = DriftRepair(stores, grace_s=0.0)
    assert await drift.full_pass(Q, repair=False, grace_s=0.0) == []
    assert inspected == [], "runs that sit where their states say were examined one by one"
    # a change in any of them is found: the held run's hash falls behind PostgreSQL
    await r.hset(k.run(slot[1]), "version", 0)
    pool = stores.db.pool
    assert pool is not None
    await pool.execute("UPDATE runs SET version = version + 2 WHERE id = $1", slot[1])
    assert [(d.kind, d.run_id) for d in await drift.full_pass(Q, repair=False, grace_s=0.0)] == [
        ("stale_hash", slot[1])]
    assert inspected == [slot[1]]
