"""Failure drills under a running submit / claim / finish load, with real redis-server
processes on loopback ports, a real reconciler process and a real worker process:

- the primary is killed (SIGKILL) and a replica that missed writes is promoted;
- FLUSHALL;
- Redis restarted without persistence;
- PostgreSQL connections of the test database terminated repeatedly (the shared server
  itself is not restarted: other tests run on it).

Each time: no acknowledged submit is lost, every run reaches a terminal state, no run
completed in PostgreSQL is claimed again, tokens issued afterwards are above every token
issued before, and a holder of a pre-failure token cannot finish or renew.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import DatabaseUnavailable, FencepostError
from fencepost.core.models import Submit
from fencepost.core.stores import Stores
from fencepost.dev.faults import TcpProxy
from tests.apps import registry
from tests.conftest import spawn, wait_until
from tests.servers import RedisServer

pytestmark = pytest.mark.slow

Q = "tq"
HELD = "held"
WORKER = ("worker", "--app", "tests.apps:registry", "--queue", Q, "--concurrency", "20", "--processes", "1")
SPAN = 2 ** 40


class Load:
    """Submits small batches until stopped; `acked` holds every run id a submit returned."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.acked: list[int] = []
        self.errors: list[BaseException] = []
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Load:
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.acked += await self.client.submit_many(
                    [Submit(handler="t.sleep", args=(0.02,)) for _ in range(8)])
            except FencepostError as exc:  # a submit not acknowledged; the caller would retry
                self.errors.append(exc)
            await asyncio.sleep(0.04)

    async def finish(self) -> None:
        self.stop.set()
        assert self.task is not None
        await self.task

    async def grows(self, n: int, timeout: float = 30.0) -> None:
        target = len(self.acked) + n

        async def enough() -> bool:
            return len(self.acked) >= target

        await wait_until(enough, timeout=timeout, what=f"{n} more acknowledged submits", interval=0.05)


async def count_status(db_url: str, ids: list[int], statuses: tuple[str, ...]) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM runs WHERE id = ANY($1) AND status = ANY($2)",
                                   ids, list(statuses))
    finally:
        await conn.close()


async def claim_one(stores: Stores, client: Client) -> tuple[int, int]:
    """Submit and claim one run of a queue no worker serves, in this process: a worker that
    will still hold its token after the failure."""
    await client.submit("t.noop", queue=HELD)
    raw = await stores.scripts.run("claim_due", stores.keys(HELD), [1, "w-held", 120_000, 0])
    assert raw, "nothing to claim"
    return int(raw[0]), int(raw[1])


async def max_token(stores: Stores, db_url: str) -> int:
    """Above every token issued so far on the current dataset."""
    conn = await asyncpg.connect(db_url)
    epoch = await conn.fetchval("SELECT epoch FROM queues WHERE name = $1", Q)
    await conn.close()
    return epoch * SPAN + int(await stores.redis.get(stores.keys(Q).token) or 0)


async def assert_stale(stores: Stores, held: list[tuple[int, int]]) -> None:
    """A worker holding a pre-failure token can neither finish, renew nor checkpoint."""
    from fencepost.worker.checkpoints import Checkpoints
    from fencepost.worker.context import Context, LeaseLost

    keys = stores.keys(HELD)
    checkpoints = Checkpoints(stores, registry)
    for rid, tok in held:
        with pytest.raises(LeaseLost):
            await checkpoints.write(Context(rid, 1, tok, HELD, "t.noop"), {"done": 1}, 1)
        out = await stores.scripts.run("finish_runs", keys, [3, rid, tok, "ok", b"\x90", "", 0])
        assert out == [b"STALE"], (rid, out)
        assert await stores.scripts.run("renew_leases", keys, [1000, rid, tok]) == [0]


async def assert_guarantees(db_url: str, load: Load, failed_at: float, pre_max: int | None) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        ids = load.acked
        statuses = dict(await conn.fetch("SELECT id, status FROM runs WHERE id = ANY($1)", ids))
        assert len(statuses) == len(set(ids)), "an acknowledged submit is missing from PostgreSQL"
        assert set(statuses.values()) == {"SUCCEEDED"}, {s for s in statuses.values()}
        # No run is claimed after PostgreSQL recorded it as completed.
        rerun = await conn.fetch(
            """SELECT c.run_id FROM history c
               JOIN (SELECT run_id, min(recorded_at) AS done FROM history WHERE to_status = 'SUCCEEDED'
                     GROUP BY run_id) s ON s.run_id = c.run_id
               WHERE c.type = 'claimed' AND c.at > s.done""")
        assert not rerun, f"runs claimed again after completion: {[r['run_id'] for r in rerun]}"
        if pre_max is not None:
            low = await conn.fetchval("SELECT min(token) FROM attempts WHERE run_id = ANY($2) AND started_at > to_timestamp($1)",
                                      failed_at, ids)
            assert low is not None and low > pre_max, (low, pre_max)
    finally:
        await conn.close()


