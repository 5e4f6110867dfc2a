"""Scopes that hold for every role and every route (issue 14): every route of the OpenAPI
document x every role x (unscoped, scoped to the resource's queue, scoped to another queue)
answers the status this table decides. A route added without a decision here fails the test.

Also the API's hardening: token expiry, throttled failed authentications, security headers,
`Allow` on 405, deep nesting, ASCII-only ids, reachable schedule names, fleet events for scoped
tokens, and the CLI's token from a file or the environment."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from fencepost.api import ApiConfig
from fencepost.api.auth import create_token
from fencepost.client import Client
from fencepost.core import workers as fleet
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from tests.conftest import ROOT, record_all, worker_env
from tests.test_api import Api, _make_api, start_api

ROLES = ("producer", "operator", "admin")
SCOPES = ("all", "in", "out")
"""all: an unscoped token; in: scoped to tq, where every resource below lives; out: scoped to 'other'."""
Q = "tq"


@dataclass
class Decision:
    """Who may call a route and what each caller gets: `roles` may (others: 403); in scope, `ok`;
    a token scoped to another queue, `out` (404: the resource is as unknown as a missing one;
    403: it named a queue outside its scope; 200: a listing filtered to nothing of tq)."""

    roles: tuple[str, ...]
    ok: int
    out: int
    make: Callable[[World, str], Awaitable[tuple[str, dict[str, Any]]]]
    """(path, request kwargs) for a caller: fresh resources where the call changes them."""


class World:
    """The API with one token per role x scope and helpers that make fresh resources in tq."""

    def __init__(self, api: Api, stores: Stores) -> None:
        self.api, self.stores = api, stores

    async def run(self, who: str) -> int:
        """A PENDING run in tq, submitted by the caller when a producer can (it reads only its own)."""
        by = who if who.startswith("producer") and not who.endswith("out") else "admin-all"
        r = await self.api.req("POST", "/v1/runs", by, json={"handler": "t.echo", "args": [uuid.uuid4().hex]})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    async def schedule(self) -> str:
        name = f"s-{uuid.uuid4().hex[:8]}"
        r = await self.api.req("POST", "/v1/schedules", "admin-all",
                               json={"name": name, "handler": "t.noop", "queue": Q, "cron": "0 3 * * *"})
        assert r.status_code == 201, r.text
        return name

    async def workflow(self) -> str:
        r = await self.api.req("POST", "/v1/workflows", "admin-all",
                               json={"nodes": [{"name": "a", "handler": "t.echo", "args": [1], "queue": Q}]})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    async def batch(self) -> str:
        r = await self.api.req("POST", "/v1/batches", "admin-all", json={
            "runs": [{"handler": "t.echo", "args": [1], "queue": Q}], "on_complete": {"handler": "t.noop", "queue": Q}})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    async def token(self) -> int:
        row, _ = await create_token(self.stores.db, "producer", [Q], "victim", "test")
        return int(row["id"])


def _get(path: str, **kw: Any) -> Callable[[World, str], Awaitable[tuple[str, dict[str, Any]]]]:
    async def make(w: World, who: str) -> tuple[str, dict[str, Any]]:
        return path, kw

    return make


def _on_run(suffix: str = "", body: Any = None) -> Callable[[World, str], Awaitable[tuple[str, dict[str, Any]]]]:
    async def make(w: World, who: str) -> tuple[str, dict[str, Any]]:
        return f"/v1/runs/{await w.run(who)}{suffix}", ({} if body is None else {"json": body})

    return make


def _on_schedule(suffix: str = "", body: Any = None) -> Callable[[World, str], Awaitable[tuple[str, dict[str, Any]]]]:
    async def make(w: World, who: str) -> tuple[str, dict[str, Any]]:
        return f"/v1/schedules/{await w.schedule()}{suffix}", ({} if body is None else {"json": body})

    return make


def _on_workflow(suffix: str = "", body: Any = None) -> Callable[[World, str], Awaitable[tuple[str, dict[str, Any]]]]:
    async def make(w: World, who: str) -> tuple[str, dict[str, Any]]:
        return f"/v1/workflows/{await w.workflow()}{suffix}", ({} if body is None else {"json": body})

    return make


async def _on_batch(w: World, who: str) -> tuple[str, dict[str, Any]]:
    return f"/v1/batches/{await w.batch()}", {}


async def _new_schedule(w: World, who: str) -> tuple[str, dict[str, Any]]:
    return "/v1/schedules", {"json": {"name": f"n-{uuid.uuid4().hex[:8]}", "handler": "t.noop", "queue": Q,
                                      "cron": "0 3 * * *"}}


async def _on_worker(w: World, who: str) -> tuple[str, dict[str, Any]]:
    """A live worker serving tq (its identity heartbeat, as a worker writes it), asked to stop."""
    wid = f"w-{uuid.uuid4().hex[:8]}"
    await fleet.heartbeat(w.stores, fleet.WorkerInfo(id=wid, host="h", pid=1, version="t", queues=[Q], concurrency=1,
                                                     started_at=time.time(), seen_at=time.time(), claimed=0,
                                                     last_claim_at=None, running=[]), ttl_s=60)
    return f"/v1/workers/{wid}/stop", {"json": {"reason": "m"}}


async def _revoke(w: World, who: str) -> tuple[str, dict[str, Any]]:
    return f"/v1/tokens/{await w.token()}", {}


ANY, READ, ADMIN, SUBMIT = ROLES, ("operator", "admin"), ("admin",), ("producer", "admin")
RUN = "/v1/runs/{run_id}"


def _open(path: str) -> Decision:
    return Decision(ANY, 200, 200, _get(path))


MATRIX: dict[tuple[str, str], Decision] = {
    ("GET", "/healthz"): _open("/healthz"),
    ("GET", "/readyz"): _open("/readyz"),
    ("GET", "/metrics"): Decision(ANY, 200, 200, _get("/metrics")),
    ("GET", "/openapi.json"): _open("/openapi.json"),
    ("GET", "/v1/me"): Decision(ANY, 200, 200, _get("/v1/me")),
    ("POST", "/v1/runs"): Decision(SUBMIT, 201, 403, _get("/v1/runs", json={"handler": "t.echo", "args": [1], "queue": Q})),
    ("POST", "/v1/runs/batch"): Decision(SUBMIT, 201, 403, _get("/v1/runs/batch", json={
        "runs": [{"handler": "t.echo", "args": [1]}]})),
    ("GET", "/v1/runs"): Decision(ANY, 200, 200, _get("/v1/runs")),
    ("GET", RUN): Decision(ANY, 200, 404, _on_run()),
    ("GET", RUN + "/attempts"): Decision(ANY, 200, 404, _on_run("/attempts")),
    ("GET", RUN + "/events"): Decision(ANY, 200, 404, _on_run("/events")),
    ("GET", RUN + "/checkpoint"): Decision(ANY, 200, 404, _on_run("/checkpoint")),
    ("POST", RUN + "/pause"): Decision(READ, 200, 404, _on_run("/pause", {"reason": "m"})),
    ("POST", RUN + "/stop"): Decision(READ, 409, 404, _on_run("/stop", {"reason": "m"})),  # PENDING: nothing to stop
    ("POST", RUN + "/cancel"): Decision(READ, 200, 404, _on_run("/cancel", {"reason": "m"})),
    ("POST", RUN + "/resume"): Decision(READ, 409, 404, _on_run("/resume", {"reason": "m"})),
    ("POST", RUN + "/restart"): Decision(READ, 409, 404, _on_run("/restart", {"reason": "m"})),  # already PENDING
    ("POST", RUN + "/retry"): Decision(READ, 409, 404, _on_run("/retry", {"reason": "m"})),
    ("POST", RUN + "/resolve"): Decision(READ, 422, 404, _on_run("/resolve", {"as": "failed"})),  # not under review
    ("POST", RUN + "/run_now"): Decision(READ, 409, 404, _on_run("/run_now", {"reason": "m"})),  # due already
    ("GET", "/v1/events"): Decision(READ, 200, 200, _get("/v1/events")),
    ("GET", "/v1/events/stream"): Decision(READ, 200, 200, _get("/v1/events/stream?duration=0")),  # ends at once
    ("GET", "/v1/queues"): Decision(READ, 200, 200, _get("/v1/queues")),
    ("POST", "/v1/queues/{queue}/pause"): Decision(READ, 200, 403, _get(f"/v1/queues/{Q}/pause", json={})),
    ("POST", "/v1/queues/{queue}/resume"): Decision(READ, 200, 403, _get(f"/v1/queues/{Q}/resume", json={})),
    ("GET", "/v1/queues/{queue}/dispatch"): Decision(READ, 200, 403, _get(f"/v1/queues/{Q}/dispatch")),
    ("POST", "/v1/queues/{queue}/dispatch"): Decision(ADMIN, 200, 403, _get(f"/v1/queues/{Q}/dispatch",
                                                                          json={"setting": "max_running", "value": 9})),
    ("POST", "/v1/queues/{queue}/bulk"): Decision(ADMIN, 200, 403, _get(f"/v1/queues/{Q}/bulk", json={
        "command": "pause", "count": True, "handler": "t.none"})),
    ("GET", "/v1/dead-letter"): Decision(READ, 200, 200, _get("/v1/dead-letter")),
    ("GET", "/v1/review"): Decision(READ, 200, 200, _get("/v1/review")),
    ("GET", "/v1/schedules"): Decision(READ, 200, 200, _get("/v1/schedules")),
    ("POST", "/v1/schedules"): Decision(ADMIN, 201, 403, _new_schedule),
    ("GET", "/v1/schedules/{name}"): Decision(READ, 200, 404, _on_schedule()),
    ("DELETE", "/v1/schedules/{name}"): Decision(ADMIN, 204, 404, _on_schedule()),
    ("POST", "/v1/schedules/{name}/pause"): Decision(ADMIN, 200, 404, _on_schedule("/pause")),
    ("POST", "/v1/schedules/{name}/resume"): Decision(ADMIN, 200, 404, _on_schedule("/resume")),
    ("PATCH", "/v1/schedules/{name}"): Decision(ADMIN, 200, 404, _on_schedule(body={"cron": "0 4 * * *"})),
    ("POST", "/v1/schedules/{name}/run-now"): Decision(ADMIN, 201, 404, _on_schedule("/run-now")),
    ("GET", "/v1/schedules/{name}/next"): Decision(READ, 200, 404, _on_schedule("/next")),
    ("GET", "/v1/schedules/{name}/runs"): Decision(READ, 200, 404, _on_schedule("/runs")),
    ("POST", "/v1/workflows"): Decision(SUBMIT, 201, 403, _get("/v1/workflows", json={
        "nodes": [{"name": "a", "handler": "t.echo", "args": [1], "queue": Q}]})),
    ("GET", "/v1/workflows"): Decision(READ, 200, 200, _get("/v1/workflows")),
    ("GET", "/v1/workflows/{workflow_id}"): Decision(READ, 200, 404, _on_workflow()),
    ("POST", "/v1/workflows/{workflow_id}/retry"): Decision(READ, 200, 404, _on_workflow("/retry", {})),
    ("POST", "/v1/batches"): Decision(SUBMIT, 201, 403, _get("/v1/batches", json={
        "runs": [{"handler": "t.echo", "args": [1], "queue": Q}], "on_success": {"handler": "t.noop"}})),
    ("GET", "/v1/batches/{batch_id}"): Decision(READ, 200, 404, _on_batch),
    ("GET", "/v1/tokens"): Decision(ADMIN, 200, 200, _get("/v1/tokens")),
    ("POST", "/v1/tokens"): Decision(ADMIN, 201, 403, _get("/v1/tokens", json={"role": "producer", "queues": [Q]})),
    ("DELETE", "/v1/tokens/{token_id}"): Decision(ADMIN, 200, 404, _revoke),
    ("GET", "/v1/audit"): Decision(READ, 200, 200, _get("/v1/audit")),
    ("GET", "/v1/workers"): Decision(READ, 200, 200, _get("/v1/workers")),
    ("GET", "/v1/queues/{queue}/stats"): Decision(READ, 200, 403, _get(f"/v1/queues/{Q}/stats?window=24h")),
    ("GET", "/v1/stats"): Decision(READ, 200, 200, _get("/v1/stats?window=7d")),
    ("POST", "/v1/workers/{worker_id}/stop"): Decision(READ, 200, 404, _on_worker),
    ("GET", "/v1/states"): _open("/v1/states"),
    ("GET", RUN + "/timeline"): Decision(ANY, 200, 404, _on_run("/timeline")),
    ("GET", "/v1/ops/lists/{list}"): Decision(READ, 200, 200, _get("/v1/ops/lists/dead")),
    ("POST", "/v1/ops/bulk"): Decision(READ, 428, 403, _get("/v1/ops/bulk", json={
        "action": "retry", "list": "dead", "filter": {"queue": Q}})),
    ("POST", "/v1/ops/bulk/count"): Decision(READ, 200, 403, _get("/v1/ops/bulk/count", json={
        "action": "retry", "list": "dead", "filter": {"queue": Q}})),
    ("GET", "/v1/ops/queues"): Decision(READ, 200, 200, _get("/v1/ops/queues")),
    ("GET", "/v1/ops/handlers"): Decision(READ, 200, 200, _get("/v1/ops/handlers?window=24h")),
    ("GET", "/v1/batches"): Decision(READ, 200, 200, _get("/v1/batches")),
}


@pytest.fixture
async def world(settings: Settings, client: Client, stores: Stores) -> AsyncIterator[World]:
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0, auth_fail_limit=0)):
        for role in ROLES:
            await api.token(role, name=f"{role}-all")
            await api.token(role, Q, name=f"{role}-in")
            await api.token(role, "other", name=f"{role}-out")
        await client.submit("t.echo", 0, queue="other")  # both queues exist
        yield World(api, stores)


async def test_every_route_has_a_decision_for_every_role_and_scope(world: World) -> None:
    doc = (await world.api.req("GET", "/openapi.json")).json()
    routes = {(m.upper(), p): op for p, ops in doc["paths"].items() for m, op in ops.items()}
    assert set(routes) - set(MATRIX) == set(), "routes without a decision in MATRIX"
    assert set(MATRIX) - set(routes) == set(), "decisions for routes the API does not have"
    wrong = []
    for (method, template), d in MATRIX.items():
        authed = "security" in routes[(method, template)]
        for role in ROLES:
            for scope in SCOPES:
                who = f"{role}-{scope}"
                expected = 200 if not authed else (403 if role not in d.roles else d.out if scope == "out" else d.ok)
                path, kw = await d.make(world, who)
                r = await world.api.req(method, path, who, **kw)
                if r.status_code != expected:
                    wrong.append(f"{method} {template} as {who}: {r.status_code}, expected {expected}: {r.text[:160]}")
        if authed:
            path, kw = await d.make(world, "admin-all")
            r = await world.api.req(method, path, None, **kw)
            if r.status_code != 401:
                wrong.append(f"{method} {template} without a token: {r.status_code}")
    assert not wrong, "\n".join(wrong)


async def test_scoped_listings_hold_only_the_scope(world: World, client: Client) -> None:
    """Issue 14 repro 2: a tq-scoped operator read other queues' schedules (with their arguments)
    and every workflow; a scoped admin listed every token; fleet events were empty for scoped tokens."""
    api = world.api
    mine = await world.schedule()
    r = await api.req("POST", "/v1/schedules", "admin-all",
                      json={"name": "theirs", "handler": "t.noop", "queue": "other", "cron": "0 3 * * *",
                            "kwargs": {"secret": "s3cr3t"}})
    assert r.status_code == 201
    names = [s["name"] for s in (await api.req("GET", "/v1/schedules", "operator-in")).json()]
    assert mine in names and "theirs" not in names
    r = await api.req("GET", "/v1/schedules/theirs", "operator-in")
    assert r.status_code == 404 and "s3cr3t" not in r.text
    await world.workflow()
    r = await api.req("POST", "/v1/workflows", "admin-all", json={"nodes": [{"name": "b", "handler": "t.echo", "args": [1],
                                                                            "queue": "other"}]})
    assert {w["id"] for w in (await api.req("GET", "/v1/workflows", "operator-in")).json()}.isdisjoint({r.json()["id"]})
    assert r.json()["id"] in {w["id"] for w in (await api.req("GET", "/v1/workflows", "operator-out")).json()}
    # a scoped admin: its tokens are at most its scope, and it sees and revokes only those
    r = await api.req("POST", "/v1/tokens", "admin-in", json={"role": "admin"})
    assert r.status_code == 201 and r.json()["queues"] == [Q], "no unscoped token from a scoped admin"
    r = await api.req("POST", "/v1/tokens", "admin-in", json={"role": "admin", "queues": [Q, "other"]})
    assert r.status_code == 403
    listed = (await api.req("GET", "/v1/tokens", "admin-in")).json()
    assert listed and all(t["queues"] and set(t["queues"]) <= {Q} for t in listed)
    r = await api.req("DELETE", f"/v1/tokens/{api.id('admin-all')}", "admin-in")
    assert r.status_code == 404
    # fleet events: the scoped operator sees its queue's run events, not the other queue's
    rid = await world.run("admin-all")
    await client.submit("t.echo", 1, queue="other")
    await api.req("POST", f"/v1/runs/{rid}/pause", "admin-all", json={"reason": "x"})
    await record_all(world.stores)
    events = (await api.req("GET", "/v1/events", "operator-in")).json()
    assert events and {e["queue"] for e in events} == {Q} and any(e["run_id"] == rid for e in events)
    assert {e["queue"] for e in (await api.req("GET", "/v1/events", "operator-out")).json()} == {"other"}


async def test_a_hidden_run_and_a_missing_run_get_the_same_answer(world: World) -> None:
    rid = await world.run("admin-all")
    hidden = await world.api.req("GET", f"/v1/runs/{rid}", "operator-out")
    missing = await world.api.req("GET", f"/v1/runs/{rid + 10_000}", "operator-out")
    assert hidden.status_code == missing.status_code == 404
    assert set(hidden.json()) == set(missing.json()) and "queue" not in hidden.json()


# -- hardening -------------------------------------------------------------------------------
@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0, auth_fail_limit=5,
                                                         auth_fail_window_s=3600)):
        yield a


async def test_tokens_expire(api: Api, client: Client) -> None:
    r = await api.req("POST", "/v1/tokens", "admin", json={"role": "operator", "expires_in": 3600})
    assert r.status_code == 201 and r.json()["expires_at"]
    secret, tid = r.json()["secret"], r.json()["id"]
    h = {"Authorization": f"Bearer {secret}"}
    assert (await api.req("GET", "/v1/me", headers=h)).status_code == 200
    pool = client.stores.db.pool
    assert pool is not None
    await pool.execute("UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE id = $1", tid)
    r = await api.req("GET", "/v1/me", headers=h)
    assert r.status_code == 401 and "expired" in r.json()["detail"]
    assert (await api.req("POST", "/v1/tokens", "admin", json={"role": "operator", "expires_in": 1})).status_code == 422


async def test_failed_authentications_throttle_the_addresss_invalid_tokens_not_its_valid_ones(api: Api) -> None:
    bad = {"Authorization": "Bearer fp_nope"}
    for _ in range(5):
        assert (await api.req("GET", "/v1/me", headers=bad)).status_code == 401
    r = await api.req("GET", "/v1/me", headers=bad)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert (await api.req("GET", "/v1/me", headers={"Authorization": "Bearer fp_other"})).status_code == 429
    assert (await api.req("GET", "/v1/me", headers={"Authorization": "Basic x"})).status_code == 429
    # issue 24 item 7: invalid tokens from the address are throttled until the window passes, its valid
    # tokens are not (they got 429 too); another address is not throttled at all
    assert (await api.req("GET", "/v1/me", "admin")).status_code == 200
    assert (await api.req("GET", "/v1/me", "op_tq")).status_code == 200
    transport = httpx.ASGITransport(app=api.app, client=("198.51.100.9", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as other:
        assert (await other.get("/v1/me", headers=api.h("admin"))).status_code == 200


async def test_security_headers_on_every_dashboard_response(api: Api) -> None:
    for path in ("/", "/ui/", "/ui/app.js", "/ui/missing.css", "/v1/me"):
        r = await api.req("GET", path)
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff", path


async def test_issue_14_small_fixes(api: Api, client: Client) -> None:
    """Deep nesting gave 500; '١' was a run id; 405 listed one method; 'a/b' was an unreachable schedule."""
    deep = b"[" * 5000 + b"]" * 5000
    r = await api.req("POST", "/v1/runs", "producer", content=b'{"handler": "t.echo", "args": ' + deep + b"}",
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    for raw in ("\u0661", "\u00b2", "1\u0661"):
        r = await api.req("GET", f"/v1/runs/{raw}", "admin")
        assert r.status_code == 422 and r.json()["field"] == "run_id", (raw, r.text)
        assert (await api.req("DELETE", f"/v1/tokens/{raw}", "admin")).status_code == 422
    r = await api.req("PUT", "/v1/runs", "admin")
    assert r.status_code == 405 and set(r.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}
    r = await api.req("PUT", "/v1/schedules/x", "admin")
    assert r.status_code == 405 and set(r.headers["allow"].replace(" ", "").split(",")) >= {"GET", "DELETE", "PATCH"}
    r = await api.req("POST", "/v1/schedules", "admin", json={"name": "a/b", "handler": "t.noop", "cron": "* * * * *"})
    assert r.status_code == 422 and r.json()["field"] == "name"
    assert (await api.req("GET", "/v1/schedules", "admin")).json() == []


async def test_cli_token_from_a_file_or_the_environment_and_a_warning_for_the_flag(api: Api, settings: Settings,
                                                                                  tmp_path: Any) -> None:
    env = worker_env(settings)
    env.pop("FENCEPOST_API_TOKEN", None)
    secret = api.tokens["admin"][1]
    f = tmp_path / "token"
    f.write_text(secret + "\n")

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env={**env, **extra},
                              capture_output=True, text=True, timeout=60)

    # no API server here: the unreachable URL proves the token was read before anything connects
    out = await asyncio.to_thread(cli, "--api", "http://127.0.0.1:9", "--token", secret, "ls")
    assert "warning: --token on the command line" in out.stderr
    out = await asyncio.to_thread(cli, "--api", "http://127.0.0.1:9", "--token-file", str(f), "ls")
    assert "warning" not in out.stderr and "unreachable" in out.stderr
    out = await asyncio.to_thread(cli, "--api", "http://127.0.0.1:9", "ls", FENCEPOST_API_TOKEN=secret)
    assert "warning" not in out.stderr
    out = await asyncio.to_thread(cli, "--api", "http://127.0.0.1:9", "--token-file", str(tmp_path / "nope"), "ls")
    assert out.returncode == 2 and "--token-file" in out.stderr



async def test_control_characters_in_dispatch_labels_and_workflow_names_change_nothing(api: Api,
                                                                                       client: Client) -> None:
    """Invariant 7 on the mutating routes whose text fields were checked for length and spaces only:
    a dispatch tenant or key and a workflow name holding a control character are refused (422, the
    field named), and nothing is written: no setting, no audit row, no workflow."""
    await client.submit("t.echo", 0)  # the queue exists
    pool = client.stores.db.pool
    assert pool is not None
    for body, fld in (({"setting": "weight", "tenant": "a\u001bb", "value": 2}, "tenant"),
                      ({"setting": "limit", "key": "k\u0085", "value": 2}, "key")):
        r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={**body, "reason": "x"})
        assert r.status_code == 422 and r.json()["field"] == fld, r.text
    assert await pool.fetchval("SELECT count(*) FROM audit_log WHERE action LIKE 'dispatch_%'") == 0
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "weight", "tenant": "", "value": 2})
    assert r.status_code == 200, "'' is still the tenant of runs without one"
    before = await pool.fetchval("SELECT count(*) FROM workflows")
    r = await api.req("POST", "/v1/workflows", "admin", json={"name": "wf\u001b[31m", "nodes": [
        {"name": "a", "handler": "t.echo", "args": [1], "queue": Q}]})
    assert r.status_code == 422 and r.json()["field"] == "name", r.text
    assert await pool.fetchval("SELECT count(*) FROM workflows") == before


# -- bulk exactly as confirmed ----------------------------------------------------------------
async def test_bulk_acts_on_exactly_the_runs_counted(settings: Settings, client: Client) -> None:
    """Issue 14 repro 4: counting and acting were separate statements, so runs submitted in between
    were swept in (confirm 53 acted on 54); past the cap there was no way to act in chunks. Now a
    count returns a handle for the counted set (issue 24, tests/test_bulk_counted.py)."""
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0, bulk_cap=3)):
        ids = [await client.submit("t.echo", i) for i in range(3)]
        await record_all(client.stores)
        sel = {"command": "pause", "status": "PENDING"}
        r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={**sel, "confirm": 0})
        assert r.status_code == 428 and r.json()["matched"] == 3 and r.json()["until_id"] == ids[-1]
        handle = r.json()["handle"]
        late = await client.submit("t.echo", "late")  # arrives between the count and the confirm
        await record_all(client.stores)
        r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={**sel, "confirm": 3})
        assert r.status_code == 422 and r.json()["matched"] == 4, "over the cap now: refused, nothing changed"
        r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={"command": "pause", "confirm": 3,
                                                                       "handle": handle})
        assert r.status_code == 200 and r.json()["acted"] == 3 and r.json()["results"] == {"PAUSED": 3}, r.text
        assert (await client.get(late))["status"] == "PENDING" and await _hot(client, late) == "PENDING"
        # chunks below the cap with limit: the lowest ids first, confirm = the number acted on
        more = [await client.submit("t.echo", i) for i in range(4)]
        await record_all(client.stores)
        r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={**sel, "confirm": 0, "limit": 2})
        assert r.status_code == 428 and r.json()["acting"] == 2 and r.json()["matched"] == 5
        r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={"command": "pause", "confirm": 2,
                                                                       "handle": r.json()["handle"]})
        assert r.status_code == 200 and r.json()["acted"] == 2
        assert [await _hot(client, i) for i in [late, *more]] == ["PAUSED", "PAUSED", "PENDING", "PENDING", "PENDING"]
        r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={**sel, "confirm": 2, "limit": 5})
        assert r.status_code == 422 and r.json()["field"] == "limit"


async def _hot(client: Client, run_id: int) -> str:
    state = await client.stores.redis.hget(client.stores.keys("tq").run(run_id), "state")
    return state.decode() if state else ""


async def test_cli_bulk_limit_is_honoured_over_the_api(settings: Settings, client: Client, tmp_path: Any) -> None:
    """Issue 14 repro 4: the CLI's --limit was dropped when it talked to the API."""
    _, admin = await create_token(client.stores.db, "admin", [], "cli", "test")
    ids = [await client.submit("t.echo", i) for i in range(5)]
    await record_all(client.stores)
    proc, url = await start_api(settings, tmp_path / "api.log")
    try:
        env = {"PATH": "/usr/bin:/bin", "FENCEPOST_API_URL": url, "FENCEPOST_API_TOKEN": admin}
        out = await asyncio.to_thread(lambda: subprocess.run(
            [sys.executable, "-m", "fencepost.cli", "pause", "--queue", "tq", "--status", "PENDING", "--limit", "2",
             "--yes", "--reason", "chunk 1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60))
        assert out.returncode == 0 and "2 acted on" in out.stdout, out.stdout + out.stderr
        assert [await _hot(client, i) for i in ids] == ["PAUSED", "PAUSED", "PENDING", "PENDING", "PENDING"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
