"""Batches over the HTTP API (issue 16): POST /v1/batches submits members and on_complete / on_success
callbacks in one transaction (audited with the token that did it); GET /v1/batches/{id} counts the
members by state and shows the callbacks; a scoped token creates and reads only batches whose members
and callbacks are all in its queues, and a batch whose runs left the record (a load test's cleanup,
retention) is neither shown to it nor a 500; bad input is a 4xx naming the field and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fencepost.api import ApiConfig, create_app
from fencepost.api.auth import create_token
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit
from tests.conftest import ROOT, record_all, worker_env
from tests.test_api import Api, _make_api, serve_in_thread
from tests.test_cli_api import Cli

Q = "tq"


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0, max_batch=5)):
        await a.token("producer", Q, name="producer-in")
        await a.token("operator", Q, name="operator-in")
        await a.token("operator", "other", name="operator-out")
        await client.submit("t.echo", 0, queue="other")  # both queues exist
        yield a


async def _count(client: Client, sql: str) -> int:
    pool = client.stores.db.pool
    assert pool is not None
    return int(await pool.fetchval(sql))


def _body(n: int = 2, **extra: Any) -> dict[str, Any]:
    return {"runs": [{"handler": "t.echo", "args": [i]} for i in range(n)],
            "on_complete": {"handler": "t.echo", "args": ["done"]},
            "on_success": {"handler": "t.echo", "args": ["all ok"]}, **extra}


async def test_create_read_and_settle_a_batch(api: Api, client: Client) -> None:
    r = await api.req("POST", "/v1/batches", "producer-in", json=_body(name="nightly"))
    assert r.status_code == 201, r.text
    made = r.json()
    assert len(made["run_ids"]) == 2 and made["on_complete"] and made["on_success"]
    r = await api.req("GET", f"/v1/batches/{made['id']}", "operator-in")
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["name"], got["total"], got["counts"], got["settled_at"]) == ("nightly", 2, {"PENDING": 2}, None)
    assert got["on_complete"] == {"id": made["on_complete"], "status": "BLOCKED", "reason": None}
    # audited in the batch's transaction, with the token that submitted it
    pool = client.stores.db.pool
    assert pool is not None
    row = await pool.fetchrow("SELECT actor, queue FROM audit_log WHERE action = 'batch_submitted' AND target = $1",
                              made["id"])
    assert row is not None and row["actor"].startswith(f"token:{api.id('producer-in')}@") and row["queue"] == Q
    # one member fails for good (cancelled): the batch settles, on_complete is released, on_success cancelled
    await client.cancel(made["run_ids"][0], reason="test")
    await api.req("POST", f"/v1/runs/{made['run_ids'][1]}/cancel", "admin", json={"reason": "test"})
    await record_all(client.stores)
    got = (await api.req("GET", f"/v1/batches/{made['id']}", "operator-in")).json()
    assert got["counts"] == {"CANCELLED": 2} and got["settled_at"] is not None
    assert got["on_complete"]["status"] == "PENDING"
    assert got["on_success"] == {"id": made["on_success"], "status": "CANCELLED", "reason": "batch_failed"}


async def test_scope_decides_who_creates_and_reads_a_batch(api: Api, client: Client) -> None:
    batches = "SELECT count(*) FROM batches"
    runs = "SELECT count(*) FROM runs"
    before = (await _count(client, batches), await _count(client, runs))
    # a callback outside the producer's queue: refused, nothing written
    body = _body(on_complete={"handler": "t.echo", "args": [1], "queue": "other"})
    r = await api.req("POST", "/v1/batches", "producer-in", json=body)
    assert r.status_code == 403, r.text
    assert (await _count(client, batches), await _count(client, runs)) == before
    # a batch spanning both queues (made by an unscoped admin) is unknown to tokens of either queue
    r = await api.req("POST", "/v1/batches", "admin", json=body)
    assert r.status_code == 201, r.text
    mixed = r.json()["id"]
    hidden = [await api.req("GET", f"/v1/batches/{mixed}", who) for who in ("operator-in", "operator-out")]
    missing = await api.req("GET", f"/v1/batches/{uuid.uuid4()}", "operator-in")
    assert {h.status_code for h in hidden} == {missing.status_code} == {404}
    assert set(hidden[0].json()) == set(missing.json()) and "queue" not in hidden[0].text
    assert (await api.req("GET", f"/v1/batches/{mixed}", "admin")).json()["total"] == 2
    # producers submit; reading is for operators and admins (as for workflows)
    assert (await api.req("GET", f"/v1/batches/{mixed}", "producer-in")).status_code == 403


@pytest.mark.parametrize(("change", "status", "field"), [
    ({"runs": []}, 422, "runs"),
    ({"on_complete": None, "on_success": None}, 422, "on_complete"),
    ({"name": "n\u001b[31m"}, 422, "name"),
    ({"runs": [{"handler": "t.echo", "args": [1], "idempotency_key": "k"}]}, 422, "idempotency_key"),
    ({"on_success": {"handler": "t.echo", "args": [1], "delay": 5}}, 422, "on_success"),
    ({"runs": [{"handler": "t.echo", "args": [i]} for i in range(6)]}, 413, "runs"),
    ({"runs": [{"handler": "t.nope"}]}, 422, None),
    ({"surprise": 1}, 422, "surprise"),
])
async def test_bad_batches_are_refused_naming_the_field_and_write_nothing(api: Api, client: Client,
                                                                          change: dict[str, Any], status: int,
                                                                          field: str | None) -> None:
    before = (await _count(client, "SELECT count(*) FROM batches"), await _count(client, "SELECT count(*) FROM runs"),
              await _count(client, "SELECT count(*) FROM audit_log"))
    r = await api.req("POST", "/v1/batches", "admin", json=_body(**change))
    assert r.status_code == status, r.text
    if field is not None:
        assert r.json().get("field") == field, r.text
    after = (await _count(client, "SELECT count(*) FROM batches"), await _count(client, "SELECT count(*) FROM runs"),
             await _count(client, "SELECT count(*) FROM audit_log"))
    assert after == before


async def test_an_idempotency_key_header_and_a_malformed_id_are_refused(api: Api) -> None:
    r = await api.req("POST", "/v1/batches", "admin", json=_body(), headers={"Idempotency-Key": "k1"})
    assert r.status_code == 422 and r.json()["field"] == "Idempotency-Key", r.text
    r = await api.req("GET", "/v1/batches/not-a-uuid", "admin")
    assert r.status_code == 422 and r.json()["field"] == "batch_id", r.text


async def test_a_batch_whose_runs_left_the_record_is_shown_without_a_server_error(api: Api, client: Client) -> None:
    """Its members and callbacks purged (a load test's cleanup here; a dropped archive partition too):
    counted PURGED for an admin (it was a 500: a None state among the counts), and not shown to a
    scoped token, which cannot be shown that they were in its queues (it passed the scope check with
    no queue known, then answered "no run with id N", naming the callback)."""
    runs = {"runs": [{"handler": "t.echo", "args": [1], "queue": "other"}] * 2}
    gone = (await api.req("POST", "/v1/batches", "admin",
                          json={**runs, "on_complete": {"handler": "t.echo", "args": [1], "queue": "other"}})).json()
    half = (await api.req("POST", "/v1/batches", "admin",
                          json={**runs, "on_success": {"handler": "t.echo", "args": [1], "queue": "tq"}})).json()
    await client.stores.db.execute("loadtest_cleanup", "other")  # the runs leave the record, the batches stay
    missing = await api.req("GET", "/v1/batches/00000000-0000-4000-8000-000000000000", "operator-in")
    for made in (gone, half):
        r = await api.req("GET", f"/v1/batches/{made['id']}", "operator-in")
        assert r.status_code == 404 and set(r.json()) == set(missing.json()), r.text
        assert r.json()["detail"] == f"no batch with id {made['id']}"
        r = await api.req("GET", f"/v1/batches/{made['id']}", "admin")
        assert r.status_code == 200, r.text
        assert (r.json()["total"], r.json()["counts"]) == (2, {"PURGED": 2})
    assert (await api.req("GET", f"/v1/batches/{gone['id']}", "admin")).json()["on_complete"] == {
        "id": gone["on_complete"], "status": "PURGED", "reason": None}
    assert (await api.req("GET", f"/v1/batches/{half['id']}", "admin")).json()["on_success"]["status"] == "BLOCKED"


@pytest.fixture
async def cli(settings: Settings, client: Client) -> AsyncIterator[Cli]:
    _, admin = await create_token(client.stores.db, "admin", [], "cli-admin", "test")
    _, operator = await create_token(client.stores.db, "operator", [], "cli-operator", "test")
    with serve_in_thread(create_app(settings, ApiConfig(token_cache_s=0, rate_limit=0))) as url:
        yield Cli(url, admin, operator, settings)


async def test_batch_show_on_the_stores_and_over_the_api(cli: Cli, client: Client) -> None:
    b = await client.submit_batch([Submit(handler="t.echo", args=(i,)) for i in range(3)], name="nightly",
                                  on_complete=Submit(handler="t.echo", args=("done",)),
                                  on_success=Submit(handler="t.echo", args=("ok",)))
    shown = cli.same("batch", "show", str(b.id), token=cli.operator)
    assert shown == (f"batch {b.id} (nightly): 3 runs, 3 PENDING; not settled (members still running)\n"
                     f"  on_complete run {b.on_complete}  BLOCKED\n  on_success  run {b.on_success}  BLOCKED\n")
    for rid in b.run_ids:
        await client.cancel(rid, reason="test")
    await record_all(client.stores)
    shown = cli.same("batch", "show", str(b.id))
    assert "3 runs, 3 CANCELLED; settled 20" in shown and f"run {b.on_success}  CANCELLED (batch_failed)" in shown
    assert json.loads(cli.ok("batch", "show", str(b.id), "--json"))["counts"] == {"CANCELLED": 3}
    for args in (("batch", "show", str(uuid.uuid4())), ("batch", "show", "nope")):
        out = cli.api(*args)
        assert out.returncode == 1 and out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
        direct = subprocess.run([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, capture_output=True,
                                text=True, timeout=60, env=worker_env(cli.settings))
        assert direct.returncode == 1 and direct.stderr.startswith("error: ") and direct.stderr.count("\n") == 1