@pytest_asyncio.fixture
async def drill(settings: Settings, tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
    """Run the system against `redis_url` under load; `failure()` is called mid-load."""
    procs: list[subprocess.Popen[bytes]] = []
    cleanup: list[Any] = []

    async def run(redis_url: str, failure: Callable[[Stores, Load], Awaitable[tuple[list[tuple[int, int]], int | None, float]]],
                  ) -> tuple[Load, Settings]:
        s = Settings(redis_url=redis_url, database_url=settings.database_url, prefix=settings.prefix,
                     backoff_base_ms=50, backoff_cap_ms=500)
        client = await Client(settings=s).connect()
        cleanup.append(client)
        await client.register(registry)
        stores = await Stores(s).connect()
        cleanup.append(stores)
        await client.submit("t.noop")  # creates and stamps the queues
        await client.submit("t.noop", queue=HELD)
        procs.append(spawn(s, "reconciler", log=tmp_path / "reconciler.log"))
        procs.append(spawn(s, *WORKER, log=tmp_path / "worker.log"))
        load = Load(client).start()
        try:
            async def some_done() -> bool:
                return await count_status(s.database_url, load.acked, ("SUCCEEDED",)) >= 40

            await wait_until(some_done, timeout=30, what="runs completed before the failure")
            held, pre_max, failed_at = await failure(stores, load)
            await load.grows(80, timeout=40)  # submits and claims work again, by themselves
        finally:
            await load.finish()

        async def all_done() -> bool:
            return await count_status(s.database_url, load.acked, ("SUCCEEDED",)) == len(load.acked)

        log = (tmp_path / "worker.log").read_text(errors="replace")[-3000:] if (tmp_path / "worker.log").exists() else ""
        try:
            await wait_until(all_done, timeout=60, what="every acknowledged run succeeded", interval=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log}") from None
        assert all(p.poll() is None for p in procs), "a worker or the reconciler died"
        await assert_stale(stores, held)
        await assert_guarantees(s.database_url, load, failed_at, pre_max)
        return load, s

    yield run
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)
    for c in cleanup:
        await c.close()


async def test_primary_killed_and_a_replica_that_missed_writes_promoted(drill: Any) -> None:
    primary = await RedisServer().start()
    replica = await RedisServer(replicaof=primary).start()
    proxy = await TcpProxy("127.0.0.1", primary.port).start()
    try:
        async def failover(stores: Stores, load: Load) -> tuple[list[tuple[int, int]], int | None, float]:
            held = [await claim_one(stores, load.client)]  # the replica will have this lease
            p = primary.client()
            assert await p.execute_command("WAIT", 1, 2000) == 1
            r = replica.client()
            asleep = asyncio.create_task(r.execute_command("DEBUG", "SLEEP", 3))  # replica stops applying writes
            await asyncio.sleep(0.05)  # let the DEBUG command reach the replica before we measure
            before = await count_status(stores.settings.database_url, load.acked, ("SUCCEEDED",))

            async def missed() -> bool:  # runs finished and recorded that the replica never sees
                return await count_status(stores.settings.database_url, load.acked, ("SUCCEEDED",)) >= before + 20

            await wait_until(missed, timeout=2.5, what="writes the replica misses")
            held.append(await claim_one(stores, load.client))  # a lease the replica never sees
            await load.grows(16, timeout=2)  # acknowledged submits the replica never sees
            pre_max = await max_token(stores, stores.settings.database_url)
            failed_at = time.time()
            primary.kill()  # SIGKILL: the replica missed everything since DEBUG SLEEP
            await asleep
            await r.execute_command("REPLICAOF", "NO", "ONE")
            proxy.switch("127.0.0.1", replica.port)
            await p.aclose()
            await r.aclose()
            return held, pre_max, failed_at

        await drill(proxy.url(primary.url), failover)
    finally:
        await proxy.close()
        primary.cleanup()
        replica.cleanup()


async def test_flushall_mid_load(drill: Any) -> None:
    server = await RedisServer().start()
    try:
        async def flush(stores: Stores, load: Load) -> tuple[list[tuple[int, int]], int | None, float]:
            held = [await claim_one(stores, load.client)]
            pre_max = await max_token(stores, stores.settings.database_url)
            failed_at = time.time()
            await stores.redis.flushall()
            return held, pre_max, failed_at

        await drill(server.url, flush)
    finally:
        server.cleanup()


