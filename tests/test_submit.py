"""Durable submit: PostgreSQL first, idempotency keys, batches, outbox, bad input changes nothing."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import (
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidInput,
    PayloadTooLarge,
    SubmitInDoubt,
    UnknownHandler,
)
from fencepost.core.models import Submit
from fencepost.core.record import upgrade
from fencepost.dev.faults import free_port
from fencepost.worker.runtime import Worker, WorkerOptions
from tests.apps import registry
from tests.conftest import record_all, wait_until


async def _count_runs(client: Client) -> int:
    return (await client.stores.db.pool.fetchval("SELECT count(*) FROM runs"))  # type: ignore[union-attr]


async def test_submit_is_in_postgres_and_redis(client: Client) -> None:
    run_id = await client.submit("t.echo", 41)
    row = await client.get(run_id)
    assert row["status"] == "PENDING" and row["queue"] == "tq"
    keys = client.stores.keys("tq")
    assert await client.stores.redis.hget(keys.run(run_id), "state") == b"PENDING"
    assert await client.stores.redis.zscore(keys.due, run_id) is not None
    events = await client.events(run_id)
    assert [e["type"] for e in events] == ["submitted"]


async def test_same_idempotency_key_twice_yields_one_run(client: Client) -> None:
    a = await client.submit("t.echo", 1, idempotency_key="order-17")
    b = await client.submit("t.echo", 1, idempotency_key="order-17")
    assert a == b
    with pytest.raises(IdempotencyConflict):  # issue 14: a different request with the key is refused
        await client.submit("t.echo", 2, idempotency_key="order-17")
    assert await _count_runs(client) == 1
    assert await client.stores.redis.zcard(client.stores.keys("tq").due) == 1


async def test_same_idempotency_key_concurrently_yields_one_run(client: Client, settings) -> None:
    clients = [await Client(settings=settings).connect() for _ in range(8)]
    try:
        ids = await asyncio.gather(*(c.submit("t.echo", 1, idempotency_key="pay-1") for c in clients))
    finally:
        for c in clients:
            await c.close()
    assert len(set(ids)) == 1
    assert await _count_runs(client) == 1
    n_events = await client.stores.db.pool.fetchval("SELECT count(*) FROM history")  # type: ignore[union-attr]
    assert n_events == 1


async def test_submit_many_keeps_order_and_dedupes_within_batch(client: Client) -> None:
    reqs = [Submit(handler="t.echo", args=(i,)) for i in range(100)]
    reqs.append(Submit(handler="t.echo", args=("x",), idempotency_key="k"))
    reqs.append(Submit(handler="t.echo", args=("x",), idempotency_key="k"))
    ids = await client.submit_many(reqs)
    assert ids[:100] == sorted(ids[:100]) and len(set(ids[:100])) == 100
    assert ids[100] == ids[101]
    assert await _count_runs(client) == 101


@pytest.mark.parametrize("bad, error", [
    (dict(handler="nope"), UnknownHandler),
    (dict(handler="t.echo", priority=300), InvalidInput),
    (dict(handler="t.echo", queue="no spaces"), InvalidInput),
    (dict(handler="t.echo", timeout=0), InvalidInput),
    (dict(handler="t.echo", max_retries=-1), InvalidInput),
    (dict(handler="t.echo", delay=-5), InvalidInput),
    (dict(handler="t.echo", run_at=datetime(2030, 1, 1)), InvalidInput),
    (dict(handler="t.echo", args=("x" * 600_000,)), PayloadTooLarge),
    (dict(handler="t.echo", args=(object(),)), InvalidInput),
])
async def test_bad_input_is_a_typed_error_and_changes_nothing(client: Client, bad: dict, error: type) -> None:
    good = Submit(handler="t.echo", args=(1,))
    with pytest.raises(error) as info:
        await client.submit_many([good, Submit(**bad)])
    assert str(info.value)
    assert await _count_runs(client) == 0
    assert await client.stores.redis.zcard(client.stores.keys("tq").due) == 0


async def test_delayed_run_is_not_claimable_before_run_at(client: Client) -> None:
    run_id = await client.submit("t.echo", 1, run_at=datetime.now(UTC) + timedelta(hours=1))
    keys = client.stores.keys("tq")
    assert await client.stores.redis.zscore(keys.delayed, run_id) is not None
    got = await client.stores.scripts.run("claim_due", keys, [10, "w", 1000, 10])
    assert got == []


async def test_wait_returns_the_handlers_result(client: Client, settings) -> None:
    run_id = await client.submit("t.echo", {"answer": 42})
    worker = Worker(registry, WorkerOptions(queues=["tq"], concurrency=4, burst=True), settings=settings)
    await worker.run()
    out = await client.wait(run_id, timeout=10)
    assert out.status == "SUCCEEDED" and out.result == {"answer": 42}


async def test_outbox_submit_exists_only_if_the_transaction_commits(client: Client, settings, stores) -> None:
    from fencepost.reconciler.outbox import OutboxRelay

    conn = await asyncpg.connect(settings.database_url)
    try:
        async with conn.transaction():
            kept = await client.submit("t.echo", "kept", connection=conn)
        tx = conn.transaction()
        await tx.start()
        dropped = await client.submit("t.echo", "dropped", connection=conn)
        await tx.rollback()
    finally:
        await conn.close()
    keys = stores.keys("tq")
    assert await stores.redis.exists(keys.run(kept)) == 0, "outbox runs reach Redis only via the relay"
    relay = OutboxRelay(stores)
    await relay.listen()
    try:
        assert await relay.relay() == 1
    finally:
        await relay.close()
    assert await stores.redis.hget(keys.run(kept), "state") == b"PENDING"
    assert await stores.redis.exists(keys.run(dropped)) == 0
    assert (await client.get(kept))["outbox"] is False
    with pytest.raises(Exception):
        await client.get(dropped)


async def test_history_reaches_postgres(client: Client, settings, stores) -> None:
    ids = await client.submit_many([Submit(handler="t.echo", args=(i,)) for i in range(50)])
    await Worker(registry, WorkerOptions(queues=["tq"], concurrency=10, burst=True), settings=settings).run()
    await record_all(stores)
    rows = await stores.db.fetch("run_status", ids)
    assert {r["status"] for r in rows} == {"SUCCEEDED"}
    types = await stores.db.pool.fetch(  # type: ignore[union-attr]
        "SELECT type, count(*) AS n FROM history GROUP BY type ORDER BY type")
    assert {r["type"]: r["n"] for r in types} == {"submitted": 50, "claimed": 50, "succeeded": 50}
    att = await stores.db.pool.fetchval("SELECT count(*) FROM attempts WHERE outcome = 'succeeded'")  # type: ignore[union-attr]
    assert att == 50


async def test_bad_request_in_the_last_chunk_of_a_pipelined_batch_changes_nothing(client: Client) -> None:
    reqs = [Submit(handler="t.echo", args=(i,)) for i in range(client.chunk * 2 + 10)]
    reqs.append(Submit(handler="t.echo", priority=999))
    with pytest.raises(InvalidInput):
        await client.submit_many(reqs)
    assert await _count_runs(client) == 0
    assert await client.stores.redis.zcard(client.stores.keys("tq").due) == 0


async def test_pipelined_batch_keeps_request_order(client: Client) -> None:
    reqs = [Submit(handler="t.echo", args=(i,), idempotency_key=f"k{i}") for i in range(client.chunk * 2 + 10)]
    ids = await client.submit_many(reqs)
    rows = await client.stores.db.pool.fetch("SELECT id, idempotency_key FROM runs")  # type: ignore[union-attr]
    by_key = {r["idempotency_key"]: r["id"] for r in rows}
    assert ids == [by_key[f"k{i}"] for i in range(len(reqs))]


# -- issue 22 item 9: a large submit_many that fails commits nothing ---------------------------------
class PrivatePostgres:
    """A PostgreSQL cluster of this test's own on a free port (initdb as the postgres user when run
    as root), so it can be stopped and started without touching the server other tests share."""

    def __init__(self, base: Path) -> None:
        self.base, self.data = base, base / "data"
        self.port = free_port()
        self.bin = Path(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                       check=True).stdout.strip()) if shutil.which("pg_config") else None
        self._as: list[str] = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _tool(self, name: str) -> str:
        found = shutil.which(name) or (str(self.bin / name) if self.bin else None)
        if found is None:
            pytest.skip(f"{name} (PostgreSQL server binaries) not found")
        return found

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self._as, *cmd], check=True, capture_output=True, timeout=60)

    def init(self) -> PrivatePostgres:
        self.base.mkdir(parents=True, exist_ok=True)
        if self._as:
            shutil.chown(self.base, "postgres", "postgres")
        self._run(self._tool("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-locale",
                  "--encoding=UTF8", "--no-instructions")
        return self

    def start(self) -> None:
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories= -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off")
        self._run(self._tool("pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.data / "log"), "-w",
                  "start")

    def stop(self, mode: str = "immediate") -> None:
        """`immediate`: every backend killed at once, crash recovery at the next start (a crash)."""
        self._run(self._tool("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"


@pytest.fixture
async def private_pg() -> AsyncIterator[PrivatePostgres]:
    base = Path(tempfile.mkdtemp(prefix="fp-pg-", dir="/tmp"))
    pg = PrivatePostgres(base).init()
    pg.start()
    conn = await asyncpg.connect(pg.url())
    await conn.execute("CREATE DATABASE fp")
    await conn.close()
    conn = await asyncpg.connect(pg.url("fp"))
    await upgrade(conn)
    await conn.close()
    yield pg
    try:
        pg.stop()
    except subprocess.CalledProcessError:
        pass  # already stopped
    shutil.rmtree(base, ignore_errors=True)


async def test_a_large_submit_many_that_raises_commits_nothing_and_its_retry_creates_each_run_once(
        private_pg: PrivatePostgres, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22 item 9: submit_many of 60,000 with PostgreSQL restarted 0.3 s in raised
    DatabaseUnavailable with no ids while 56,000 runs were committed (chunks committed one by one,
    siblings not cancelled), and a retry created them twice. Here PostgreSQL (a private cluster)
    crashes after the call's third chunk reached it and comes back at once."""
    cfg = msgspec.structs.replace(settings, database_url=private_pg.url("fp"))
    n = 20 * Client.chunk
    client = await Client(settings=cfg).connect()
    try:
        await client.register(registry)
        real = Client._insert
        chunks = 0

        async def insert(self: Client, *a: Any, **kw: Any) -> Any:
            nonlocal chunks
            out = await real(self, *a, **kw)
            chunks += 1
            if chunks == 3:  # a crash and a restart while the rest of the call is on its way
                private_pg.stop("immediate")
                threading.Thread(target=private_pg.start, daemon=True).start()
            return out

        monkeypatch.setattr(Client, "_insert", insert)
        with pytest.raises(DatabaseUnavailable) as raised:
            await client.submit_many([Submit(handler="t.noop") for _ in range(n)])
        assert not isinstance(raised.value, SubmitInDoubt), raised.value
        monkeypatch.undo()

        async def count() -> int | None:
            try:
                conn = await asyncpg.connect(private_pg.url("fp"), timeout=2)
            except (OSError, asyncpg.PostgresError):
                return None
            try:
                return int(await conn.fetchval("SELECT count(*) FROM runs"))
            finally:
                await conn.close()

        await wait_until(lambda: _answers(count), timeout=30, what="PostgreSQL back")
        await asyncio.sleep(1.0)  # a chunk still on its way would commit now (they did before the fix)
        assert await count() == 0, "nothing of the call that raised is committed"
        ids = await client.submit_many([Submit(handler="t.noop") for _ in range(n)])
        assert len(set(ids)) == n and await count() == n, "the retry created each run once"
        k = client.stores.keys("tq")
        assert await client.stores.redis.zcard(k.due) == n
    finally:
        await client.close()


async def _answers(count: Callable[[], Awaitable[int | None]]) -> bool:
    return await count() is not None


async def test_a_batch_whose_commit_lost_its_connection_asks_postgresql_whether_it_committed(
        client: Client, settings: Settings) -> None:
    """The one moment a failed call cannot know: COMMIT sent, connection lost. The transaction's id,
    taken inside it, answers once PostgreSQL does (a crash in COMMIT reads 'aborted' after recovery)."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        tx = conn.transaction()
        await tx.start()
        done = int(await conn.fetchval("SELECT txid_current()"))
        await tx.commit()
        tx = conn.transaction()
        await tx.start()
        undone = int(await conn.fetchval("SELECT txid_current()"))
        await tx.rollback()
    finally:
        await conn.close()
    lost = DatabaseUnavailable("postgresql: connection lost during COMMIT")
    assert await client._committed(done, [1, 2], lost) is True
    assert await client._committed(undone, [1, 2], lost) is False
    client.in_doubt_wait = 0.2
    await client.stores.db.close()  # PostgreSQL cannot be asked at all
    with pytest.raises(SubmitInDoubt) as doubt:
        await client._committed(done, [1, 2], lost)
    assert doubt.value.run_ids == [1, 2]
