"""Redis Cluster (issue 8): the core scenarios on a real 3-master cluster (+1 replica each)
started here on loopback ports with `redis-cli --cluster create`, with real worker and
reconciler processes started with FENCEPOST_REDIS_CLUSTER=1:

- queues spread across hash slots owned by different primaries, and each queue's epoch
  stamp names the run_id of the primary that owns its slot (INFO inside the Lua script);
- submit, claim, fencing (a stale finish is refused), retries to the dead letter;
- pause and resume of a running checkpointed job, every item processed exactly once;
- failover of one primary (SIGKILL, its replica promoted by the cluster itself) under load:
  the reconciler rebuilds that primary's queues, no acknowledged submit is lost, no run
  completed in PostgreSQL runs again, a pre-failover token is refused.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit
from tests.apps import registry
from tests.conftest import spawn, wait_until
from tests.servers import RedisClusterServers
from tests.test_failover import Load, assert_guarantees, count_status

pytestmark = pytest.mark.slow

Q = "tq"  # the tests.apps handlers' queue (slot 10795)
SPREAD = ("tq", "held", "a", "c", "q2", "q4")  # slots 10795, 3823, 15495, 7365, 11641, 3519
SPAN = 2 ** 40


@pytest_asyncio.fixture(scope="module")
async def cluster() -> AsyncIterator[RedisClusterServers]:
    c = await RedisClusterServers(masters=3, replicas=1).start()
    try:
        yield c
    finally:
        c.cleanup()  # every node stopped by its pid


@pytest_asyncio.fixture
async def cs(settings: Settings, cluster: RedisClusterServers) -> Settings:
    """The test's settings pointed at the cluster (a seed node's URL plus redis_cluster)."""
    return Settings(redis_url=cluster.url, redis_cluster=True, database_url=settings.database_url,
                    prefix=settings.prefix, backoff_base_ms=50, backoff_cap_ms=500)


@pytest_asyncio.fixture
async def cclient(cs: Settings) -> AsyncIterator[Client]:
    c = await Client(settings=cs).connect()
    await c.register(registry)
    yield c
    await c.close()


_STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _stop_processes() -> Any:
    """Every worker / reconciler a test started is killed when it ends, whatever happened."""
    yield
    stop(*_STARTED)
    _STARTED.clear()


def start(cs: Settings, tmp_path: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    p = spawn(cs, *args, log=tmp_path / f"{name}.log", FENCEPOST_REDIS_CLUSTER="1")
    _STARTED.append(p)
    return p


def stop(*procs: subprocess.Popen[bytes] | None) -> None:
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
        if p is not None:
            p.wait(10)


def worker(cs: Settings, tmp_path: Path, *queues: str, name: str = "worker") -> subprocess.Popen[bytes]:
    qs = [a for q in queues for a in ("--queue", q)]
    return start(cs, tmp_path, name, "worker", "--app", "tests.apps:registry", *qs, "--concurrency", "20",
                 "--processes", "1")


async def statuses(db_url: str, ids: list[int]) -> dict[int, str]:
    conn = await asyncpg.connect(db_url)
    try:
        return dict(await conn.fetch("SELECT id, status FROM runs WHERE id = ANY($1)", ids))
    finally:
        await conn.close()


async def run_id_of(cluster: RedisClusterServers, port: int) -> str:
    r = cluster.by_port(port).client()  # a plain connection to that one node
    try:
        return (await r.info("server"))["run_id"]
    finally:
        await r.aclose()


async def test_queues_spread_over_primaries_and_each_stamp_names_its_slot_owner(
        cluster: RedisClusterServers, cclient: Client, cs: Settings) -> None:
    for q in SPREAD:
        await cclient.submit("t.noop", queue=q)
    owners = {q: await cluster.owner(f"{cs.prefix}:{{{q}}}:due") for q in SPREAD}
    assert len(set(owners.values())) >= 2, owners  # (all three with these names)
    r = cclient.stores.redis
    for q in SPREAD:
        stamp = await r.hgetall(cclient.stores.keys(q).epoch)
        # stamp_queue.lua ran INFO on the node owning the queue's slot: its run_id, no other
        assert stamp[b"server"].decode() == await run_id_of(cluster, owners[q]), q
    # SCAN on the cluster client walks every primary: the prefix's keys live on several nodes
    found = [k async for k in r.scan_iter(match=f"{cs.prefix}:*", count=1000)]
    tags = {k.decode().split("{")[1].split("}")[0] for k in found if b"{" in k}  # (+ the untagged queue set)
    assert tags >= set(SPREAD)


async def test_submit_claim_fencing_and_retries(cluster: RedisClusterServers, cclient: Client, cs: Settings,
                                                tmp_path: Path) -> None:
    stores = cclient.stores
    # claim in this process, then a second claim after the lease expired: the old token is stale
    rid = await cclient.submit("t.noop", queue="held")
    keys = stores.keys("held")
    first = await stores.scripts.run("claim_due", keys, [1, "w-old", 50, 0])
    assert int(first[0]) == rid
    await asyncio.sleep(0.2)  # the 50 ms lease is past on the server's clock
    assert await stores.scripts.run("reap_expired", keys, [100, 10]) == 1
    second = await stores.scripts.run("claim_due", keys, [1, "w-new", 30_000, 0])
    old_tok, new_tok = int(first[1]), int(second[1])
    assert new_tok > old_tok
    stale = await stores.scripts.run("finish_runs", keys, [3, rid, old_tok, "ok", b"\x90", "", 0])
    assert stale == [b"STALE"]
    ok = await stores.scripts.run("finish_runs", keys, [3, rid, new_tok, "ok", b"\x90", "", 0])
    assert ok != [b"STALE"]

    # real processes: one worker serving queues on three primaries (one BLPOP per queue)
    ok_ids = [await cclient.submit("t.noop", queue=q) for q in ("tq", "a", "q4")]
    # tenants' due sets and a concurrency key's lease sets live in the queue's slot too
    ok_ids += [await cclient.submit("t.echo", 1, queue="a", tenant="acme"),
               await cclient.submit("t.export", "A", 0.05, queue="q4", tenant="acme")]
    fail_id = await cclient.submit("t.fail", queue="c")
    rec = start(cs, tmp_path, "reconciler", "reconciler")
    w = worker(cs, tmp_path, "tq", "a", "q4", "c")
    try:
        async def settled() -> bool:
            st = await statuses(cs.database_url, [*ok_ids, fail_id])
            return all(st.get(i) == "SUCCEEDED" for i in ok_ids) and st.get(fail_id) == "FAILED"

        await wait_until(settled, timeout=40, what="runs on three primaries to settle", interval=0.1)
        late = await cclient.submit("t.noop", queue="a")  # an idle worker wakes from its per-queue BLPOP
        assert (await cclient.wait(late, timeout=20)).status == "SUCCEEDED"
        assert w.poll() is None and rec.poll() is None
    finally:
        stop(w, rec)
    attempts = await cclient.attempts(fail_id)
    assert len(attempts) == 4 and all(a["outcome"] == "error" for a in attempts), attempts
    tokens = [a["token"] for a in attempts]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


async def test_pause_and_resume_a_running_checkpointed_job(cluster: RedisClusterServers, cclient: Client,
                                                           cs: Settings, tmp_path: Path) -> None:
    conn = await asyncpg.connect(cs.database_url)
    await conn.execute("CREATE TABLE processed_items (op_key text NOT NULL, run_id bigint NOT NULL, "
                       "attempt int NOT NULL)")

    async def rows() -> int:
        return await conn.fetchval("SELECT count(*) FROM processed_items")

    n, every = 1500, 50
    rec = start(cs, tmp_path, "reconciler", "reconciler")
    w = worker(cs, tmp_path, "q2")
    try:
        rid = await cclient.submit("t.items", n, every, cs.database_url, 0.002, queue="q2")
        await wait_until(lambda: rows(), timeout=30, what="first items")
        assert await cclient.pause(rid, reason="cluster test") == "REQUESTED"

        async def paused() -> bool:
            return (await cclient.stores.redis.hget(cclient.stores.keys("q2").run(rid), "state")) == b"PAUSED"

        await wait_until(paused, timeout=30, what="the run to pause at a checkpoint")
        at_pause = await rows()
        assert 0 < at_pause < n and at_pause % every == 0
        assert await cclient.resume(rid, reason="go on") == "PENDING"
        out = await cclient.wait(rid, timeout=60)
        assert (out.status, out.result) == ("SUCCEEDED", n)
    finally:
        stop(w, rec)
    dupes = await conn.fetchval("SELECT count(*) FROM (SELECT op_key FROM processed_items GROUP BY op_key "
                                "HAVING count(*) > 1) d")
    total = await rows()
    await conn.close()
    assert (total, dupes) == (n, 0), "an item was processed twice (or never)"


async def test_failover_of_one_primary_under_load(cluster: RedisClusterServers, cclient: Client, cs: Settings,
                                                  tmp_path: Path) -> None:
    stores = cclient.stores
    victim = await cluster.owner(f"{cs.prefix}:{{{Q}}}:due")
    # a queue on the same primary whose lease this process holds across the failover
    owners = {q: await cluster.owner(f"{cs.prefix}:{{{q}}}:due")
              for q in ("held", "q4", "b", "c", "a", "q2", "q3", "c1", "c2", "c3")}
    held_q = next(q for q, port in owners.items() if port == victim)
    other_q = next(q for q, port in owners.items() if port != victim)
    await cclient.submit("t.noop", queue=other_q)
    rec = start(cs, tmp_path, "reconciler", "reconciler")
    w = worker(cs, tmp_path, Q, other_q)
    load = Load(cclient).start()
    try:
        async def some_done() -> bool:
            return await count_status(cs.database_url, load.acked, ("SUCCEEDED",)) >= 40

        await wait_until(some_done, timeout=30, what="runs completed before the failover")
        # a lease held by "a worker" across the failover
        rid = await cclient.submit("t.noop", queue=held_q)
        raw = await stores.scripts.run("claim_due", stores.keys(held_q),
                                       [1, "w-held", 120_000, 0])
        held = [(int(raw[0]), int(raw[1]))]
        assert held[0][0] == rid
        conn = await asyncpg.connect(cs.database_url)
        epoch_before = await conn.fetchval("SELECT epoch FROM queues WHERE name = $1", Q)
        pre_max = epoch_before * SPAN + int(await stores.redis.get(stores.keys(Q).token) or 0)
        failed_at = time.time()
        promoted = await cluster.kill_primary(victim)  # SIGKILL by pid; the cluster promotes its replica
        assert promoted != victim and victim not in await cluster.primaries()
        await load.grows(80, timeout=40)  # submits and claims work again, by themselves

        async def rebuilt() -> bool:
            return (await conn.fetchval("SELECT epoch FROM queues WHERE name = $1", Q)) > epoch_before

        await wait_until(rebuilt, timeout=20, what="the reconciler to rebuild the failed-over queue")
    finally:
        await load.finish()

    async def all_done() -> bool:
        return await count_status(cs.database_url, load.acked, ("SUCCEEDED",)) == len(load.acked)

    try:
        await wait_until(all_done, timeout=60, what="every acknowledged run succeeded", interval=0.1)
        assert w.poll() is None and rec.poll() is None, "a worker or the reconciler died"
    except AssertionError as exc:
        tail = (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"{exc}\n{tail}") from None
    finally:
        stop(w, rec)
    assert "queue_rebuilt" in (tmp_path / "reconciler.log").read_text()
    await conn.close()
    # the pre-failover token is refused on the promoted replica
    keys = stores.keys(held_q)
    for hid, tok in held:
        out = await stores.scripts.run("finish_runs", keys, [3, hid, tok, "ok",
                                                             b"\x90", "", 0])
        assert out == [b"STALE"], (hid, out)
        assert await stores.scripts.run("renew_leases", keys, [1000, hid, tok]) == [0]
    await assert_guarantees(cs.database_url, load, failed_at, pre_max)


@pytest_asyncio.fixture
async def slow_failover_cluster() -> AsyncIterator[RedisClusterServers]:
    """A cluster of its own (the module's lost a primary in the failover test) whose replicas
    take over only after a 4 s node timeout: a failover window long enough to measure in."""
    c = await RedisClusterServers(masters=3, replicas=1, node_timeout_ms=4000).start()
    try:
        yield c
    finally:
        c.cleanup()


async def _claim_rate(r: Any, key: str, since: float, until: float, samples: list[tuple[float, int]]) -> float:
    """Runs claimed per second from the queue's due set between two monotonic instants (sampled)."""
    inside = [(t, n) for t, n in samples if since <= t <= until]
    assert len(inside) >= 2, (since, until, samples[-5:])
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n0 - n1) / (t1 - t0)


