"""The CLI through the HTTP API (issue 7): every command with an API mode runs as a real
`fencepost` process that has ONLY the API URL and a token (the store URLs point at closed
ports), against a uvicorn server in a thread of this process, and prints what the direct mode
prints; store-side admin tools refuse --api with one clear line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from fencepost.api import ApiConfig, create_app
from fencepost.api.auth import create_token
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from fencepost.workflows import Node
from tests.conftest import ROOT, record_all, worker_env
from tests.test_api import serve_in_thread

# Closed ports: a command that touched a store instead of the API would fail on these.
NO_STORES = {"FENCEPOST_REDIS_URL": "redis://127.0.0.1:1/0", "FENCEPOST_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}
STORE_ONLY = "needs direct Redis/PostgreSQL access"


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


@dataclass
class Cli:
    url: str
    admin: str
    operator: str
    settings: Settings

    def env(self, token: str | None = None) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FENCEPOST_API_URL": self.url,
                "FENCEPOST_API_TOKEN": token or self.admin, **NO_STORES}

    def api(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        return _run(self.env(token), *args)

    def ok(self, *args: str, token: str | None = None) -> str:
        out = self.api(*args, token=token)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out.stdout

    def direct(self, *args: str) -> str:
        env = {k: v for k, v in worker_env(self.settings).items() if not k.startswith("FENCEPOST_API_")}
        out = _run(env, *args)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out.stdout

    def same(self, *args: str, token: str | None = None) -> str:
        """The command over the API prints exactly what it prints on the stores."""
        via_api = self.ok(*args, token=token)
        assert via_api == self.direct(*args), args
        return via_api


@pytest.fixture
async def cli(settings: Settings, client: Client) -> AsyncIterator[Cli]:
    _, admin = await create_token(client.stores.db, "admin", [], "cli-admin", "test")
    _, operator = await create_token(client.stores.db, "operator", [], "cli-operator", "test")
    app = create_app(settings, ApiConfig(token_cache_s=0, rate_limit=0))
    with serve_in_thread(app) as url:
        yield Cli(url, admin, operator, settings)


async def test_schedule_commands_over_the_api(cli: Cli, client: Client) -> None:
    from fencepost.trigger import Trigger

    out = cli.ok("schedule", "add", "hourly", "--cron", "0 * * * *", "--tz", "Europe/Paris", "--handler", "t.noop",
                 "--args", "[1]", "--kwargs", '{"who": "é"}', "--spread", "30")
    assert out.startswith("schedule hourly (id ") and "next fire " in out and ", offset " in out
    out = cli.ok("schedule", "add", "often", "--interval", "3600", "--exact", "--handler", "t.echo", "--args", "[3]")
    assert out.startswith("schedule often (id ") and "offset" not in out
    refused = cli.api("schedule", "add", "x", "--interval", "60", "--handler", "t.noop", token=cli.operator)
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr and not refused.stdout
    bad = cli.api("schedule", "add", "y", "--cron", "61 * * * *", "--handler", "t.noop")
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "HTTP 422" in bad.stderr

    assert (await Trigger(client.stores, use_lease=False, lookahead_s=1).tick()).created == 1  # `often` fires
    listed = cli.same("schedule", "ls", token=cli.operator)
    assert "hourly" in listed and "often" in listed and "0 * * * *" in listed and "3600s" in listed
    shown = cli.same("schedule", "show", "often", token=cli.operator)
    assert "next fires:" in shown and "PENDING" in shown and "last_run_id" in shown  # its run is in the table
    shown = cli.same("schedule", "show", "hourly")
    assert '{"args": [1], "kwargs": {"who": "é"}}' in shown and "(none)" in shown
    nxt = cli.same("schedule", "next", "hourly", "3", token=cli.operator)
    assert len(nxt.splitlines()) == 3 and ("+01:00" in nxt or "+02:00" in nxt)
    assert len(cli.ok("schedule", "next", "*/5 * * * *", "2").splitlines()) == 2  # a cron line: no request

    assert cli.ok("schedule", "pause", "hourly") == "schedule hourly: paused\n"
    assert "paused" in cli.ok("schedule", "ls")
    assert cli.ok("schedule", "resume", "hourly") == "schedule hourly: resumed\n"
    assert cli.ok("schedule", "rm", "hourly") == "schedule hourly: removed\n"
    gone = cli.api("schedule", "show", "hourly")
    assert gone.returncode == 1 and "HTTP 404" in gone.stderr and "hourly" in gone.stderr
    gone = cli.api("schedule", "next", "hourly")
    assert gone.returncode == 1 and "HTTP 404" in gone.stderr


async def test_review_and_workflow_commands_over_the_api(cli: Cli, client: Client, stores: Stores) -> None:
    from tests.test_errors import _burst, _worker  # an in-process worker in burst mode

    review = await client.submit("t.err.side_effect")
    await _burst(_worker(client.settings))
    await record_all(stores)
    listed = cli.same("review", "ls", "--queue", "tq", token=cli.operator)
    assert str(review) in listed and "SideEffectFailed" in listed
    out = cli.api("review", "resolve", str(review), "--as", "maybe")
    assert out.returncode == 2  # click refuses the choice before anything is sent
    assert cli.ok("review", "resolve", str(review), "--as", "succeeded", "--reason", "charge seen",
                  token=cli.operator) == f"run {review}: SUCCEEDED\n"
    again = cli.api("review", "resolve", str(review), "--as", "succeeded")
    assert again.returncode == 1 and again.stderr.startswith("error: ")

    wid = await client.submit_workflow([Node(name="a", handler="t.echo", args=(1,)),
                                        Node(name="b", handler="t.echo", args=(2,), depends_on=("a",))], name="etl")
    shown = cli.same("workflow", "show", str(wid), token=cli.operator)
    assert shown.startswith(f"workflow {wid} (etl): 2 nodes") and "◀ a" in shown
    assert cli.ok("workflow", "retry", str(wid)) == "nothing to retry\n"
    a = next(n["id"] for n in (await client.workflow(wid))["nodes"] if n["name"] == "a")
    await client.cancel(a, reason="test")
    await record_all(stores)
    assert cli.ok("workflow", "retry", str(wid), "--reason", "go", token=cli.operator) == "retried: a\nreblocked: b\n"
    missing = cli.api("workflow", "show", str(uuid.uuid4()))
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr


async def test_submit_wait_over_the_api(cli: Cli, client: Client) -> None:
    from tests.test_errors import _running, _worker

    proc = subprocess.Popen([sys.executable, "-m", "fencepost.cli", "submit", "t.echo", "--args", '[{"x": 5}]',
                             "--wait", "30"], cwd=ROOT, env=cli.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        async with _running(_worker(client.settings, burst=False)):  # no recorder: the outcome comes from Redis
            out, err = await asyncio.to_thread(proc.communicate, timeout=45)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    rid, outcome = out.splitlines()
    assert int(rid) > 0 and json.loads(outcome) == {"status": "SUCCEEDED", "result": {"x": 5}, "error": None}

    out = cli.api("submit", "t.echo", "--args", "[1]", "--wait", "0.3")  # no worker now
    rid = out.stdout.strip()
    assert out.returncode == 1 and out.stderr == f"error: run {rid} still PENDING when the wait timed out\n"


STORE_COMMANDS = [("db", "upgrade"), ("worker", "--app", "tests.apps:registry"), ("reconciler",), ("trigger",),
                  ("api",), ("demo",), ("loadtest", "burst"), ("loadtest", "spike"), ("reconcile", "--check"),
                  ("reconcile", "--repair"), ("scale-hint", "--queue", "tq")]


def test_store_only_commands_refuse_the_api() -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FENCEPOST_API_URL": "http://127.0.0.1:1",
           "FENCEPOST_API_TOKEN": "fp_x", **NO_STORES}
    for args in STORE_COMMANDS:
        out = _run(env, *args)
        assert out.returncode == 1 and not out.stdout, (args, out.stdout, out.stderr)
        assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"error: `fencepost {' '.join(args[:1])}")
        assert STORE_ONLY in out.stderr, (args, out.stderr)
    flag = _run({k: v for k, v in env.items() if not k.startswith("FENCEPOST_API_")}, "--api", "http://127.0.0.1:1",
                "db", "upgrade")
    assert flag.returncode == 1 and STORE_ONLY in flag.stderr and "db upgrade" in flag.stderr


async def test_audit_token_and_bulk_commands_print_the_same_over_the_api(cli: Cli, client: Client,
                                                                          stores: Stores) -> None:
    """audit, token and bulk commands are written once against the operator protocol (issue 25: each
    had an API branch and a direct branch): through the API they print what they print on the stores."""
    ids = [await client.submit("t.noop") for _ in range(3)]
    await client.pause_queue("tq", reason="incident 7")
    await record_all(stores)  # bulk selections read PostgreSQL
    shown = cli.same("audit", "--queue", "tq", "--since", "1h", token=cli.operator)
    assert "queue_paused" in shown and "incident 7" in shown
    entries = json.loads(cli.same("audit", "--json", "--queue", "tq", token=cli.operator))
    assert [(e["action"], e["reason"]) for e in entries] == [("queue_paused", "incident 7")]

    dry = cli.same("cancel", "--queue", "tq", "--status", "PENDING", "--limit", "2")  # bulk: admin tokens only
    assert dry == ("3 runs in queue 'tq' match; nothing changed.\n"
                   "Re-run with --yes to cancel up to 2 of them (--limit 2).\n")
    assert cli.ok("cancel", "--queue", "tq", "--status", "PENDING", "--limit", "2", "--yes", "--reason", "cleanup") == \
        "3 matched, 2 acted on: 2 CANCELLED\n"
    await record_all(stores)
    assert cli.direct("cancel", "--queue", "tq", "--status", "PENDING", "--yes") == \
        "1 matched, 1 acted on: 1 CANCELLED\n"
    assert {(await client.run(i)).status for i in ids} == {"CANCELLED"}

    made = cli.api("token", "create", "--role", "producer", "--queue", "tq", "--name", "ci")
    assert made.returncode == 0 and made.stdout.startswith("fp_"), made.stderr
    tid = int(made.stderr.split()[1])
    assert made.stderr.startswith(f"token {tid} (producer, tq) 'ci'\n")

    def listed(rows: str) -> dict[int, tuple[str, str, str]]:  # last_used_at moves with each API call
        return {r["id"]: (r["name"], r["role"], ",".join(r["queues"])) for r in json.loads(rows)}

    assert listed(cli.ok("token", "ls", "--json")) == listed(cli.direct("token", "ls", "--json"))
    assert cli.direct("token", "revoke", str(tid), "--reason", "rotated") == f"token {tid}: revoked\n"
    row = next(r for r in cli.ok("token", "ls").splitlines() if r.split()[0] == str(tid))
    assert " revoked " in row, row
    only_pg = {k: v for k, v in worker_env(cli.settings).items()  # tokens and the audit log need PostgreSQL only
               if not k.startswith("FENCEPOST_API_") and k != "FENCEPOST_REDIS_URL"}
    for args in (("token", "ls"), ("audit", "--queue", "tq")):
        out = _run(only_pg, *args)
        assert out.returncode == 0 and out.stdout, (args, out.stderr)
