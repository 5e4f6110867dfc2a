"""An audit trail nothing can evade (issue 14): every command and configuration change writes
its record (actor, address, reason) in the transaction of the change, or does not happen;
reasons are validated before anything takes effect; the recorder never drops an operator's
command; `GET /v1/audit` and `fencepost audit` list who did what, by actor, queue and time."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fencepost.api import ApiConfig
from fencepost.api.auth import create_token, revoke_token
from fencepost.client import Client
from fencepost.core import fairness
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.hot import ControlArgs
from fencepost.core.schedules import ScheduleSpec
from fencepost.core.stores import Stores
from fencepost.schedules import Schedules
from tests.conftest import ROOT, record_all, run_state, worker_env
from tests.test_api import Api, _make_api

ADDR = "203.0.113.7"


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        yield a


async def _audit(client: Client, **where: Any) -> list[dict[str, Any]]:
    assert client.stores.db.pool is not None
    rows = await client.stores.db.pool.fetch("SELECT * FROM audit_log ORDER BY id")
    return [dict(r) for r in rows if all(r[k] == v for k, v in where.items())]


async def test_a_reason_the_history_cannot_hold_is_refused_before_the_command(api: Api, client: Client,
                                                                           stores: Stores) -> None:
    """Issue 14 repro 3: `{"reason": "\\u0000"}` cancelled the run and its event went to the poison stream."""
    rid = (await api.req("POST", "/v1/runs", "producer", json={"handler": "t.echo", "args": [1]})).json()["id"]
    r = await api.req("POST", f"/v1/runs/{rid}/cancel", "admin", json={"reason": "\u0000"})
    assert r.status_code == 422 and r.json()["field"] == "reason", r.text
    r = await api.req("POST", f"/v1/runs/{rid}/cancel", "admin", json={"reason": "bad \u001b[31m escape"})
    assert r.status_code == 422
    assert await run_state(stores, rid) == "PENDING"
    for bad in ("\u0000", "x" * 1001, "\u202e reversed"):
        with pytest.raises(InvalidInput) as err:
            await client.cancel(rid, reason=bad)
        assert err.value.field == "reason"
        with pytest.raises(InvalidInput):
            await client.pause_queue("tq", reason=bad)
        with pytest.raises(InvalidInput):
            await client.bulk("pause", queue="tq", confirm=True, reason=bad)
    assert await run_state(stores, rid) == "PENDING"
    assert not await stores.redis.exists(stores.keys("tq").paused)
    # a good reason: the cancel and its actor, address and reason are in the history
    r = await api.req("POST", f"/v1/runs/{rid}/cancel", "admin", json={"reason": "customer asked"})
    assert r.status_code == 200
    await record_all(stores)
    ev = [e for e in await client.events(rid) if e["type"] == "cancelled"]
    assert ev and ev[0]["actor"] == f"token:{api.id('admin')}@{ADDR}" and ev[0]["reason"] == "customer asked"


async def test_the_recorder_never_drops_an_operators_command(client: Client, stores: Stores) -> None:
    """A command whose text PostgreSQL refuses (written by an older client that did not validate)
    is recorded with the text escaped, not moved to the poison stream."""
    rid = await client.submit("t.echo", 1)
    keys = stores.keys("tq")
    args = ControlArgs(rid, "token:9@10.0.0.1", "\u0000bad", "")
    assert await stores.scripts.control_run("pause", keys, args) == "PAUSED"
    await record_all(stores)
    ev = [e for e in await client.events(rid) if e["type"] == "paused"]
    assert len(ev) == 1 and ev[0]["actor"] == "token:9@10.0.0.1" and ev[0]["reason"] == "\\x00bad"
    assert await stores.redis.xlen(f"{stores.settings.prefix}:recorder:poison") == 0
    assert (await client.get(rid))["status"] == "PAUSED"


async def test_every_configuration_change_is_audited_with_actor_address_and_reason(api: Api, client: Client) -> None:
    """Issue 14 repro 3: dispatch, schedules and tokens recorded no event and no actor at all."""
    await client.submit("t.echo", 1)  # the queue exists
    admin = f"token:{api.id('admin')}@{ADDR}"
    calls = [
        ("POST", "/v1/queues/tq/dispatch", {"setting": "weight", "tenant": "acme", "value": 3, "reason": "big customer"}),
        ("POST", "/v1/queues/tq/dispatch", {"setting": "limit", "key": "export:acme", "value": 2, "reason": "db load"}),
        ("POST", "/v1/queues/tq/dispatch", {"setting": "max_running", "value": 50, "reason": "cap"}),
        ("POST", "/v1/queues/tq/dispatch", {"setting": "aging", "value": 30, "reason": "fairer"}),
        ("POST", "/v1/schedules", {"name": "nightly", "handler": "t.noop", "cron": "0 3 * * *", "reason": "new job"}),
        ("POST", "/v1/schedules/nightly/pause", {"reason": "maintenance"}),
        ("POST", "/v1/schedules/nightly/resume", {"reason": "done"}),
        ("POST", "/v1/queues/tq/pause", {"reason": "incident 12"}),
        ("POST", "/v1/queues/tq/resume", {"reason": "incident over"}),
        ("POST", "/v1/tokens", {"role": "operator", "queues": ["tq"], "name": "ci"}),
    ]
    for method, path, body in calls:
        r = await api.req(method, path, "admin", json=body)
        assert r.status_code in (200, 201), (path, r.text)
    tid = r.json()["id"]
    r = await api.req("DELETE", f"/v1/tokens/{tid}?reason=leaked", "admin")
    assert r.status_code == 200
    r = await api.req("DELETE", "/v1/schedules/nightly?reason=obsolete", "admin")
    assert r.status_code == 204
    rows = await _audit(client, actor=admin)
    assert [(a["action"], a["queue"], a["reason"]) for a in rows] == [
        ("dispatch_weight", "tq", "big customer"), ("dispatch_limit", "tq", "db load"), ("dispatch_max_running", "tq", "cap"),
        ("dispatch_aging", "tq", "fairer"), ("schedule_added", "tq", "new job"), ("schedule_paused", "tq", "maintenance"),
        ("schedule_resumed", "tq", "done"), ("queue_paused", "tq", "incident 12"), ("queue_resumed", "tq", "incident over"),
        ("token_created", None, None), ("token_revoked", None, "leaked"), ("schedule_removed", "tq", "obsolete")]
    assert all(a["address"] == ADDR for a in rows)
    assert json.loads(rows[0]["data"]) == {"weight": 3.0, "tenant": "acme"}
    assert rows[9]["target"] == str(tid) and json.loads(rows[9]["data"])["queues"] == ["tq"]
    # a bad reason changes nothing
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "max_running", "value": 5,
                                                                       "reason": "a\u0000b"})
    assert r.status_code == 422
    assert (await fairness.load(client.stores, "tq")).max_running == 50


async def test_no_change_without_its_audit_row(client: Client, settings: Settings) -> None:
    """The change and its record commit together: when the audit row cannot be written (here a
    constraint refuses it), the change does not happen."""
    await client.submit("t.echo", 1)
    pool = client.stores.db.pool
    assert pool is not None
    await pool.execute("ALTER TABLE audit_log ADD CONSTRAINT test_refuse CHECK (reason IS DISTINCT FROM 'boom')")
    with pytest.raises(Exception, match="test_refuse"):
        await client.pause_queue("tq", reason="boom")
    assert not await pool.fetchval("SELECT paused FROM queues WHERE name = 'tq'")
    assert not await client.stores.redis.exists(client.stores.keys("tq").paused)
    with pytest.raises(Exception, match="test_refuse"):
        await fairness.set_weight(client.stores, "tq", "acme", 5.0, actor="cli:t", reason="boom")
    assert (await fairness.load(client.stores, "tq")).weights == {}
    store = Schedules(client)
    with pytest.raises(Exception, match="test_refuse"):
        await store.add(ScheduleSpec(name="s1", handler="t.noop", cron="* * * * *"), reason="boom")
    assert await store.queue_named("s1") is None
    row, _ = await create_token(client.stores.db, "producer", [], "p", "cli:t")
    with pytest.raises(Exception, match="test_refuse"):
        await revoke_token(client.stores.db, row["id"], "cli:t", reason="boom")
    assert await pool.fetchval("SELECT revoked_at FROM api_tokens WHERE id = $1", row["id"]) is None
    assert await pool.fetchval("SELECT count(*) FROM audit_log WHERE reason = 'boom'") == 0


async def test_audit_api_filters_by_actor_queue_and_time_and_scope(api: Api, client: Client, stores: Stores) -> None:
    rid = await client.submit("t.echo", 1)
    await client.submit("t.echo", 1, queue="other")
    await api.req("POST", "/v1/queues/tq/pause", "admin", json={"reason": "r1"})
    await api.req("POST", "/v1/queues/other/pause", "admin", json={"reason": "r2"})
    await api.req("POST", f"/v1/runs/{rid}/cancel", "op_tq", json={"reason": "r3"})
    await record_all(stores)
    everything = (await api.req("GET", "/v1/audit", "admin")).json()
    assert [(e["source"], e["action"], e["queue"], e["reason"]) for e in everything][:3] == [
        ("run", "cancelled", "tq", "r3"), ("config", "queue_paused", "other", "r2"), ("config", "queue_paused", "tq", "r1")]
    assert everything[0]["target"] == str(rid) and everything[0]["actor"] == f"token:{api.id('op_tq')}@{ADDR}"
    assert everything[1]["address"] == ADDR
    by_actor = (await api.req("GET", "/v1/audit", "admin", params={"actor": f"token:{api.id('op_tq')}@"})).json()
    assert [e["reason"] for e in by_actor] == ["r3"]
    by_queue = (await api.req("GET", "/v1/audit", "admin", params={"queue": "other"})).json()
    assert [e["reason"] for e in by_queue] == ["r2"]
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert (await api.req("GET", "/v1/audit", "admin", params={"since": future})).json() == []
    assert len((await api.req("GET", "/v1/audit", "admin", params={"until": future, "limit": 2})).json()) == 2
    # a scoped operator sees its queues only; producers see nothing
    mine = (await api.req("GET", "/v1/audit", "op_tq")).json()
    assert {e["queue"] for e in mine} == {"tq"} and {e["reason"] for e in mine} >= {"r1", "r3"}
    assert (await api.req("GET", "/v1/audit", "op_tq", params={"queue": "other"})).status_code == 403
    assert (await api.req("GET", "/v1/audit", "producer")).status_code == 403


async def test_fencepost_audit_cli_lists_who_did_what(client: Client, settings: Settings) -> None:
    await client.submit("t.echo", 1)
    await client.pause_queue("tq", reason="from the cli test")
    env = worker_env(settings)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fencepost.cli", "audit", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)

    out = await asyncio.to_thread(cli, "--queue", "tq")
    assert out.returncode == 0 and "queue_paused" in out.stdout and "from the cli test" in out.stdout, out.stderr
    out = await asyncio.to_thread(cli, "--json", "--actor", "client", "--since", "1h")
    rows = json.loads(out.stdout)
    assert [r["action"] for r in rows] == ["queue_paused"]
    out = await asyncio.to_thread(cli, "--queue", "elsewhere")
    assert out.returncode == 0 and "queue_paused" not in out.stdout
    out = await asyncio.to_thread(cli, "--since", "yesterday-ish")
    assert out.returncode == 2 and "--since" in out.stderr


async def test_a_bulk_command_writes_one_audit_row_with_its_selection(api: Api, client: Client) -> None:
    """Each run's event says what happened to it; the bulk row says who asked for how many, and by
    what filter, before the first run is touched (from the API and from the Python client)."""
    ids = [await client.submit("t.echo", i) for i in range(3)]
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json={"command": "cancel", "status": "PENDING"})
    r = await api.req("POST", "/v1/queues/tq/bulk", "admin",
                      json={"command": "cancel", "handle": r.json()["handle"], "confirm": 3, "reason": "bad deploy"})
    assert r.status_code == 200, r.text
    [row] = await _audit(client, action="bulk_cancel")
    assert (row["actor"], row["address"], row["queue"], row["reason"]) == \
        (f"token:{api.id('admin')}@{ADDR}", ADDR, "tq", "bad deploy")
    data = json.loads(row["data"])
    assert (data["status"], data["matched"], data["runs"], sorted(data["ids"])) == ("PENDING", 3, 3, sorted(ids))
    more = [await client.submit("t.echo", i) for i in range(2)]
    await record_all(client.stores)  # the cancels reach PostgreSQL, which the selection reads
    await client.bulk("pause", queue="tq", status="PENDING", confirm=True, reason="hold")
    [row] = await _audit(client, action="bulk_pause")
    assert (row["actor"], row["reason"], json.loads(row["data"])["runs"]) == (client.actor, "hold", len(more))