async def test_a_dead_cluster_shard_delays_only_its_own_queues(slow_failover_cluster: RedisClusterServers,
                                                              settings: Settings, tmp_path: Path) -> None:
    cluster = slow_failover_cluster
    cs = Settings(redis_url=cluster.url, redis_cluster=True, database_url=settings.database_url,
                  prefix=settings.prefix, backoff_base_ms=50, backoff_cap_ms=500)
    client = await Client(settings=cs).connect()
    await client.register(registry)
    owners = {q: await cluster.owner(f"{cs.prefix}:{{{q}}}:due") for q in SPREAD}
    dead_q = Q
    healthy_q = next(q for q in SPREAD if owners[q] != owners[dead_q])
    # a backlog on the healthy shard that one worker claims from all along (5 slots, 50 ms runs)
    for _ in range(6):
        await client.submit_many([Submit(handler="t.sleep", args=(0.05,), queue=healthy_q) for _ in range(250)])
    warm = await client.submit("t.noop", queue=dead_q)
    rec = start(cs, tmp_path, "reconciler", "reconciler")
    w = start(cs, tmp_path, "worker", "worker", "--app", "tests.apps:registry", "--queue", dead_q,
              "--queue", healthy_q, "--concurrency", "5", "--processes", "1")
    healthy = cluster.by_port(owners[healthy_q]).client()  # a plain connection to the healthy primary
    due = client.stores.keys(healthy_q).due
    samples: list[tuple[float, int]] = []
    sampling = True

    async def sample() -> None:
        while sampling:
            samples.append((time.monotonic(), int(await healthy.zcard(due))))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        assert (await client.wait(warm, timeout=30)).status == "SUCCEEDED"  # both queues served

        async def claiming() -> bool:
            return len(samples) > 1 and samples[-1][1] < 1500 - 20

        await wait_until(claiming, timeout=20, what="the healthy queue's backlog to be claimed")
        before_from = time.monotonic()
        await asyncio.sleep(2.0)
        killed_at = time.monotonic()
        await cluster.kill_primary(owners[dead_q])  # SIGKILL; returns once its replica is promoted
        promoted_at = time.monotonic()
        assert promoted_at - killed_at > 3.0, "the failover window is too short to measure"
        normal = await _claim_rate(healthy, due, before_from, killed_at, samples)
        during = await _claim_rate(healthy, due, killed_at, promoted_at, samples)
        assert samples[-1][1] > 0, "the backlog ran out inside the window"
        # claims on the healthy shard go on at (about) their normal rate while the other shard
        # is dead: a claim or wait on the dead node never holds them (a generous bound)
        assert during >= 0.5 * normal, (f"healthy queue claimed {during:.1f}/s while a shard was dead, "
                                        f"{normal:.1f}/s before")
        # the dead shard's queue recovers once its replica took over (and the reconciler restamped it)
        after = await client.submit("t.noop", queue=dead_q)
        assert (await client.wait(after, timeout=40)).status == "SUCCEEDED"
        assert w.poll() is None and rec.poll() is None
        print(f"healthy queue: {normal:.1f} claims/s before, {during:.1f}/s during the "
              f"{promoted_at - killed_at:.1f} s failover window")
    finally:
        sampling = False
        await sampler
        stop(w, rec)
        await healthy.aclose()
        await client.close()


