"""Idempotency keys with a scope and a contract (issue 14): a key is unique per scope (the
queue, or queue/tenant); the same request returns its run, a different one is refused with
IdempotencyConflict (409 over HTTP) and writes nothing; keys outlive the run's stay in the hot
table (archiving) for FENCEPOST_IDEMPOTENCY_WINDOW, and the reconciler prunes older ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fencepost.api import ApiConfig
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import IdempotencyConflict
from fencepost.core.models import Submit
from fencepost.reconciler.retention import archive_runs
from fencepost.reconciler.service import Reconciler
from tests.test_api import Api, _make_api


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        yield a


async def _sql(client: Client, query: str, *args: Any) -> Any:
    assert client.stores.db.pool is not None
    return await client.stores.db.pool.fetchval(query, *args)


async def test_a_key_is_scoped_to_the_queue_so_another_producer_cannot_squat_it(api: Api, client: Client) -> None:
    """Issue 14 repro 1: a producer scoped to qb submitting with qa's key got qa's run id and
    its own queue echoed back, and its job never existed."""
    await api.token("producer", "qa", name="p_qa")
    await api.token("producer", "qb", name="p_qb")
    key = {"Idempotency-Key": "invoice-42"}
    a = await api.req("POST", "/v1/runs", "p_qa", headers=key, json={"handler": "t.echo", "args": [1], "queue": "qa"})
    b = await api.req("POST", "/v1/runs", "p_qb", headers=key, json={"handler": "t.echo", "args": [1], "queue": "qb"})
    assert a.status_code == b.status_code == 201, (a.text, b.text)
    assert a.json()["queue"] == "qa" and b.json()["queue"] == "qb"
    assert a.json()["id"] != b.json()["id"]
    # each producer reads its own run; both jobs exist, each in its queue
    for who, body in (("p_qa", a.json()), ("p_qb", b.json())):
        got = await api.req("GET", f"/v1/runs/{body['id']}", who)
        assert got.status_code == 200 and got.json()["queue"] == body["queue"], got.text
    assert await _sql(client, "SELECT count(*) FROM runs WHERE idempotency_key = 'invoice-42'") == 2
    # the same producer repeating its request gets its own run back, described as stored
    again = await api.req("POST", "/v1/runs", "p_qb", headers=key, json={"handler": "t.echo", "args": [1], "queue": "qb"})
    assert again.json() == b.json()


async def test_the_same_key_with_a_different_request_is_a_409_naming_the_key(api: Api, client: Client) -> None:
    key = {"Idempotency-Key": "order-7"}
    first = await api.req("POST", "/v1/runs", "producer", headers=key, json={"handler": "t.echo", "args": ["a"]})
    assert first.status_code == 201
    before = await _sql(client, "SELECT count(*) FROM runs")
    r = await api.req("POST", "/v1/runs", "producer", headers=key, json={"handler": "t.echo", "args": ["b"]})
    assert r.status_code == 409 and r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["error"] == "IdempotencyConflict" and body["key"] == "order-7"
    assert body["scope"] == f"tq@token:{api.id('producer')}"  # keys through the API are per token (issue 24)
    assert "order-7" in body["detail"]
    assert await _sql(client, "SELECT count(*) FROM runs") == before
    # options count as the request too; the same request still returns the run
    r = await api.req("POST", "/v1/runs", "producer", headers=key, json={"handler": "t.echo", "args": ["a"], "priority": 9})
    assert r.status_code == 409
    same = await api.req("POST", "/v1/runs", "producer", headers=key, json={"handler": "t.echo", "args": ["a"]})
    assert same.status_code == 201 and same.json() == first.json()


async def test_python_client_refuses_a_different_request_and_writes_nothing(client: Client) -> None:
    """Issue 14 repro 1 (client): the same key with different arguments silently returned the old run."""
    rid = await client.submit("t.echo", 1, idempotency_key="k-1")
    assert await client.submit("t.echo", 1, idempotency_key="k-1") == rid
    with pytest.raises(IdempotencyConflict) as err:
        await client.submit("t.echo", 2, idempotency_key="k-1")
    assert err.value.key == "k-1" and err.value.run_id == rid
    # a batch holding one conflicting run writes none of its runs
    before = await _sql(client, "SELECT count(*) FROM runs")
    with pytest.raises(IdempotencyConflict):
        await client.submit_many([Submit(handler="t.echo", args=(9,)), Submit(handler="t.echo", args=(3,),
                                                                             idempotency_key="k-1")])
    with pytest.raises(IdempotencyConflict):  # two different requests with one key in one batch
        await client.submit_many([Submit(handler="t.echo", args=(1,), idempotency_key="k-2"),
                                  Submit(handler="t.echo", args=(2,), idempotency_key="k-2")])
    assert await _sql(client, "SELECT count(*) FROM runs") == before
    assert await client.stores.redis.zcard(client.stores.keys("tq").due) == 1


async def test_a_tenant_narrows_the_scope(client: Client) -> None:
    a = await client.submit("t.echo", 1, idempotency_key="inv", tenant="acme")
    b = await client.submit("t.echo", 1, idempotency_key="inv", tenant="globex")
    c = await client.submit("t.echo", 1, idempotency_key="inv")
    assert len({a, b, c}) == 3
    assert await client.submit("t.echo", 1, idempotency_key="inv", tenant="acme") == a


async def test_concurrent_different_requests_with_one_key_create_exactly_one_run(settings: Settings,
                                                                                 client: Client) -> None:
    clients = [await Client(settings=settings).connect() for _ in range(6)]
    try:
        got = await asyncio.gather(*(c.submit("t.echo", i, idempotency_key="race") for i, c in enumerate(clients)),
                                   return_exceptions=True)
    finally:
        for c in clients:
            await c.close()
    ids = [g for g in got if isinstance(g, int)]
    conflicts = [g for g in got if isinstance(g, IdempotencyConflict)]
    assert len(ids) == 1 and len(conflicts) == 5, got
    assert await _sql(client, "SELECT count(*) FROM runs") == 1


async def test_outbox_submit_conflict_rolls_back_the_callers_transaction(client: Client) -> None:
    rid = await client.submit("t.echo", 1, idempotency_key="ob")
    pool = client.stores.db.pool
    assert pool is not None
    async with pool.acquire() as conn:
        with pytest.raises(IdempotencyConflict):
            async with conn.transaction():
                await client.submit("t.echo", 2, idempotency_key="ob", connection=conn)
        async with conn.transaction():
            assert await client.submit("t.echo", 1, idempotency_key="ob", connection=conn) == rid


async def test_keys_outlive_archiving_for_the_window_then_the_reconciler_prunes_them(settings: Settings,
                                                                                    client: Client) -> None:
    """Issue 14 repro 1: keys were honoured only while the run was in the hot table."""
    rid = await client.submit("t.echo", 5, idempotency_key="old")
    pool = client.stores.db.pool
    assert pool is not None
    await pool.execute("UPDATE runs SET status = 'SUCCEEDED', attempt = 1, finished_at = now() - interval '30 days' "
                       "WHERE id = $1", rid)
    async with client.stores.db.session() as s:
        assert await archive_runs(s, datetime.now(UTC) - timedelta(days=7)) == 1
    assert await _sql(client, "SELECT count(*) FROM runs WHERE id = $1", rid) == 0
    assert await client.submit("t.echo", 5, idempotency_key="old") == rid  # archived, still honoured
    with pytest.raises(IdempotencyConflict):
        await client.submit("t.echo", 6, idempotency_key="old")
    # past the window the reconciler forgets the key; a fresh submit with it is a new run
    await pool.execute("UPDATE idempotency_keys SET created_at = now() - interval '2 hours' WHERE key = 'old'")
    rec = Reconciler(Settings(**{**{f: getattr(settings, f) for f in settings.__struct_fields__},
                                 "idempotency_window": "1h"}))
    await rec.stores.connect()
    try:
        assert "idempotency" in rec.loops
        await rec._prune_keys()
    finally:
        await rec.stores.close()
    assert await _sql(client, "SELECT count(*) FROM idempotency_keys WHERE key = 'old'") == 0
    assert await client.submit("t.echo", 6, idempotency_key="old") != rid


# -- through the API (issue 24 item 6) ------------------------------------------------------------
async def test_the_same_kwargs_in_another_key_order_are_the_same_request(api: Api) -> None:
    """The issue: {"a": 1, "b": 2} then {"b": 2, "a": 1} under one key was a 409 conflict."""
    key = {"Idempotency-Key": "order-7"}
    first = await api.req("POST", "/v1/runs", "producer", headers=key,
                          json={"handler": "t.echo", "kwargs": {"value": {"a": 1, "b": {"x": 1, "y": 2}}}})
    again = await api.req("POST", "/v1/runs", "producer", headers=key,
                          json={"handler": "t.echo", "kwargs": {"value": {"b": {"y": 2, "x": 1}, "a": 1}}})
    assert first.status_code == 201 and again.status_code == 201 and again.json()["id"] == first.json()["id"], again.text


async def test_a_body_key_and_a_header_key_that_disagree_are_refused_naming_both(api: Api, client: Client) -> None:
    """The issue: the body's idempotency_key silently overrode the Idempotency-Key header."""
    r = await api.req("POST", "/v1/runs", "producer", json={"handler": "t.echo", "args": [1], "idempotency_key": "a"},
                      headers={"Idempotency-Key": "b"})
    assert r.status_code == 422 and r.json()["field"] == "idempotency_key", r.text
    assert r.json()["fields"] == ["idempotency_key", "Idempotency-Key"] and "Idempotency-Key" in r.json()["detail"]
    assert await _sql(client, "SELECT count(*) FROM runs") == 0
    r = await api.req("POST", "/v1/runs", "producer", json={"handler": "t.echo", "args": [1], "idempotency_key": "a"},
                      headers={"Idempotency-Key": "a"})
    assert r.status_code == 201, "the same key in both is one key"


async def test_a_second_producer_never_gets_or_learns_the_first_producers_run(api: Api) -> None:
    """The issue: on a shared queue the second producer's identical submit got the first one's run id
    (then 404 reading it), and a different request's 409 revealed that run id."""
    body = {"handler": "t.echo", "args": [1], "idempotency_key": "shared"}
    mine = (await api.req("POST", "/v1/runs", "producer", json=body)).json()["id"]
    r = await api.req("POST", "/v1/runs", "producer2", json=body)
    assert r.status_code == 201 and r.json()["id"] != mine, r.text
    theirs = r.json()["id"]
    assert (await api.req("GET", f"/v1/runs/{theirs}", "producer2")).status_code == 200
    r = await api.req("POST", "/v1/runs", "producer2", json={**body, "args": [2]})
    assert r.status_code == 409 and r.json()["run_id"] == theirs and f"run {mine})" not in r.json()["detail"], r.text
    assert (await api.req("POST", "/v1/runs", "producer", json=body)).json()["id"] == mine
