"""The HTTP API (issue 7) against real Redis and PostgreSQL: every endpoint, every role
boundary, problem+json bodies, idempotent submit, limits that change nothing, bulk confirm,
the CLI over --api, and schemathesis against /openapi.json finding no server error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from fencepost.api import ApiConfig, create_app
from fencepost.api.auth import create_token, hash_secret
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from tests.conftest import ROOT, record_all, worker_env

PROBLEM = "application/problem+json"


class Api:
    """An in-process app with one token per role and helpers to call it as each."""

    def __init__(self, app: Any, http: httpx.AsyncClient, client: Client) -> None:
        self.app, self.http, self.client = app, http, client
        self.tokens: dict[str, tuple[int, str]] = {}

    async def token(self, role: str, *queues: str, name: str | None = None) -> str:
        row, secret = await create_token(self.client.stores.db, role, list(queues), name, "test")
        self.tokens[name or role] = (row["id"], secret)
        return secret

    def h(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who][1]}"}

    def id(self, who: str) -> int:
        return self.tokens[who][0]

    async def req(self, method: str, path: str, who: str | None = None, **kw: Any) -> httpx.Response:
        headers = dict(kw.pop("headers", {}))
        if who is not None:
            headers.update(self.h(who))
        return await self.http.request(method, path, headers=headers, **kw)


async def _make_api(settings: Settings, client: Client, config: ApiConfig) -> AsyncIterator[Api]:
    app = create_app(settings, config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 4242))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            api = Api(app, http, client)
            await api.token("admin")
            await api.token("operator", "tq", name="op_tq")
            await api.token("operator", "other", name="op_other")
            await api.token("producer", name="producer")
            await api.token("producer", name="producer2")
            yield api


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0, max_body_bytes=64 * 1024,
                                                         max_batch=50, bulk_cap=20)):
        yield a


def _problem(r: httpx.Response, status: int, **fields: Any) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body = r.json()
    assert body["status"] == status and body["type"].startswith("urn:fencepost:problem:")
    assert body["title"] and body["detail"]
    for k, v in fields.items():
        assert body.get(k) == v, (k, body)
    return body


async def _count_runs(client: Client) -> int:
    return await client.stores.db.pool.fetchval("SELECT count(*) FROM runs")  # type: ignore[union-attr]


async def _submit(api: Api, who: str = "producer", **body: Any) -> int:
    r = await api.req("POST", "/v1/runs", who, json={"handler": "t.echo", "args": [1], **body})
    assert r.status_code == 201, r.text
    return r.json()["id"]


# -- health, docs, metrics, dashboard ---------------------------------------------------------------
async def test_health_readiness_openapi_and_dashboard_need_no_token(api: Api) -> None:
    assert (await api.req("GET", "/healthz")).json() == {"status": "ok"}
    r = await api.req("GET", "/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready", "redis": "ok", "postgres": "ok"}
    await api.req("GET", "/v1/me", "admin")
    m = await api.req("GET", "/metrics", "producer")  # any token (public with FENCEPOST_API_METRICS_TOKEN=0)
    assert m.status_code == 200 and "fencepost_api_requests_total" in m.text
    doc = (await api.req("GET", "/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    assert "/v1/runs/{run_id}/pause" in doc["paths"] and "SubmitRequest" in doc["components"]["schemas"]
    assert doc["components"]["schemas"]["SubmitRequest"]["properties"]["priority"]["anyOf"][0]["maximum"] == 255
    home = await api.req("GET", "/", follow_redirects=True)
    assert home.status_code == 200 and "Fencepost" in home.text
    js = await api.req("GET", "/ui/app.js")
    assert js.status_code == 200 and "sessionStorage" in js.text
    missing = await api.req("GET", "/v1/nothing-here", "admin")
    _problem(missing, 404)
    _problem(await api.req("PATCH", "/v1/runs", "admin"), 405)


async def test_readiness_reports_an_unreachable_store(settings: Settings, client: Client) -> None:
    bad = Settings(redis_url=settings.redis_url, database_url=settings.database_url, prefix=settings.prefix)
    app = create_app(bad, ApiConfig())
    async with app.router.lifespan_context(app):
        await app.state.api.client.stores.db.pool.close()  # PostgreSQL "goes away"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http:
            r = await http.get("/readyz")
            assert r.status_code == 503 and r.json()["postgres"].startswith("unreachable")
            assert (await http.get("/healthz")).status_code == 200


# -- authentication and roles --------------------------------------------------------------------------
async def test_every_endpoint_without_a_token_is_401_problem(api: Api) -> None:
    from fencepost.api.routes import ROUTES

    for route in ROUTES:
        if not route.auth:
            continue
        path = (route.path.replace("{run_id}", "1").replace("{queue}", "tq").replace("{name}", "s")
                .replace("{workflow_id}", str(uuid.uuid4())).replace("{token_id}", "1"))
        r = await api.req(route.method, path, json={} if route.body else None)
        body = _problem(r, 401)
        assert r.headers["www-authenticate"].startswith("Bearer"), route.path
        assert body["instance"] == path
    bad = await api.req("GET", "/v1/runs", headers={"Authorization": "Bearer fp_not-a-token"})
    _problem(bad, 401)
    basic = await api.req("GET", "/v1/runs", headers={"Authorization": "Basic abc"})
    _problem(basic, 401)


async def test_revoked_token_is_refused_at_once(api: Api) -> None:
    secret = await api.token("operator", name="short-lived")
    h = {"Authorization": f"Bearer {secret}"}
    assert (await api.req("GET", "/v1/me", headers=h)).json()["role"] == "operator"
    r = await api.req("DELETE", f"/v1/tokens/{api.id('short-lived')}", "admin")
    assert r.status_code == 200 and r.json()["revoked_at"]
    _problem(await api.req("GET", "/v1/me", headers=h), 401)
    _problem(await api.req("DELETE", "/v1/tokens/999999", "admin"), 404)


async def test_role_boundaries_are_403_with_the_reason(api: Api, client: Client) -> None:
    rid = await _submit(api)
    # producers submit and read their own runs, nothing else
    for method, path in [("POST", f"/v1/runs/{rid}/pause"), ("POST", "/v1/queues/tq/pause"),
                         ("GET", "/v1/queues"), ("GET", "/v1/dead-letter"), ("GET", "/v1/review"),
                         ("GET", "/v1/schedules"), ("GET", "/v1/workflows"), ("GET", "/v1/tokens"),
                         ("POST", "/v1/queues/tq/bulk"), ("GET", "/v1/events")]:
        body = _problem(await api.req(method, path, "producer", json={"command": "pause", "confirm": 0}
                                      if path.endswith("bulk") else {}), 403)
        assert body["role"] == "producer", path
    # another producer cannot read it, nor learn that it exists (issue 14: the answer of a missing run)
    _problem(await api.req("GET", f"/v1/runs/{rid}", "producer2"), 404, run_id=rid)
    _problem(await api.req("GET", f"/v1/runs/{rid}/events", "producer2"), 404)
    assert [r["id"] for r in (await api.req("GET", "/v1/runs", "producer2")).json()] == []
    # operators: read everything in scope, command scoped queues only, no bulk/schedules/tokens/submit
    _problem(await api.req("POST", "/v1/runs", "op_tq", json={"handler": "t.echo", "args": [1]}), 403, role="operator")
    _problem(await api.req("POST", "/v1/queues/tq/bulk", "op_tq", json={"command": "pause", "confirm": 1}), 403)
    _problem(await api.req("POST", "/v1/schedules", "op_tq", json={"name": "x", "handler": "t.noop", "cron": "* * * * *"}),
             403)
    _problem(await api.req("GET", "/v1/tokens", "op_tq"), 403)
    _problem(await api.req("POST", f"/v1/runs/{rid}/pause", "op_other", json={"reason": "x"}), 404, run_id=rid)
    _problem(await api.req("GET", f"/v1/runs/{rid}", "op_other"), 404, run_id=rid)
    _problem(await api.req("POST", "/v1/queues/tq/pause", "op_other", json={}), 403, queue="tq")
    _problem(await api.req("GET", "/v1/runs?queue=tq", "op_other"), 403)
    assert (await api.req("GET", "/v1/runs", "op_other")).json() == []  # scoped listing
    assert [r["id"] for r in (await api.req("GET", "/v1/runs", "op_tq")).json()] == [rid]
    # a producer scoped to another queue cannot submit into tq
    await api.token("producer", "elsewhere", name="p_else")
    _problem(await api.req("POST", "/v1/runs", "p_else", json={"handler": "t.echo", "args": [1]}), 403, queue="tq")
    body = {"handler": "t.echo", "args": [1], "queue": "elsewhere"}
    assert (await api.req("POST", "/v1/runs", "p_else", json=body)).status_code == 201
    me = (await api.req("GET", "/v1/me", "op_tq")).json()
    assert me == {"id": api.id("op_tq"), "role": "operator", "queues": ["tq"], "name": "op_tq",
                  "actor": f"token:{api.id('op_tq')}@203.0.113.7"}


# -- submit and read ----------------------------------------------------------------------------------
async def test_submit_idempotent_over_http_and_read_back(api: Api, client: Client, stores: Stores) -> None:
    key = {"Idempotency-Key": "order-42"}
    r1 = await api.req("POST", "/v1/runs", "producer", headers=key, json={"handler": "t.echo", "args": ["a"]})
    r2 = await api.req("POST", "/v1/runs", "producer", headers=key, json={"handler": "t.echo", "args": ["a"]})
    assert r1.status_code == r2.status_code == 201
    assert r1.json() == r2.json() == {"id": r1.json()["id"], "queue": "tq"}
    rid = r1.json()["id"]
    assert await _count_runs(client) == 1
    run = (await api.req("GET", f"/v1/runs/{rid}", "producer")).json()
    assert run["status"] == "PENDING" and run["idempotency_key"] == "order-42" and run["queue"] == "tq"
    events = (await api.req("GET", f"/v1/runs/{rid}/events", "producer")).json()
    assert events[0]["type"] == "submitted" and events[0]["actor"] == f"token:{api.id('producer')}@203.0.113.7"
    assert (await api.req("GET", f"/v1/runs/{rid}/attempts", "producer")).json() == []
    assert (await api.req("GET", f"/v1/runs/{rid}/checkpoint", "producer")).json() is None
    # batch: one key for the batch gives every item its own key
    body = {"runs": [{"handler": "t.echo", "args": [i]} for i in range(3)]}
    b1 = await api.req("POST", "/v1/runs/batch", "producer", headers={"Idempotency-Key": "b"}, json=body)
    b2 = await api.req("POST", "/v1/runs/batch", "producer", headers={"Idempotency-Key": "b"}, json=body)
    assert b1.status_code == 201 and b1.json() == b2.json() and len(set(b1.json()["ids"])) == 3
    assert await _count_runs(client) == 4
    # listing with filters
    mine = (await api.req("GET", "/v1/runs?limit=2", "producer")).json()
    assert [r["id"] for r in mine] == sorted(b1.json()["ids"], reverse=True)[:2]
    assert len((await api.req("GET", "/v1/runs?status=pending&handler=t.echo&queue=tq", "admin")).json()) == 4
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert (await api.req("GET", "/v1/runs", "admin", params={"since": future})).json() == []
    assert len((await api.req("GET", "/v1/runs", "admin", params={"until": future})).json()) == 4
    _problem(await api.req("GET", "/v1/runs?status=NOPE", "admin"), 422, field="status")
    _problem(await api.req("GET", "/v1/runs?limit=0", "admin"), 422, field="limit")
    _problem(await api.req("GET", "/v1/runs?since=yesterday", "admin"), 422, field="since")
    _problem(await api.req("GET", "/v1/runs/99999999", "admin"), 404, run_id=99999999)
    _problem(await api.req("GET", "/v1/runs/abc", "admin"), 422, field="run_id")


async def test_bad_and_oversize_bodies_are_rejected_with_nothing_stored(api: Api, client: Client) -> None:
    cases = [
        (b"{not json", 400, {}),
        (b"", 400, {}),
        (json.dumps({"handler": "t.nope"}).encode(), 422, {"field": "handler", "error": "UnknownHandler"}),
        (json.dumps({"handler": "t.echo", "args": [1], "priority": 999}).encode(), 422, {"field": "priority"}),
        (json.dumps({"handler": "t.echo", "args": [1], "surprise": 1}).encode(), 422, {"field": "surprise"}),
        (json.dumps({"handler": "t.echo", "args": [1], "queue": "bad queue!"}).encode(), 422, {"field": "queue"}),
        (json.dumps({"handler": "t.echo", "args": [1], "run_at": "2030-01-01T00:00:00"}).encode(), 422, {"field": "run_at"}),
        (json.dumps({"handler": "t.echo", "args": ["x" * 70_000]}).encode(), 413, {}),  # body limit (64 KiB)
        (json.dumps({"handler": "t.echo", "args": ["\u0000"], "idempotency_key": "a\u0000b"}).encode(), 422, {}),
    ]
    for raw, status, fields in cases:
        r = await api.req("POST", "/v1/runs", "producer", content=raw, headers={"Content-Type": "application/json"})
        _problem(r, status, **fields)
    # the payload limit of the store (smaller than the body limit here)
    client.settings.max_payload_bytes = 1000
    try:
        r = await api.req("POST", "/v1/runs", "producer", json={"handler": "t.echo", "args": ["y" * 5000]})
        _problem(r, 413, error="PayloadTooLarge", limit=1000)
    finally:
        client.settings.max_payload_bytes = 512 * 1024
    # batch limit: 51 > 50, nothing stored even though each item is fine
    r = await api.req("POST", "/v1/runs/batch", "producer", json={"runs": [{"handler": "t.echo", "args": [1]}] * 51})
    _problem(r, 413, limit=50, size=51)
    # one bad item in a batch: nothing of the batch is stored
    r = await api.req("POST", "/v1/runs/batch", "producer",
                      json={"runs": [{"handler": "t.echo", "args": [1]}, {"handler": "t.echo", "args": [1], "priority": -1}]})
    _problem(r, 422)
    r = await api.req("POST", "/v1/runs/batch", "producer",
                      json={"runs": [{"handler": "t.echo", "args": [1]}, {"handler": "t.nope"}]})
    _problem(r, 422, handler="t.nope")
    # a declared Content-Length over the limit is refused before reading
    r = await api.req("POST", "/v1/runs", "producer", content=b"x" * 10, headers={"Content-Length": "999999999"})
    _problem(r, 413)
    assert await _count_runs(client) == 0


async def test_rate_limit_per_token(settings: Settings, client: Client) -> None:
    async for api in _make_api(settings, client, ApiConfig(rate_limit=5, rate_window_s=60, token_cache_s=0)):
        for _ in range(5):
            assert (await api.req("GET", "/v1/me", "op_tq")).status_code == 200
        r = await api.req("POST", "/v1/runs", "op_tq", json={"handler": "t.echo", "args": [1]})
        body = _problem(r, 429, limit=5, window_s=60)
        assert int(r.headers["retry-after"]) >= 1 and body["retry_after"] >= 1
        # another token has its own budget; nothing was stored by the refused request
        assert (await api.req("GET", "/v1/me", "admin")).status_code == 200
        assert await _count_runs(client) == 0


# -- commands ---------------------------------------------------------------------------------------
async def test_run_commands_record_token_address_and_reason(api: Api, client: Client, stores: Stores) -> None:
    rid = await _submit(api)
    r = await api.req("POST", f"/v1/runs/{rid}/pause", "op_tq", json={"reason": "maintenance"})
    assert r.status_code == 200 and r.json() == {"id": rid, "command": "pause", "state": "PAUSED"}
    assert (await api.req("GET", f"/v1/runs/{rid}", "op_tq")).json()["status"] == "PAUSED"  # live from Redis
    # pausing again: 409 with the typed error's fields
    _problem(await api.req("POST", f"/v1/runs/{rid}/pause", "op_tq", json={}), 409, error="IllegalTransition",
             run_id=rid, current="PAUSED", requested="pause")
    # compare-and-set on a stale version
    _problem(await api.req("POST", f"/v1/runs/{rid}/resume", "op_tq", json={"expected_version": 0}), 409,
             error="ConcurrentModification", run_id=rid)
    assert (await api.req("POST", f"/v1/runs/{rid}/resume", "op_tq")).json()["state"] == "PENDING"  # no body, no reason
    assert (await api.req("POST", f"/v1/runs/{rid}/cancel", "admin", json={"reason": "dup"})).json()["state"] == "CANCELLED"
    assert (await api.req("POST", f"/v1/runs/{rid}/retry", "op_tq", json={"reason": "again"})).json()["state"] == "PENDING"
    assert (await api.req("POST", f"/v1/runs/{rid}/stop", "op_tq", json={})).status_code == 409  # not running
    assert (await api.req("POST", f"/v1/runs/{rid}/pause", "op_tq", json={"reason": "r"})).json()["state"] == "PAUSED"
    assert (await api.req("POST", f"/v1/runs/{rid}/restart", "op_tq", json={"reason": "fresh"})).json()["state"] == "PENDING"
    await record_all(stores)
    events = (await api.req("GET", f"/v1/runs/{rid}/events", "admin")).json()
    control = [(e["type"], e["actor"], e["reason"]) for e in events if e["type"] != "submitted"]
    op, adm = f"token:{api.id('op_tq')}@203.0.113.7", f"token:{api.id('admin')}@203.0.113.7"
    assert control == [("paused", op, "maintenance"), ("resumed", op, None), ("cancelled", adm, "dup"),
                       ("retried", op, "again"), ("paused", op, "r"), ("restarted", op, "fresh")], control
    fleet = (await api.req("GET", "/v1/events", "admin", params={"type": "cancelled"})).json()
    assert [(e["run_id"], e["actor"]) for e in fleet] == [(rid, adm)]


async def test_resume_refused_offers_restart(api: Api, client: Client, stores: Stores) -> None:
    from fencepost.core.models import JobSpec

    await client.register([JobSpec(name="t.once", queue="tq", resumable=False)])
    rid = await _submit(api, handler="t.once")
    await api.req("POST", f"/v1/runs/{rid}/pause", "op_tq", json={})
    body = _problem(await api.req("POST", f"/v1/runs/{rid}/resume", "op_tq", json={}), 409, error="ResumeRefused",
                    run_id=rid, offer="restart")
    assert "not resumable" in body["reason"]


async def test_queue_pause_resume_and_unknown_queue(api: Api, client: Client, stores: Stores) -> None:
    await _submit(api)
    r = await api.req("POST", "/v1/queues/tq/pause", "op_tq", json={"reason": "deploy"})
    assert r.json() == {"queue": "tq", "paused": True}
    assert await stores.redis.exists(stores.keys("tq").paused)
    queues = (await api.req("GET", "/v1/queues", "op_tq")).json()
    assert [(q["queue"], q["paused"], q["due"]) for q in queues] == [("tq", True, 1)]
    assert queues[0]["oldest_due_age_s"] >= 0 and queues[0]["throughput_per_min"] == 0
    assert (await api.req("GET", "/v1/queues", "op_other")).json() == []
    assert (await api.req("POST", "/v1/queues/tq/resume", "op_tq")).json() == {"queue": "tq", "paused": False}
    _problem(await api.req("POST", "/v1/queues/nope/pause", "admin", json={}), 404, queue="nope")
    ev = await stores.db.pool.fetch("SELECT type, actor, reason FROM events WHERE queue = 'tq' ORDER BY id")
    assert [(e["type"], e["reason"]) for e in ev] == [("queue_paused", "deploy"), ("queue_resumed", None)]
    assert ev[0]["actor"] == f"token:{api.id('op_tq')}@203.0.113.7"


async def test_bulk_needs_the_exact_confirm_count_and_respects_the_cap(api: Api, client: Client) -> None:
    for i in range(3):
        await _submit(api, args=[i])
    body = {"command": "pause", "status": "PENDING", "reason": "incident 7"}
    handle = _problem(await api.req("POST", "/v1/queues/tq/bulk", "admin", json={**body, "confirm": 0}), 428,
                      matched=3, acting=3, error="BulkNotConfirmed")["handle"]
    confirm = {"command": "pause", "handle": handle, "reason": "incident 7"}
    _problem(await api.req("POST", "/v1/queues/tq/bulk", "admin", json={**confirm, "confirm": 5}), 428, matched=3,
             handle=handle)
    assert len((await api.req("GET", "/v1/runs?status=PENDING", "admin")).json()) == 3  # nothing changed
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={**confirm, "confirm": 3})
    out = r.json()
    assert r.status_code == 200 and (out["matched"], out["acted"], out["results"], out["refused"]) == \
        (3, 3, {"PAUSED": 3}, {}), r.text
    # over the server-side cap (20): refused whatever the confirm says
    ids = (await api.req("POST", "/v1/runs/batch", "producer",
                         json={"runs": [{"handler": "t.noop"}] * 21})).json()["ids"]
    body = {"command": "cancel", "handler": "t.noop", "confirm": 21}
    _problem(await api.req("POST", "/v1/queues/tq/bulk", "admin", json=body), 422, matched=21, limit=20)
    assert len(ids) == 21 and len((await api.req("GET", "/v1/runs?status=PENDING&handler=t.noop", "admin")).json()) == 21


async def test_dead_letter_and_review_queue_with_resolve(api: Api, client: Client, stores: Stores) -> None:
    from tests.test_errors import _burst, _worker  # an in-process worker in burst mode

    dead = await _submit(api, handler="t.err.invalid", args=[])
    review = await _submit(api, handler="t.err.side_effect", args=[])
    await _burst(_worker(client.settings))
    await record_all(stores)
    dl = (await api.req("GET", "/v1/dead-letter", "op_tq")).json()
    assert [r["id"] for r in dl] == [dead]
    rv = (await api.req("GET", "/v1/review?queue=tq", "op_tq")).json()
    assert [(r["id"], r["reason"]) for r in rv] == [(review, "review")]
    assert (await api.req("GET", "/v1/review", "op_other")).json() == []
    _problem(await api.req("POST", f"/v1/runs/{dead}/resolve", "op_tq", json={"as": "succeeded"}), 422, field="run_id")
    _problem(await api.req("POST", f"/v1/runs/{review}/resolve", "op_tq", json={"as": "maybe"}), 422, field="as")
    r = await api.req("POST", f"/v1/runs/{review}/resolve", "op_tq", json={"as": "succeeded", "reason": "charge seen"})
    assert r.json() == {"id": review, "command": "resolve", "state": "SUCCEEDED"}


# -- schedules, workflows, tokens -----------------------------------------------------------------------
async def test_schedules_crud_and_next_fires(api: Api) -> None:
    spec = {"name": "hourly", "handler": "t.noop", "cron": "0 * * * *", "timezone": "Europe/Paris"}
    r = await api.req("POST", "/v1/schedules", "admin", json=spec)
    assert r.status_code == 201 and r.json()["name"] == "hourly" and r.json()["next_fire_time"]
    _problem(await api.req("POST", "/v1/schedules", "admin", json=spec), 409, error="ScheduleExists", name="hourly")
    _problem(await api.req("POST", "/v1/schedules", "admin", json={**spec, "name": "b", "cron": "61 * * * *"}), 422,
             field="cron", error="InvalidCron")
    _problem(await api.req("POST", "/v1/schedules", "admin", json={**spec, "name": "c", "timezone": "Mars/Base"}), 422,
             field="timezone")
    assert [s["name"] for s in (await api.req("GET", "/v1/schedules", "op_tq")).json()] == ["hourly"]
    assert (await api.req("GET", "/v1/schedules/hourly", "op_tq")).json()["cron"] == "0 * * * *"
    fires = (await api.req("GET", "/v1/schedules/hourly/next?n=3", "op_tq")).json()["fires"]
    ts = [datetime.fromisoformat(f) for f in fires]
    assert len(ts) == 3 and ts[1] - ts[0] == timedelta(hours=1) and ts[0].minute == 0
    assert (await api.req("POST", "/v1/schedules/hourly/pause", "admin")).json()["paused"] is True
    assert (await api.req("POST", "/v1/schedules/hourly/resume", "admin")).json()["paused"] is False
    _problem(await api.req("POST", "/v1/schedules/hourly/pause", "op_tq"), 403)
    assert (await api.req("DELETE", "/v1/schedules/hourly", "admin")).status_code == 204
    _problem(await api.req("GET", "/v1/schedules/hourly", "admin"), 404, name="hourly")


async def test_workflows_submit_status_retry(api: Api, stores: Stores) -> None:
    nodes = [{"name": "a", "handler": "t.echo", "args": [1]},
             {"name": "b", "handler": "t.echo", "args": [2], "depends_on": ["a"]}]
    r = await api.req("POST", "/v1/workflows", "producer", json={"name": "etl", "nodes": nodes})
    assert r.status_code == 201
    wid = r.json()["id"]
    wf = (await api.req("GET", f"/v1/workflows/{wid}", "op_tq")).json()
    assert wf["name"] == "etl" and {n["name"]: (n["status"], n["depends_on"]) for n in wf["nodes"]} == {
        "a": ("PENDING", []), "b": ("BLOCKED", ["a"])}
    assert [w["id"] for w in (await api.req("GET", "/v1/workflows", "op_tq")).json()] == [wid]
    cyc = [{"name": "a", "handler": "t.echo", "args": [1], "depends_on": ["b"]},
           {"name": "b", "handler": "t.echo", "args": [1], "depends_on": ["a"]}]
    _problem(await api.req("POST", "/v1/workflows", "producer", json={"nodes": cyc}), 422, field="depends_on",
             error="WorkflowCycle")
    _problem(await api.req("GET", f"/v1/workflows/{uuid.uuid4()}", "admin"), 404, error="UnknownWorkflow")
    _problem(await api.req("GET", "/v1/workflows/not-a-uuid", "admin"), 422, field="workflow_id")
    a = next(n["id"] for n in wf["nodes"] if n["name"] == "a")
    await api.req("POST", f"/v1/runs/{a}/cancel", "admin", json={"reason": "test"})
    await record_all(stores)
    r = await api.req("POST", f"/v1/workflows/{wid}/retry", "op_tq", json={"reason": "go"})
    assert r.status_code == 200 and r.json()["done"]["retried"] == ["a"], r.text
    _problem(await api.req("POST", f"/v1/workflows/{wid}/retry", "op_other", json={}), 404)  # not in scope: unknown


async def test_tokens_over_the_api_show_the_secret_once(api: Api, client: Client) -> None:
    r = await api.req("POST", "/v1/tokens", "admin", json={"role": "operator", "queues": ["tq"], "name": "ci"})
    assert r.status_code == 201
    created = r.json()
    secret = created.pop("secret")
    assert secret.startswith("fp_") and created["role"] == "operator" and created["queues"] == ["tq"]
    stored = await client.stores.db.pool.fetchval("SELECT secret_sha256 FROM api_tokens WHERE id = $1", created["id"])
    assert stored == hash_secret(secret) and secret not in json.dumps((await api.req("GET", "/v1/tokens", "admin")).json())
    listed = {t["id"]: t for t in (await api.req("GET", "/v1/tokens", "admin")).json()}
    assert "secret" not in listed[created["id"]] and listed[created["id"]]["created_by"].startswith("token:")
    _problem(await api.req("POST", "/v1/tokens", "admin", json={"role": "root"}), 422, field="role")


# -- the CLI over --api ------------------------------------------------------------------------------
def free_port() -> int:
    """A loopback port free a moment ago (the OS's pick)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_api(settings: Settings, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`fencepost api` as a real process on a free port, its output in `log`, once its /readyz answers 200:
    the process (the caller stops it) and its base URL."""
    from tests.conftest import wait_until

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fencepost.cli", "api", "--port", str(port)], cwd=ROOT,
                                env=worker_env(settings), stdout=out, stderr=out)

    async def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            async with httpx.AsyncClient() as h:
                return (await h.get(f"{url}/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    try:
        await wait_until(up, timeout=30, what="fencepost api to listen")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, url


async def test_cli_talks_to_the_api_without_store_credentials(settings: Settings, client: Client, tmp_path) -> None:
    _, admin = await create_token(client.stores.db, "admin", [], "cli", "test")
    proc, url = await start_api(settings, tmp_path / "api.log")
    try:
        # no Redis or PostgreSQL settings at all: only the API URL and token
        env = {"PATH": "/usr/bin:/bin", "FENCEPOST_API_URL": url, "FENCEPOST_API_TOKEN": admin,
               "FENCEPOST_REDIS_URL": "redis://127.0.0.1:1/0", "FENCEPOST_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=60)

        out = await asyncio.to_thread(cli, "submit", "t.echo", "--args", "[7]", "--idempotency-key", "k1")
        assert out.returncode == 0, out.stderr
        rid = int(out.stdout.strip())
        again = await asyncio.to_thread(cli, "submit", "t.echo", "--args", "[7]", "--idempotency-key", "k1")
        assert int(again.stdout.strip()) == rid
        out = await asyncio.to_thread(cli, "pause", str(rid), "--reason", "via api")
        assert out.returncode == 0 and out.stdout.strip() == f"run {rid}: PAUSED", out.stderr
        out = await asyncio.to_thread(cli, "pause", str(rid))
        assert out.returncode == 1 and out.stderr.startswith("error: ") and "PAUSED" in out.stderr
        out = await asyncio.to_thread(cli, "status", str(rid))
        assert out.returncode == 0 and "PAUSED" in out.stdout, out.stderr
        out = await asyncio.to_thread(cli, "ls", "--queue", "tq")
        assert str(rid) in out.stdout
        await record_all(client.stores)  # bulk selections read PostgreSQL
        out = await asyncio.to_thread(cli, "resume", "--queue", "tq", "--status", "PAUSED")
        assert out.returncode == 0 and "1 runs in queue 'tq' match" in out.stdout
        out = await asyncio.to_thread(cli, "resume", "--queue", "tq", "--status", "PAUSED", "--yes")
        assert out.returncode == 0 and "1 matched, 1 acted on: 1 PENDING" in out.stdout, out.stdout + out.stderr
        out = await asyncio.to_thread(cli, "queue", "pause", "tq", "--reason", "x")
        assert out.returncode == 0 and "paused" in out.stdout
        out = await asyncio.to_thread(cli, "events", str(rid))
        assert out.returncode == 0 and "submitted" in out.stdout
        out = await asyncio.to_thread(cli, "token", "ls")
        assert out.returncode == 0 and "admin" in out.stdout
        out = await asyncio.to_thread(cli, "dlq")
        assert out.returncode == 0
        bad = dict(env, FENCEPOST_API_TOKEN="fp_wrong")
        out = await asyncio.to_thread(lambda: subprocess.run([sys.executable, "-m", "fencepost.cli", "ls"], cwd=ROOT,
                                                              env=bad, capture_output=True, text=True, timeout=60))
        assert out.returncode == 1 and "HTTP 401" in out.stderr
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_token_cli_creates_lists_and_revokes(settings: Settings) -> None:
    env = worker_env(settings)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)

    out = cli("token", "create", "--role", "operator", "--queue", "payments", "--name", "oncall")
    assert out.returncode == 0, out.stderr
    secret = out.stdout.strip()
    assert secret.startswith("fp_") and "cannot be shown again" in out.stderr
    listed = cli("token", "ls").stdout
    assert "oncall" in listed and "payments" in listed and secret not in listed and "active" in listed
    tid = out.stderr.split()[1]
    assert cli("token", "revoke", tid).returncode == 0
    assert "revoked" in cli("token", "ls").stdout
    bad = cli("token", "create", "--role", "root")
    assert bad.returncode == 2


# -- schemathesis ------------------------------------------------------------------------------------
@contextlib.contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a free loopback port in a thread of this process."""
    import threading

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:  # a bounded wait for the listener, not a sleep as synchronisation
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


async def test_schemathesis_finds_no_server_error(settings: Settings, client: Client) -> None:
    """Property-based calls of every operation in /openapi.json (bounded examples, real HTTP to an
    in-process server): no 5xx, and every answer conforms to its documented status codes and schema."""
    import schemathesis
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings
    from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

    from fencepost.api.openapi import spec

    await client.submit("t.echo", 1)
    _, secret = await create_token(client.stores.db, "admin", [], "fuzz", "test")
    app = create_app(settings, ApiConfig(token_cache_s=60, rate_limit=0, bulk_cap=5))
    failures: list[str] = []
    calls: dict[int, int] = {}

    def fuzz(base_url: str) -> None:
        schema = schemathesis.openapi.from_dict(spec())
        for result in schema.get_all_operations():
            operation = result.ok()
            if operation.path in ("/metrics", "/openapi.json", "/v1/events/stream"):
                continue  # the event stream is open-ended (tests/test_events_stream.py)

            @hsettings(max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy())
            def check(case: Any) -> None:
                case.headers = {**(case.headers or {}), "Authorization": f"Bearer {secret}"}
                resp = case.call(base_url=base_url, timeout=30)
                where = f"{case.method} {case.formatted_path}"
                calls[resp.status_code // 100] = calls.get(resp.status_code // 100, 0) + 1
                if resp.status_code >= 500 and resp.status_code != 503:
                    failures.append(f"{where}: {resp.status_code} {resp.text[:300]}")
                    return
                try:
                    case.validate_response(resp, checks=[status_code_conformance, response_schema_conformance])
                except Exception as exc:
                    failures.append(f"{where}: {str(exc)[:400]}")

            check()

    with serve_in_thread(app) as base_url:
        await asyncio.to_thread(fuzz, base_url)
    assert not failures, "\n".join(failures[:15])
    assert sum(calls.values()) >= 200 and calls.get(2, 0) >= 20, calls  # it really exercised the API


async def test_dispatch_settings_over_http(api: Api, client: Client, stores: Stores) -> None:
    """Tenants submitted over HTTP show up in the queue's dispatch view; an admin changes a
    weight, a key's limit and the aging step (record and Redis copy); operators only read;
    bad changes are refused with nothing changed."""
    rid = await _submit(api, tenant="acme")
    await _submit(api, tenant="acme")
    await _submit(api)
    assert (await api.req("GET", f"/v1/runs/{rid}", "op_tq")).json()["tenant"] == "acme"
    view = (await api.req("GET", "/v1/queues/tq/dispatch", "op_tq")).json()
    assert {t["tenant"]: t["due"] for t in view["tenants"]} == {"acme": 2, "(none)": 1}
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "weight", "tenant": "acme",
                                                                        "value": 3})
    assert r.status_code == 200, r.text
    assert r.json()["weights"] == {"acme": 3.0}
    assert await stores.redis.hget(stores.keys("tq").base + "weights", "acme") == b"3.0"
    await api.req("POST", "/v1/queues/tq/dispatch", "admin",
                  json={"setting": "limit", "key": "export:acme", "value": 2})
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "aging", "value": 5})
    assert (r.json()["limits"], r.json()["priority_age_ms"]) == ({"export:acme": 2}, 5000)
    assert await stores.redis.hget(stores.keys("tq").config, "priority_age_ms") == b"5000"
    _problem(await api.req("POST", "/v1/queues/tq/dispatch", "op_tq", json={"setting": "aging", "value": 1}), 403)
    before = (await api.req("GET", "/v1/queues/tq/dispatch", "admin")).json()
    _problem(await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "weight", "tenant": "acme",
                                                                            "value": 5000}), 422)
    _problem(await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "limit", "value": 2}), 422)
    _problem(await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "max_running",
                                                                            "value": 2.5}), 422)
    _problem(await api.req("POST", "/v1/queues/nope/dispatch", "admin", json={"setting": "aging", "value": 1}), 404)
    assert (await api.req("GET", "/v1/queues/tq/dispatch", "admin")).json() == before
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "weight", "tenant": "acme",
                                                                        "value": None})
    assert r.json()["weights"] == {} and not await stores.redis.exists(stores.keys("tq").base + "weights")