@pytest_asyncio.fixture
async def very_slow_failover_cluster() -> AsyncIterator[RedisClusterServers]:
    """Replicas take over only after a 10 s node timeout: the dead shard stays dead long enough to
    see whether the healthy shards' history waits for it."""
    c = await RedisClusterServers(masters=3, replicas=1, node_timeout_ms=10_000).start()
    try:
        yield c
    finally:
        c.cleanup()


async def test_a_dead_cluster_shard_delays_only_its_own_queues_history(
        very_slow_failover_cluster: RedisClusterServers, settings: Settings) -> None:
    """The recorder reads every queue's stream; one on a dead primary fails alone (before: the one
    failed read failed the whole batch, so no queue's history was recorded until the failover, the
    cluster soak's 5.6-5.9 s recovery of a queue on a healthy shard)."""
    from fencepost.core.hot import ClaimArgs
    from fencepost.reconciler.recorder import Recorder

    cluster = very_slow_failover_cluster
    cs = Settings(redis_url=cluster.url, redis_cluster=True, database_url=settings.database_url,
                  prefix=settings.prefix, backoff_base_ms=50, backoff_cap_ms=500)
    client = await Client(settings=cs).connect()
    await client.register(registry)
    owners = {q: await cluster.owner(f"{cs.prefix}:{{{q}}}:due") for q in SPREAD}
    queues_owner = await cluster.owner(client.stores.queues_key)
    dead_q = next(q for q in SPREAD if owners[q] == queues_owner)  # the set of queues dies with it too
    healthy_q = next(q for q in SPREAD if owners[q] != owners[dead_q])
    stores = client.stores
    for q in (dead_q, healthy_q):
        await client.submit("t.noop", queue=q)
    rec = Recorder(stores, consumer="one")
    stop_rec = asyncio.Event()
    task = asyncio.create_task(rec.run(stop_rec))
    conn = await asyncpg.connect(settings.database_url)
    try:
        await rec.queues()  # what it knows before the kill

        async def recorded(rid: int) -> bool:
            return bool(await conn.fetchval("SELECT count(*) FROM attempts WHERE run_id = $1", rid))

        first = await client.submit("t.noop", queue=healthy_q)
        jobs = await stores.scripts.claim_due(stores.keys(healthy_q), ClaimArgs(10, "w", 60_000, 10))
        assert first in [j.id for j in jobs]
        await wait_until(lambda: recorded(first), timeout=20, what="a claim recorded before the kill")
        killed_at = time.monotonic()
        cluster.by_port(owners[dead_q]).kill()  # SIGKILL; its replica takes over only after 10 s
        rid = await client.submit("t.noop", queue=healthy_q)
        jobs = await stores.scripts.claim_due(stores.keys(healthy_q), ClaimArgs(10, "w", 60_000, 10))
        assert rid in [j.id for j in jobs]
        await wait_until(lambda: recorded(rid), timeout=8, what="the healthy queue's claim recorded")
        took = time.monotonic() - killed_at
        assert took < 8, took
        print(f"healthy queue's claim recorded {took:.1f} s after its neighbour shard died")
    finally:
        stop_rec.set()
        await asyncio.wait_for(task, 30)
        await conn.close()
        await client.close()
