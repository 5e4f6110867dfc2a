"""Per-key concurrency limits with real worker processes: at most 5 exports per customer
at once over a worker with 50 slots, the other customer not starved, and the slots of a
SIGKILLed worker given back by the reaper."""

from __future__ import annotations

import signal
from datetime import datetime
from pathlib import Path

import pytest

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.models import Submit
from fencepost.core.stores import Stores
from tests.conftest import log_tail, record_all, spawn, wait_until

pytestmark = pytest.mark.slow

WORKER = ("worker", "--app", "tests.apps:registry", "--queue", "tq", "--concurrency", "50")


def _max_overlap(spans: list[tuple[datetime, datetime]]) -> int:
    """Most intervals open at once (a finish at t frees its slot before a start at t)."""
    edges = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, d in edges:
        now += d
        peak = max(peak, now)
    return peak


async def _spans(stores: Stores) -> dict[str, list[tuple[datetime, datetime]]]:
    rows = await stores.db.pool.fetch(  # type: ignore[union-attr]
        "SELECT r.concurrency_key, a.started_at, a.finished_at FROM attempts a JOIN runs r ON r.id = a.run_id "
        "WHERE r.handler = 't.export' ORDER BY a.started_at")
    out: dict[str, list[tuple[datetime, datetime]]] = {}
    for r in rows:
        assert r["finished_at"] is not None, "every attempt is closed once the runs are done"
        out.setdefault(r["concurrency_key"], []).append((r["started_at"], r["finished_at"]))
    return out


async def _all_succeeded(client: Client, ids: list[int], timeout: float, log: Path) -> None:
    for rid in ids:
        try:
            out = await client.wait(rid, timeout=timeout)
        except Exception as exc:
            raise AssertionError(f"run {rid}: {exc}\n--- worker log ---\n{log_tail(log)}") from None
        assert out.status == "SUCCEEDED", (rid, out, log_tail(log))


async def test_at_most_five_exports_per_customer_run_at_once(client: Client, settings: Settings, stores: Stores,
                                                             tmp_path: Path) -> None:
    a = await client.submit_many([Submit(handler="t.export", args=("A",)) for _ in range(20)])
    b = await client.submit_many([Submit(handler="t.export", kwargs={"customer": "B"}) for _ in range(5)])
    log = tmp_path / "worker.log"
    w = spawn(settings, *WORKER, log=log)
    try:
        await _all_succeeded(client, a + b, 60, log)
    finally:
        w.send_signal(signal.SIGTERM)
        w.wait(30)
    await record_all(stores)
    spans = await _spans(stores)
    assert set(spans) == {"t.export:A", "t.export:B"}
    assert _max_overlap(spans["t.export:A"]) == 5, "A ran at most 5 at once, and used its 5 slots"
    assert _max_overlap(spans["t.export:B"]) == 5
    sixth_a = sorted(s for s, _ in spans["t.export:A"])[5]
    assert min(s for s, _ in spans["t.export:B"]) < sixth_a, "B, submitted after A's 20, waited behind A's backlog"


async def test_a_sigkilled_workers_slots_come_back_through_the_reaper(client: Client, settings: Settings,
                                                                      stores: Stores, tmp_path: Path) -> None:
    ids = await client.submit_many([Submit(handler="t.export", args=("A", 30.0)) for _ in range(5)]
                                   + [Submit(handler="t.export", args=("A", 0.1)) for _ in range(3)])
    keys = stores.keys("tq")
    log1, log2 = tmp_path / "w1.log", tmp_path / "w2.log"
    w1 = spawn(settings, *WORKER, log=log1, FENCEPOST_LEASE_MS="1500")

    async def five_leased() -> bool:
        return await stores.redis.scard(keys.base + "ck:t.export:A") == 5

    try:
        await wait_until(five_leased, timeout=30, what="5 exports of A leased")
        assert await stores.redis.zcard(keys.base + "held:t.export:A") == 3, "the other 3 wait for a slot"
        from prometheus_client import REGISTRY

        from fencepost.reconciler.gauges import Gauges

        await Gauges(stores).observe(["tq"])
        assert REGISTRY.get_sample_value("fencepost_held_runs", {"queue": "tq"}) == 3
        w1.send_signal(signal.SIGKILL)
        w1.wait(10)
        w2 = spawn(settings, *WORKER, log=log2, FENCEPOST_LEASE_MS="1500")
        try:
            # the 30 s runs come back when their leases expire; the short ones finish first
            await _all_succeeded(client, ids[5:], 30, log2)
        finally:
            w2.kill()
            w2.wait(10)
    finally:
        if w1.poll() is None:
            w1.kill()
    assert await stores.redis.scard(keys.base + "ck:t.export:A") <= 5


async def test_a_submit_without_the_key_argument_is_refused_and_changes_nothing(client: Client) -> None:
    with pytest.raises(InvalidInput, match="customer"):
        await client.submit("t.export")
    with pytest.raises(InvalidInput, match="tenant"):
        await client.submit("t.echo", 1, tenant="has space")
    with pytest.raises(InvalidInput, match="concurrency_key"):
        await client.submit("t.echo", 1, concurrency_limit=3)
    assert await client.stores.db.pool.fetchval("SELECT count(*) FROM runs") == 0  # type: ignore[union-attr]


async def test_queue_settings_from_the_cli(client: Client, settings: Settings, stores: Stores) -> None:
    """`fencepost submit --tenant`, `queue weight / limit / aging / show`: the record and the
    Redis copy change together; a bad value is one line on stderr, exit 1, nothing changed."""
    from tests.test_control import _cli

    code, out = await _cli(settings, "submit", "t.echo", "--args", "[1]", "--tenant", "acme")
    assert code == 0, out
    pool = stores.db.pool
    assert pool is not None
    rid = int(out.split()[-1])
    assert await pool.fetchval("SELECT tenant FROM runs WHERE id = $1", rid) == "acme"
    code, out = await _cli(settings, "status", str(rid))
    assert code == 0 and "tenant            acme" in out, out
    for args in (("weight", "tq", "acme", "3"), ("limit", "tq", "2", "--key", "t.export:A"), ("limit", "tq", "50"),
                 ("aging", "tq", "10")):
        code, out = await _cli(settings, "queue", *args)
        assert code == 0, out
    assert "acme" in out and "max running 50" in out and "aging 10 s" in out, out
    base = stores.keys("tq").base
    assert await stores.redis.hget(base + "weights", "acme") == b"3.0"
    assert await stores.redis.hget(base + "limits", "t.export:A") == b"2"
    assert await stores.redis.hmget(stores.keys("tq").config, "max_running", "priority_age_ms") == [b"50", b"10000"]
    row = await pool.fetchrow("SELECT max_running, priority_age_ms FROM queues WHERE name = 'tq'")
    assert (row["max_running"], row["priority_age_ms"]) == (50, 10000)
    code, out = await _cli(settings, "queue", "weight", "tq", "acme", "5000")
    assert code == 1 and "weight must be between" in out, out
    code, out = await _cli(settings, "queue", "limit", "nope", "3")
    assert code == 1 and "no queue named 'nope'" in out, out
    assert await stores.redis.hget(base + "weights", "acme") == b"3.0"
    # a failover rebuild copies the settings back from the record
    await stores.redis.delete(base + "weights", base + "limits", stores.keys("tq").config)
    from fencepost.reconciler.rebuild import rebuild_queue

    await rebuild_queue(stores, "tq", force=True)
    assert await stores.redis.hget(base + "weights", "acme") == b"3.0"
    assert await stores.redis.hget(stores.keys("tq").config, "max_running") == b"50"
