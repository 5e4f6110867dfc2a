"""Workers as operators see them (issue 17): a real worker process heartbeats its identity (host,
pid, version, queues, concurrency, the runs it holds, its last claim) to Redis; `GET /v1/workers` and
`fencepost workers` list it; `POST /v1/workers/{id}/stop` is audited and makes the worker stop
claiming, finish what it holds and exit 0; scoped tokens see and stop only their queues' workers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fencepost import __version__
from fencepost.api import ApiConfig
from fencepost.client import Client
from fencepost.core import workers as fleet
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from tests.conftest import ROOT, log_tail, spawn, wait_state, wait_until, worker_env
from tests.test_api import Api, _make_api
from tests.test_control import WORKER, _kill


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        yield a


async def _listed(api: Api, who: str = "admin", **params: Any) -> list[dict[str, Any]]:
    r = await api.req("GET", "/v1/workers", who, params=params)
    assert r.status_code == 200, r.text
    return list(r.json())


async def test_a_worker_is_listed_with_its_runs_and_stops_when_asked(
        settings: Settings, client: Client, stores: Stores, api: Api, tmp_path: Path) -> None:
    rid = await client.submit("t.sleep", 1.5)
    log = tmp_path / "worker.log"
    proc = spawn(settings, *WORKER, log=log)
    try:
        async def holding() -> dict[str, Any] | None:
            assert proc.poll() is None, log_tail(log)
            ws = [w for w in await _listed(api) if w["pid"] == proc.pid]
            return ws[0] if ws and [h["id"] for h in ws[0]["running"]] == [rid] else None

        w = await wait_until(holding, timeout=40, what="the worker to list itself holding the run")
        assert w["queues"] == ["tq"] and w["concurrency"] == 4 and w["version"] == __version__
        assert w["running"][0] == {"id": rid, "queue": "tq", "handler": "t.sleep", "attempt": 1}
        assert w["claimed"] >= 1 and w["last_claim_at"] >= w["started_at"] and w["stop_requested"] is None

        # scopes: a token of another queue neither sees nor stops it (404, as for a missing worker)
        assert [x["id"] for x in await _listed(api, "op_tq")] == [w["id"]]
        assert await _listed(api, "op_other") == []
        assert await _listed(api, "admin", queue="other") == []
        r = await api.req("POST", f"/v1/workers/{w['id']}/stop", "op_other", json={"reason": "x"})
        assert r.status_code == 404 and r.json()["error"] == "UnknownWorker"
        r = await api.req("POST", "/v1/workers/nobody/stop", "admin", json={"reason": "x"})
        assert r.status_code == 404
        r = await api.req("POST", f"/v1/workers/{w['id']}/stop", "producer", json={})
        assert r.status_code == 403
        r = await api.req("POST", f"/v1/workers/{w['id']}/stop", "op_tq", json={"reason": "bad\x1b[31m"})
        assert r.status_code == 422 and r.json()["field"] == "reason"
        assert proc.poll() is None

        r = await api.req("POST", f"/v1/workers/{w['id']}/stop", "op_tq", json={"reason": "drain for kernel patch"})
        assert r.status_code == 200, r.text
        assert r.json()["stop_requested"]["actor"] == f"token:{api.id('op_tq')}@203.0.113.7"

        # graceful: it finishes the run it holds (within its grace period), then exits 0 and leaves the list
        async def exited() -> bool:
            return proc.poll() is not None

        await wait_until(exited, timeout=40, what="the worker to exit")
        assert proc.returncode == 0, log_tail(log)
        assert b"worker_stop_requested" in log.read_bytes()
        await wait_state(stores, rid, {"SUCCEEDED"})
        assert await _listed(api) == []
        audit = (await api.req("GET", "/v1/audit", "op_tq", params={"queue": "tq"})).json()
        stops = [a for a in audit if a["action"] == "worker_stop"]
        assert [(a["target"], a["reason"], a["address"]) for a in stops] == [
            (w["id"], "drain for kernel patch", "203.0.113.7")]
    finally:
        _kill(proc)


async def test_cli_lists_and_stops_workers(settings: Settings, stores: Stores) -> None:
    now = time.time()
    info = fleet.WorkerInfo(id="host-a:42:abc", host="host-a", pid=42, version="9.9", queues=["tq", "mail"],
                            concurrency=8, started_at=now - 600, seen_at=now, claimed=3, last_claim_at=now - 5,
                            running=[fleet.HeldRun(7, "tq", "t.sleep", 2)])
    assert await fleet.heartbeat(stores, info, ttl_s=60) is None

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env=worker_env(settings),
                              capture_output=True, text=True, timeout=60)

    out = cli("workers")
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split()[:6] == ["ID", "HOST", "PID", "VERSION", "QUEUES", "BUSY"]
    assert row.split()[:7] == ["host-a:42:abc", "host-a", "42", "9.9", "tq,mail", "1/8", "running"]
    assert json.loads(cli("workers", "--json", "--queue", "mail").stdout)[0]["running"][0]["id"] == 7
    assert json.loads(cli("workers", "--json", "--queue", "other").stdout) == []

    out = cli("workers", "stop", "nobody")
    assert out.returncode == 1 and out.stderr.strip() == "error: no live worker with id 'nobody'"
    out = cli("workers", "stop", "host-a:42:abc", "--reason", "rebalancing")
    assert out.returncode == 0, out.stderr
    stop = await fleet.heartbeat(stores, info, ttl_s=60)  # what the worker reads at its next heartbeat
    assert stop is not None and stop.reason == "rebalancing" and stop.actor.startswith("cli:")
    assert "stopping" in cli("workers").stdout
    row = await stores.db.pool.fetchrow(  # type: ignore[union-attr]
        "SELECT actor, target, reason, queue FROM audit_log WHERE action = 'worker_stop'")
    assert row is not None and dict(row) == {"actor": stop.actor, "target": "host-a:42:abc",
                                             "reason": "rebalancing", "queue": None}
    await fleet.forget(stores, info.id)
    assert cli("workers").stdout.strip() == "(none)"