async def test_redis_restarted_without_persistence(drill: Any) -> None:
    server = await RedisServer().start()
    servers = [server]
    try:
        async def restart(stores: Stores, load: Load) -> tuple[list[tuple[int, int]], int | None, float]:
            held = [await claim_one(stores, load.client)]
            pre_max = await max_token(stores, stores.settings.database_url)
            failed_at = time.time()
            server.kill()
            servers.append(await RedisServer(server.port).start())  # same port, empty dataset
            return held, pre_max, failed_at

        await drill(server.url, restart)
    finally:
        for s in servers:
            s.cleanup()


SUBMIT_HEAD = "-- params: %payload bytea[]%"
"""How a submit's insert (insert_runs, _keyed, _fresh) begins, as pg_stat_activity shows it."""


async def test_postgres_connections_terminated_mid_load(drill: Any, settings: Settings) -> None:
    """Simulates a PostgreSQL restart for this test's database only (pg_terminate_backend of
    every connection to it, repeatedly): the shared server itself is not restarted."""
    dbname = settings.database_url.rsplit("/", 1)[1]
    admin_url = settings.database_url.rsplit("/", 1)[0] + "/postgres"

    async def terminate(stores: Stores, load: Load) -> tuple[list[tuple[int, int]], int | None, float]:
        admin = await asyncpg.connect(admin_url)
        blocker = await asyncpg.connect(settings.database_url)
        try:
            # Deterministically catch a submit inside PostgreSQL: hold a lock its insert needs,
            # terminate its backend while it waits: the caller gets DatabaseUnavailable.
            tx = blocker.transaction()
            await tx.start()
            await blocker.execute("LOCK TABLE queues IN EXCLUSIVE MODE")
            blocked = asyncio.create_task(load.client.submit("t.noop"))

            async def waiting() -> int:
                return await admin.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock' "
                    # the head of the insert_runs* statements: their `-- params:` header (pg_stat_activity
                    # keeps only the first 1 kB of a query, and the header pushed the SQL itself past it)
                    f"AND query LIKE '{SUBMIT_HEAD}' LIMIT 1", dbname)

            await wait_until(waiting, timeout=10, what="a submit waiting inside PostgreSQL")
            failed_at = time.time()

            async def caught() -> bool:
                # the load's submits wait on the lock too, and ours may be in a later batch than the
                # first waiter: terminate every waiting submit until ours has failed (terminating only
                # the first left ours waiting on a lock released after it: a hang)
                await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 "
                    f"AND wait_event_type = 'Lock' AND query LIKE '{SUBMIT_HEAD}'", dbname)
                return blocked.done()

            await wait_until(caught, timeout=30, what="the submit caught inside PostgreSQL to fail", interval=0.1)
            with pytest.raises(DatabaseUnavailable):
                await blocked
            await tx.rollback()
            # Then every connection to the database, again and again, under the load.
            killed = 0
            for _ in range(8):
                killed += await admin.fetchval(
                    "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = $1 AND pid <> pg_backend_pid()) t", dbname)
                await asyncio.sleep(0.25)
            assert killed > 0
        finally:
            await admin.close()
            if not blocker.is_closed():
                await blocker.close()
        return [], None, failed_at

    load, _ = await drill(settings.redis_url, terminate)
    # Submits caught by a termination failed clearly; the others were acknowledged and ran.
    assert all(isinstance(e, DatabaseUnavailable) for e in load.errors), {type(e).__name__ for e in load.errors}


async def test_sentinel_and_cluster_settings(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sentinel: the stores find the primary through a real Sentinel; Cluster: the client type."""
    from redis.asyncio.cluster import RedisCluster

    from tests.servers import SentinelServer

    primary = await RedisServer().start()
    sentinel = await SentinelServer(primary, "fp").start()
    try:
        monkeypatch.setenv("FENCEPOST_REDIS_SENTINELS", f"127.0.0.1:{sentinel.port}")
        monkeypatch.setenv("FENCEPOST_REDIS_SERVICE", "fp")
        s = Settings.from_env(database_url=settings.database_url, prefix=settings.prefix)
        assert s.redis_sentinels == f"127.0.0.1:{sentinel.port}" and s.redis_service == "fp"
        client = await Client(settings=s).connect()
        try:
            await client.register(registry)
            rid = await client.submit("t.noop")
            assert await primary.client().exists(client.stores.keys(Q).run(rid))
        finally:
            await client.close()
        monkeypatch.delenv("FENCEPOST_REDIS_SENTINELS")
        monkeypatch.setenv("FENCEPOST_REDIS_CLUSTER", "1")
        # explicit URLs: with none, from_env would resolve (and start) the project directory's embedded pair
        clustered = Settings.from_env(redis_url=settings.redis_url, database_url=settings.database_url)
        assert isinstance(Stores(clustered).redis, RedisCluster)
    finally:
        sentinel.cleanup()
        primary.cleanup()
