"""The CLI never surprises, and results tell the truth (issue 15, items 6 and 7): exit codes scripts
can rely on, --json on every read command, one-line usage errors, unknown queues refused, and an
Outcome that reports the final attempt's error only, with the reason the run ended."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator

import pytest

from fencepost.cli.common import EXIT_CODES, EXIT_OK, EXIT_REFUSED, EXIT_UNSUCCESSFUL, EXIT_USAGE
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from fencepost.worker.runtime import Worker, WorkerOptions
from fencepost.workflows import Node
from tests.apps import registry as apps
from tests.conftest import ROOT, record_all, wait_state, worker_env


class Out:
    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.code, self.stdout, self.stderr = code, stdout, stderr

    def __repr__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.stdout}--- stderr\n{self.stderr}"


async def fp(settings: Settings, *args: str) -> Out:
    """`fencepost ARGS` as a real process against the test stores."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "fencepost.cli", *args, cwd=ROOT,
                                                env=worker_env(settings), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return Out(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


@contextlib.asynccontextmanager
async def worker(settings: Settings) -> AsyncIterator[Worker]:
    """An in-process worker on `tq` until the block ends."""
    w = Worker(apps, WorkerOptions(queues=["tq"], concurrency=10, processes=1), settings=settings)
    task = asyncio.create_task(w.run())
    try:
        yield w
    finally:
        w.request_stop()
        await asyncio.wait_for(task, 60)


async def _drain(settings: Settings, queues: tuple[str, ...] = ("tq",)) -> None:
    worker = Worker(apps, WorkerOptions(queues=list(queues), concurrency=10, processes=1, burst=True),
                    settings=settings)
    await asyncio.wait_for(worker.run(), 60)


# -- item 7: results that tell the truth ---------------------------------------------------------------
async def test_outcome_reports_the_final_attempts_error_and_the_reason(settings: Settings, client: Client,
                                                                       stores: Stores) -> None:
    ok_after_429 = await client.submit("t.err.rate_limited", 0.05)
    fatal = await client.submit("t.err.invalid")
    policy = await client.submit("t.err.policy")
    exhausted = await client.submit("t.fail", max_retries=1)
    await _drain(settings)
    expect = {
        ok_after_429: ("SUCCEEDED", None, None, None),
        fatal: ("FAILED", "InvalidJobInput", "fatal", "amount must be positive"),
        policy: ("FAILED", "PolicyViolation", "policy", "token lacks scope"),
        exhausted: ("FAILED", "ConnectionError", "retries_exhausted", "attempt 2"),
    }

    async def check(where: str) -> None:
        for rid, (status, eclass, reason, text) in expect.items():
            out = await client.wait(rid, timeout=10)
            assert (out.status, out.error_class, out.reason) == (status, eclass, reason), (where, rid, out)
            if text is None:
                assert out.error is None, (where, out)
            else:
                assert out.error is not None and text in out.error, (where, out)

    await check("from the stream")
    await record_all(stores)  # the recorder deletes the stream entries: PostgreSQL answers now
    await check("from postgresql")
    assert (await client.wait(ok_after_429)).result == 2


# -- item 6: the CLI never surprises -------------------------------------------------------------------
def test_the_exit_code_table_is_the_documented_one() -> None:
    assert sorted(EXIT_CODES) == [0, 1, 2, 3, 130]
    assert (EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNSUCCESSFUL) == (0, 1, 2, 3)


@pytest.mark.parametrize("args", [
    ("status", "abc"),                             # a non-integer id
    ("submit", "t.echo", "--args", "[1"),          # bad JSON in --args
    ("submit", "t.echo", "--kwargs", "[1]"),       # JSON of the wrong kind
    ("events", "--since", "10x"),                  # a malformed duration
    ("no-such-command",),
    ("ls", "--no-such-option"),
])
async def test_a_usage_error_is_one_line_and_exit_2(settings: Settings, args: tuple[str, ...]) -> None:
    out = await fp(settings, *args)
    assert out.code == EXIT_USAGE, out
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    assert out.stdout == "", out


async def test_submit_wait_exits_3_unless_the_run_succeeded(settings: Settings, client: Client) -> None:
    async with worker(settings):
        ok, bad = await asyncio.gather(fp(settings, "submit", "t.echo", "--args", "[7]", "--wait", "30"),
                                       fp(settings, "submit", "t.err.invalid", "--wait", "30"))
    assert ok.code == EXIT_OK, ok
    assert json.loads(ok.stdout.splitlines()[1]) == {"status": "SUCCEEDED", "result": 7, "error": None}
    assert bad.code == EXIT_UNSUCCESSFUL, bad
    outcome = json.loads(bad.stdout.splitlines()[1])
    assert (outcome["status"], outcome["reason"], outcome["error_class"]) == ("FAILED", "fatal", "InvalidJobInput")


async def test_status_shows_version_arguments_tenant_key_and_progress(settings: Settings, client: Client,
                                                                     stores: Stores) -> None:
    rid = await client.submit("t.echo", "hello", tenant="acme", concurrency_key="echo:acme", concurrency_limit=2)
    await client.pause(rid, reason="look first")
    out = await fp(settings, "status", str(rid))
    assert out.code == 0, out
    text = dict(line.split(None, 1) for line in out.stdout.splitlines() if line.strip() and "  " in line[:18])
    assert text["status"] == "PAUSED" and text["version"] == "1", out
    assert text["arguments"] == '["hello"]' and text["tenant"] == "acme" and text["concurrency_key"] == "echo:acme", out
    js = await fp(settings, "status", str(rid), "--json")
    assert js.code == 0, js
    doc = json.loads(js.stdout)
    assert (doc["status"], doc["version"], doc["args"], doc["tenant"]) == ("PAUSED", 1, ["hello"], "acme")
    assert "progress" in doc and "attempts" in doc
    # the version printed is the one --version accepts
    assert (await fp(settings, "resume", str(rid), "--version", "1")).code == 0


async def test_pause_of_a_running_run_says_what_happens(settings: Settings, client: Client, stores: Stores) -> None:
    async with worker(settings):
        rid = await client.submit("t.sleep", 30)
        await wait_state(stores, rid, {"RUNNING"})
        out = await fp(settings, "pause", str(rid))
        assert out.code == 0, out
        assert "REQUESTED" not in out.stdout and f"run {rid}: RUNNING, pause requested" in out.stdout, out
        await client.cancel(rid)


async def test_unknown_queues_are_refused_everywhere(settings: Settings, client: Client) -> None:
    for args in (("queue", "pause", "nosuch"), ("queue", "show", "nosuch"), ("queue", "weight", "nosuch", "a", "2"),
                 ("queue", "limit", "nosuch", "3"), ("scale-hint", "--queue", "nosuch"), ("ls", "--queue", "nosuch"),
                 ("dlq", "--queue", "nosuch"), ("events", "--queue", "nosuch"), ("review", "ls", "--queue", "nosuch"),
                 ("cancel", "--queue", "nosuch", "--yes")):
        out = await fp(settings, *args)
        assert out.code == EXIT_REFUSED and out.stderr == "error: no queue named 'nosuch'\n", (args, out)
        assert out.stdout == "", (args, out)


async def test_queue_ls_and_show_say_a_queue_is_paused(settings: Settings, client: Client) -> None:
    await client.submit("t.noop")
    assert (await fp(settings, "queue", "pause", "tq")).code == 0
    show = await fp(settings, "queue", "show", "tq")
    assert show.code == 0 and "queue tq is PAUSED" in show.stdout, show
    assert json.loads((await fp(settings, "queue", "show", "tq", "--json")).stdout)["paused"] is True
    listed = await fp(settings, "queue", "ls")
    assert listed.code == 0 and any(line.split()[:2] == ["tq", "paused"] for line in listed.stdout.splitlines()), listed
    (tq,) = [q for q in json.loads((await fp(settings, "queue", "ls", "--json")).stdout) if q["queue"] == "tq"]
    assert tq["paused"] is True and tq["due"] == 1  # counted in Redis, the live store


async def test_a_bulk_dry_run_exits_0_and_changes_nothing(settings: Settings, client: Client) -> None:
    rid = await client.submit("t.noop")
    out = await fp(settings, "cancel", "--queue", "tq", "--status", "PENDING")
    assert out.code == EXIT_OK and "1 runs in queue 'tq' match; nothing changed." in out.stdout, out
    assert (await client.get(rid))["status"] == "PENDING"


async def test_workflow_ls_and_short_ids(settings: Settings, client: Client) -> None:
    wid = str(await client.submit_workflow([Node(name="a", handler="t.noop"),
                                            Node(name="b", handler="t.noop", depends_on=("a",))], name="nightly"))
    listed = await fp(settings, "workflow", "ls")
    assert listed.code == 0 and wid[:8] in listed.stdout and wid not in listed.stdout, listed
    for prefix in (wid[:8], wid[:4], wid):
        shown = await fp(settings, "workflow", "show", prefix)
        assert shown.code == 0 and f"workflow {wid} (nightly): 2 nodes" in shown.stdout, (prefix, shown)
    js = json.loads((await fp(settings, "workflow", "show", wid[:8], "--json")).stdout)
    assert js["id"] == wid and {n["name"] for n in js["nodes"]} == {"a", "b"}
    missing = await fp(settings, "workflow", "show", "ffffffff")
    assert missing.code == EXIT_REFUSED and len(missing.stderr.splitlines()) == 1, missing


async def test_every_read_command_has_json(settings: Settings, client: Client, stores: Stores) -> None:
    rid = await client.submit("t.noop")
    await record_all(stores)
    await client.submit_workflow([Node(name="a", handler="t.noop")])
    reads = [("ls",), ("status", str(rid)), ("events", str(rid)), ("events", "--since", "1h"), ("dlq",),
             ("queue", "ls"), ("queue", "show", "tq"), ("workflow", "ls"), ("review", "ls"), ("schedule", "ls"),
             ("token", "ls"), ("scale-hint", "--queue", "tq")]
    outs = await asyncio.gather(*(fp(settings, *args, "--json") for args in reads))
    for args, out in zip(reads, outs):
        assert out.code == 0, (args, out)
        json.loads(out.stdout)  # one JSON document
    assert rid in [r["id"] for r in json.loads(outs[0].stdout)]


async def test_loadtest_reports_real_figures_and_cleans_up(settings: Settings, client: Client) -> None:
    out = await fp(settings, "loadtest", "burst", "--jobs", "40", "--workers", "1", "--concurrency", "20", "--json")
    assert out.code == 0, out
    rep = json.loads(out.stdout)
    assert rep["errors"] == [] and rep["succeeded"] == 40 and rep["runs_created_per_s"] > 0, rep
    assert rep["removed_runs"] == 40 and rep["kept"] is False
    queues = [q["queue"] for q in json.loads((await fp(settings, "queue", "ls", "--json")).stdout)]
    assert rep["queue"] not in queues
    assert [r for r in await client.list_runs(limit=1000) if r["queue"] == rep["queue"]] == []
    text = await fp(settings, "loadtest", "burst", "--jobs", "20", "--workers", "1", "--concurrency", "20", "--keep")
    assert text.code == 0 and "None" not in text.stdout and "kept (--keep)" in text.stdout, text


async def test_workers_lists_a_live_worker_and_stop_asks_it_to_drain(settings: Settings, client: Client) -> None:
    """`fencepost workers` and `workers stop` are written once against the operator protocol (issue 25)."""
    async with worker(settings):
        rows: list[dict[str, object]] = []
        for _ in range(100):
            out = await fp(settings, "workers", "--queue", "tq", "--json")
            assert out.code == 0, out
            rows = json.loads(out.stdout)
            if rows:
                break
            await asyncio.sleep(0.1)
        assert len(rows) == 1 and rows[0]["queues"] == ["tq"], rows
        stopped = await fp(settings, "workers", "stop", str(rows[0]["id"]), "--reason", "typed")
        assert stopped.code == 0 and "asked worker" in stopped.stdout, stopped
