"""The operator dashboard in headless Chromium (Debian's /usr/bin/chromium driven by Playwright):
log in with a token, find a running checkpointed job, pause it with a reason, see PAUSED,
resume it and see it complete. Screenshots go to tests/artifacts/ (CI artifacts)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fencepost.api import ApiConfig, create_app
from fencepost.api.auth import create_token
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.stores import Stores
from fencepost.schedules import Schedules
from tests.conftest import ROOT, log_tail, need_tool, spawn, wait_state, wait_until
from tests.test_api import serve_in_thread
from tests.test_control import WORKER, _kill, _worker

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("FENCEPOST_CHROMIUM") or "chromium"  # a path, or a name looked up on PATH
ARTIFACTS = ROOT / "tests" / "artifacts"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@contextlib.asynccontextmanager
async def dashboard_page(chromium: str, **options: Any) -> AsyncIterator[Any]:
    """A Playwright page (new_page(**options)) in headless Chromium at `chromium`, 30 s timeouts; the browser
    closes on the way out."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        try:
            page = await browser.new_page(**options)
            page.set_default_timeout(30_000)
            yield page
        finally:
            await browser.close()


async def log_in(page: Any, base: str, secret: str, who: str | None = None) -> None:
    """Open the dashboard at `base` and log in with the token `secret`; with `who`, see its name shown."""
    from playwright.async_api import expect

    await page.goto(f"{base}/")
    await page.fill("#token", secret)
    await page.click("#login")
    if who is not None:
        await expect(page.locator("#who")).to_contain_text(who)


@contextlib.asynccontextmanager
async def _recording(stores: Stores) -> AsyncIterator[None]:
    """The recorder in the background, so the history the dashboard shows is in PostgreSQL."""
    from fencepost.reconciler.recorder import Recorder

    rec = Recorder(stores, consumer="dashboard-test")

    async def loop() -> None:
        while True:
            await rec.run_once(block_ms=100)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_dashboard_pauses_and_resumes_a_running_checkpointed_job(
        settings: Settings, client: Client, stores: Stores) -> None:
    chromium = need_tool(CHROMIUM)  # skipped when missing (failed under FENCEPOST_TEST_REQUIRE_TOOLS=1)
    from playwright.async_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await stores.db.pool.execute(  # type: ignore[union-attr]
        "CREATE TABLE processed_items (op_key text NOT NULL, run_id bigint NOT NULL, attempt int NOT NULL)")
    token_row, secret = await create_token(client.stores.db, "operator", ["tq"], "dashboard-test", "test")
    app = create_app(settings, ApiConfig(token_cache_s=1))
    rid = await client.submit("t.items", 800, 25, settings.database_url, 0.01)

    async with _recording(stores), _worker(settings):
        with serve_in_thread(app) as base:
            async with dashboard_page(chromium, viewport={"width": 1280, "height": 900}) as page:
                await page.goto(f"{base}/")
                await page.fill("#token", "fp_wrong")
                await page.click("#login")
                await expect(page.locator("#login-error")).to_contain_text("revoked token")
                await page.fill("#token", secret)
                await page.click("#login")
                await expect(page.locator("#who")).to_contain_text("dashboard-test")
                await expect(page.locator("#queues-table")).to_contain_text("tq")
                await page.screenshot(path=str(ARTIFACTS / "dashboard-queues.png"), full_page=True)

                # the queue's dispatch view: tenants and concurrency limits (read-only)
                from fencepost.core import fairness

                await fairness.set_limit(stores, "tq", "export:acme", 2)
                await page.click("#queues-table a[href='#/dispatch/tq']")
                await expect(page.locator("#keys-table")).to_contain_text("export:acme")
                await expect(page.locator("#dispatch-summary")).to_contain_text("Priority aging")
                await page.screenshot(path=str(ARTIFACTS / "dashboard-dispatch.png"), full_page=True)

                # find the running checkpointed job in the runs list
                await page.click("a[href='#/runs']")
                await page.fill("#runs-filter input[name=queue]", "tq")
                await page.select_option("#runs-filter select[name=status]", "RUNNING")
                await page.click("#runs-filter button[type=submit]")
                row = page.locator(f"#runs-table tr[data-id='{rid}']")
                await expect(row.locator("[data-state=RUNNING]")).to_be_visible()
                await row.locator(f"a[href='#/run/{rid}']").click()

                status = page.locator("#run-status [data-state]")
                await expect(status).to_have_attribute("data-state", "RUNNING")
                await expect(page.locator("#processed")).to_be_visible()  # it has checkpointed
                await page.click("button[data-cmd=pause]")
                await page.fill("#confirm-reason", "dashboard: maintenance window")
                await page.screenshot(path=str(ARTIFACTS / "dashboard-confirm-pause.png"), full_page=True)
                await page.click("#confirm-ok")
                await expect(page.locator("#cmd-result")).to_contain_text(f"pause run {rid}: REQUESTED")
                await expect(status).to_have_attribute("data-state", "PAUSED")
                processed_at_pause = int(await page.locator("#processed").inner_text())
                assert 0 < processed_at_pause < 800 and processed_at_pause % 25 == 0
                await expect(page.locator("#events-table")).to_contain_text("dashboard: maintenance window")
                await page.screenshot(path=str(ARTIFACTS / "dashboard-paused.png"), full_page=True)

                await page.click("button[data-cmd=resume]")
                await page.fill("#confirm-reason", "dashboard: done")
                await page.click("#confirm-ok")
                await expect(page.locator("#cmd-result")).to_contain_text(f"resume run {rid}: PENDING")
                await expect(status).to_have_attribute("data-state", "SUCCEEDED", timeout=60_000)
                await expect(page.locator("#attempts-table tbody tr")).to_have_count(2)
                await page.screenshot(path=str(ARTIFACTS / "dashboard-run.png"), full_page=True)

                # only the commands its state takes: none for a SUCCEEDED run (issue 17: Pause was offered);
                # a refusal for a run that moved meanwhile is still shown (test_dashboard_operates_a_fleet)
                await expect(page.locator("#commands")).to_contain_text("No command applies to a SUCCEEDED run")
                await expect(page.locator("button[data-cmd]")).to_have_count(0)

                # a workflow drawn as a graph, and a schedule with its next fires
                from fencepost.core.schedules import ScheduleSpec
                from fencepost.workflows import Node

                wid = await client.submit_workflow([Node(name="extract", handler="t.echo", args=(1,)),
                                                    Node(name="load", handler="t.echo", args=(2,),
                                                         depends_on=("extract",))], name="etl")
                await Schedules(client).add(ScheduleSpec(name="nightly", handler="t.noop", cron="0 3 * * *"))
                await page.goto(f"{base}/ui/#/workflow/{wid}")
                await expect(page.locator("#workflow-graph rect")).to_have_count(2)
                await expect(page.locator("#workflow-graph")).to_contain_text("load")
                await page.screenshot(path=str(ARTIFACTS / "dashboard-workflow.png"), full_page=True)
                await page.click("a[href='#/schedules']")
                await expect(page.locator("#schedules-table")).to_contain_text("nightly")
                await expect(page.locator("#schedules-table")).to_contain_text("03:00:00Z")

    # the history names the token, its address and the reason
    events = await client.events(rid)
    paused = [e for e in events if e["type"] in ("pause_requested", "paused")]
    actor = f"token:{token_row['id']}@127.0.0.1"
    assert paused and all(e["actor"] == actor for e in paused if e["type"] == "pause_requested"), paused
    assert any(e["reason"] == "dashboard: maintenance window" for e in paused)
    resumed = [e for e in events if e["type"] == "resumed"]
    assert [(e["actor"], e["reason"]) for e in resumed] == [(actor, "dashboard: done")]
    rows = await stores.db.pool.fetchval("SELECT count(DISTINCT op_key) FROM processed_items WHERE run_id = $1", rid)  # type: ignore[union-attr]
    assert rows == 800


# -- the API the dashboard's views need (issue 17) ----------------------------------------------
async def test_runs_search_sort_page_and_count(settings: Settings, client: Client) -> None:
    """Issue 17: the runs list had no paging past 50, no search by id or argument, no sorting."""
    from fencepost.core.models import Submit
    from tests.test_api import Api, _make_api

    ids = await client.submit_many([Submit(handler="t.echo", args=(f"order-{i:03d}",), tenant="acme" if i % 2 else "",
                                           idempotency_key=f"k-{i}") for i in range(60)])
    big = await client.submit("t.echo", "x" * 70_000)
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        async def get(api: Api = api, **params: Any) -> tuple[list[int], dict[str, str]]:
            r = await api.req("GET", "/v1/runs", "op_tq", params={"queue": "tq", **params})
            assert r.status_code == 200, r.text
            return [x["id"] for x in r.json()], dict(r.headers)

        page2, h = await get(limit=50, offset=50, handler="t.echo")
        assert page2 == sorted([*ids, big], reverse=True)[50:] and h["x-total-count"] == "61"
        assert h["x-total-count-exact"] == "true"
        assert (await get(id=ids[7]))[0] == [ids[7]]
        assert (await get(arg="order-042"))[0] == [ids[42]]
        assert (await get(tenant="acme", limit=1000))[0] == sorted(ids[1::2], reverse=True)
        assert (await get(idempotency_key="k-3"))[0] == [ids[3]]
        assert (await get(sort="id", order="asc", limit=3))[0] == ids[:3]
        assert (await get(sort="created_at", order="desc", limit=1))[0] == [big]
        for bad, field in (({"sort": "payload"}, "sort"), ({"order": "up"}, "order"), ({"id": "x"}, "id"),
                           ({"arg": "a\x00"}, "arg"), ({"offset": "-1"}, "offset")):
            r = await api.req("GET", "/v1/runs", "op_tq", params=bad)
            assert r.status_code == 422 and r.json()["field"] == field, (bad, r.text)

        run = (await api.req("GET", f"/v1/runs/{ids[5]}", "op_tq")).json()
        assert run["args"] == ["order-005"] and run["kwargs"] == {} and run["tenant"] == "acme"
        assert run["idempotency_key"] == "k-5" and not run["arguments_truncated"]
        run = (await api.req("GET", f"/v1/runs/{big}", "op_tq")).json()
        assert run["args"] is None and run["arguments_truncated"] and run["arguments_bytes"] > 70_000
        assert run["arguments_preview"].startswith('[["xxx')


async def test_dashboard_operates_a_fleet(settings: Settings, client: Client, stores: Stores, tmp_path: Path) -> None:
    """Issue 17 in a browser against real stores and a real worker process: a filter typed across
    several refreshes stays (and lives in the URL), no literal "null", tracebacks collapsible, only
    valid commands, a bulk retry of exactly the filtered dead letter, a filtered cancel counted by the
    server first, a schedule created and run now, a worker asked to stop; no console errors."""
    chromium = need_tool(CHROMIUM)
    from playwright.async_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _, secret = await create_token(client.stores.db, "admin", [], "fleet-admin", "test")
    app = create_app(settings, ApiConfig(token_cache_s=1, rate_limit=0))
    bad = [await client.submit("t.err.invalid") for _ in range(3)]
    other = await client.submit("t.err.policy")
    parked = [await client.submit("t.noop", delay=3600) for _ in range(3)]
    log = tmp_path / "worker.log"
    proc = spawn(settings, *WORKER, log=log)
    errors: list[str] = []
    try:
        for rid in [*bad, other]:
            await wait_state(stores, rid, {"FAILED"}, log=log)
        async with _recording(stores):
            with serve_in_thread(app) as base:
                async with dashboard_page(chromium, viewport={"width": 1400, "height": 900}) as page:
                    # Chromium logs every 4xx as a console error: the refusal (409) of a run that moved is an answer
                    # the page expects (a bulk count is a 200 now); anything else (a script error, a missing asset,
                    # a 428) fails the test
                    expected = ("status of 409",)
                    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not any(
                        x in m.text for x in expected) else None)
                    page.on("pageerror", lambda e: errors.append(str(e)))
                    await log_in(page, base, secret, "fleet-admin")

                    async def renders() -> int:
                        return int(await page.evaluate("Number(document.body.dataset.renders || 0)"))

                    async def refreshes(n: int) -> None:
                        """Have the view rebuilt n more times (as a live event or the slow refresh rebuilds it)
                        and wait (bounded) for each."""
                        for _ in range(n):
                            goal = await renders() + 1
                            await page.evaluate("document.dispatchEvent(new Event('fencepost:refresh'))")

                            async def done(goal: int = goal) -> bool:
                                return await renders() >= goal

                            await wait_until(done, timeout=30, what="a refresh", interval=0.05)

                    # a filter typed across several refreshes is never reset, and lives in the URL
                    await page.click("a[href='#/runs']")
                    handler = page.locator("#runs-filter input[name=handler]")
                    await handler.type("t.err.", delay=150)
                    await refreshes(3)
                    await expect(handler).to_have_value("t.err.")
                    await expect(handler).to_be_focused()
                    await handler.type("invalid", delay=150)
                    await page.select_option("#runs-filter select[name=status]", "FAILED")
                    await refreshes(3)
                    await expect(handler).to_have_value("t.err.invalid")
                    await expect(page.locator("#runs-filter select[name=status]")).to_have_value("FAILED")
                    await expect(page.locator("#runs-table tbody tr")).to_have_count(3)
                    await expect(page.locator("#runs-count")).to_have_text("1–3 of 3")
                    assert "handler=t.err.invalid" in page.url and "status=FAILED" in page.url
                    await page.reload()
                    await expect(page.locator("#runs-filter input[name=handler]")).to_have_value("t.err.invalid")
                    await expect(page.locator("#runs-table tbody tr")).to_have_count(3)
                    await page.screenshot(path=str(ARTIFACTS / "dashboard-runs-filtered.png"), full_page=True)

                    # the run page: no "null", arguments, the traceback collapsible, only valid commands
                    await page.goto(f"{base}/ui/#/run/{bad[0]}")
                    await expect(page.locator("#run-status [data-state]")).to_have_attribute("data-state", "FAILED")
                    assert "null" not in await page.locator("#view").inner_text()
                    await expect(page.locator("#run-args")).to_contain_text('"args": []')
                    cmds = page.locator("#commands button[data-cmd]")
                    await expect(cmds).to_have_count(2)
                    assert sorted(await cmds.evaluate_all("bs => bs.map(b => b.dataset.cmd)")) == ["restart", "retry"]
                    tb = page.locator("#attempts-table details")
                    await expect(tb.locator("summary")).to_contain_text("amount must be positive")
                    await expect(tb.locator("pre")).to_be_hidden()
                    await tb.locator("summary").click()
                    await expect(tb.locator("pre")).to_contain_text("Traceback")
                    await refreshes(2)
                    await expect(tb.locator("pre")).to_be_visible()  # stays open across refreshes
                    await page.screenshot(path=str(ARTIFACTS / "dashboard-run-failed.png"), full_page=True)
                    # a refusal for a run that moved while the dialog was open is shown
                    await page.goto(f"{base}/ui/#/run/{parked[0]}")
                    await page.click("button[data-cmd=cancel]")
                    await client.cancel(parked[0], reason="someone else was quicker")
                    await page.click("#confirm-ok")
                    await expect(page.locator("#cmd-result")).to_contain_text(f"cancel run {parked[0]} refused")

                    # bulk retry of exactly the filtered dead letter (not the other handler's run)
                    await page.goto(f"{base}/ui/#/dead-letter?handler=t.err.invalid")
                    await expect(page.locator("#dead-table tbody tr")).to_have_count(3)
                    await page.click("#retry-all")
                    await expect(page.locator("#confirm-title")).to_have_text("Retry 3 runs?")
                    await page.fill("#confirm-reason", "fixed the validation bug")
                    await page.screenshot(path=str(ARTIFACTS / "dashboard-bulk-confirm.png"), full_page=True)
                    await page.click("#confirm-ok")
                    await expect(page.locator("#bulk-result")).to_have_text("retry: 3 of 3 done")

                    # a filtered set counted by the server (428) before confirming, then cancelled
                    await page.goto(f"{base}/ui/#/runs?queue=tq&status=PENDING&handler=t.noop")
                    await page.click("button[data-bulk=cancel]")
                    await expect(page.locator("#confirm-title")).to_have_text("Cancel 2 runs?")
                    await page.click("#confirm-ok")
                    await expect(page.locator("#bulk-result")).to_have_text("cancel: 2 of 2 done")

                    # a schedule created and run now
                    await page.click("a[href='#/schedules']")
                    await page.fill("#schedule-form input[name=name]", "hourly-report")
                    await page.fill("#schedule-form input[name=handler]", "t.echo")
                    await page.fill("#schedule-form input[name=cron]", "0 * * * *")
                    await page.fill("#schedule-form input[name=args]", '["report"]')
                    await page.click("#schedule-form button[type=submit]")
                    await page.click("#confirm-ok")
                    await expect(page.locator("#schedules-table")).to_contain_text("hourly-report")
                    await page.click("button[data-schedule=hourly-report][data-action=run-now]")
                    await page.click("#confirm-ok")
                    await expect(page.locator("#cmd-result")).to_contain_text("hourly-report fired: run ")
                    fired = int((await page.locator("#cmd-result").inner_text()).rsplit(" ", 1)[1])
                    await wait_state(stores, fired, {"SUCCEEDED"}, log=log)
                    await page.screenshot(path=str(ARTIFACTS / "dashboard-schedules.png"), full_page=True)

                    # the schedule's page: its last fires with their runs' outcomes; edited in place (a new cron
                    # line, then an interval instead), each time with the new next fires shown
                    await page.click("#schedules-table a[data-action=edit][data-schedule=hourly-report]")
                    fires = page.locator("#schedule-runs-table")
                    await expect(fires.locator(f"tr[data-id='{fired}'] [data-state=SUCCEEDED]")).to_be_visible()
                    await expect(page.locator("#next-fires time")).to_have_count(5)
                    await expect(page.locator("#next-fires time").first).to_have_attribute("datetime", re.compile(":00:00"))
                    edit = page.locator("#schedule-edit")
                    await expect(edit.locator("input[name=cron]")).to_have_value("0 * * * *")
                    await expect(edit.locator("input[name=args]")).to_have_value('["report"]')
                    await edit.locator("input[name=cron]").fill("30 2 * * *")
                    await refreshes(2)  # what the operator typed survives the poll
                    await expect(edit.locator("input[name=cron]")).to_have_value("30 2 * * *")
                    await edit.locator("button[type=submit]").click()
                    await expect(page.locator("#confirm-text")).to_contain_text(
                        "timing: cron 0 * * * * → cron 30 2 * * *")
                    await page.fill("#confirm-reason", "the report at night")
                    await page.click("#confirm-ok")
                    await expect(page.locator("#cmd-result")).to_contain_text("updated hourly-report: next fire ")
                    await expect(page.locator("#cmd-result")).to_contain_text("02:30:00Z")
                    await expect(page.locator("[data-field=cron]")).to_have_text("30 2 * * *")
                    await expect(page.locator("#next-fires time")).to_have_count(5)
                    assert all(t.endswith(" 02:30:00Z") for t in await page.locator("#next-fires time").all_inner_texts())
                    await expect(edit.locator("input[name=cron]")).to_have_value("30 2 * * *")
                    await page.screenshot(path=str(ARTIFACTS / "dashboard-schedule-edit.png"), full_page=True)
                    await edit.locator("input[name=cron]").fill("")
                    await edit.locator("input[name=interval_s]").fill("45")
                    await edit.locator("button[type=submit]").click()
                    await expect(page.locator("#confirm-text")).to_contain_text("cron 30 2 * * * → every 45 s")
                    await page.fill("#confirm-reason", "every 45 s")
                    await page.click("#confirm-ok")
                    await expect(page.locator("[data-field=interval_s]")).to_have_text("45")
                    await expect(page.locator("[data-field=cron]")).to_have_count(0)
                    times = await page.locator("#next-fires time").evaluate_all(
                        "ts => ts.map(t => Date.parse(t.getAttribute('datetime')))")
                    assert [b - a for a, b in itertools.pairwise(times)] == [45_000] * 4, times
                    await edit.locator("button[type=submit]").click()  # nothing changed: nothing sent
                    await expect(page.locator("#cmd-result")).to_have_text("edit hourly-report: nothing changed")

                    # charts from the rollup: what the worker did so far, per minute
                    await page.click("a[href='#/charts']")
                    await page.click("nav a[href='#/charts?queue=tq&window=1h']")
                    await expect(page.locator("#chart-throughput polyline[data-series=started]")).to_have_count(1)
                    await expect(page.locator("figure.chart").first).to_contain_text("failed (")
                    await expect(page.locator("#chart-runtime circle").first).to_be_attached()
                    await page.screenshot(path=str(ARTIFACTS / "dashboard-charts.png"), full_page=True)

                    # fleet events, live from the event stream, and the audit log
                    asked: list[str] = []
                    page.on("request", lambda r: asked.append(r.url))
                    await page.click("a[href='#/events']")
                    await expect(page.locator("#events-live")).to_have_attribute("data-live", "stream")
                    await expect(page.locator("#audit-table")).to_contain_text("fixed the validation bug")
                    await page.screenshot(path=str(ARTIFACTS / "dashboard-events.png"), full_page=True)
                    await refreshes(1)
                    listed = [u for u in asked if "/v1/events?" in u]  # the first render's, and once when ready
                    await refreshes(2)
                    assert [u for u in asked if "/v1/events?" in u] == listed, "no list fetched every 2 s"
                    fresh = await client.submit("t.noop", delay=3600)  # its `submitted` event: straight to PostgreSQL
                    await expect(page.locator(f"#fleet-events-table a[href='#/run/{fresh}']")).to_be_visible()
                    assert [u for u in asked if "/v1/events?" in u] == listed, "it came by the stream"
                    await page.fill("#events-filter input[name=type]", "cancelled")  # a filter: the same stream
                    await expect(page.locator("#fleet-events-table tbody tr").first).to_contain_text("cancelled")
                    await expect(page.locator("#events-live")).to_have_attribute("data-live", "stream")
                    await client.cancel(fresh, reason="live")
                    await expect(page.locator(f"#fleet-events-table a[href='#/run/{fresh}']")).to_be_visible()
                    assert not [u for u in asked if "/v1/events/stream" in u], "one stream per tab, opened at login"

                    # the worker, live, asked to drain and stop
                    await page.click("a[href='#/workers']")
                    row = page.locator("#workers-table tbody tr")
                    await expect(row).to_have_count(1)
                    await expect(row).to_contain_text(str(proc.pid))
                    await page.screenshot(path=str(ARTIFACTS / "dashboard-workers.png"), full_page=True)
                    await page.click("button[data-stop-worker]")
                    await page.fill("#confirm-reason", "scale down")
                    await page.click("#confirm-ok")
                    await expect(page.locator("#cmd-result")).to_contain_text("it drains at its next heartbeat")
                    await expect(page.locator("#workers-table")).to_contain_text("(none)", timeout=40_000)

        async def exited() -> bool:
            return proc.poll() is not None

        await wait_until(exited, timeout=40, what="the worker to exit")
        assert proc.returncode == 0, log_tail(log)
    finally:
        _kill(proc)
    assert not errors, errors
    retried = [e for rid in bad[1:] for e in await client.events(rid) if e["type"] == "retried"]
    assert len(retried) == 2 and {e["reason"] for e in retried} == {"fixed the validation bug"}
    assert not [e for e in await client.events(other) if e["type"] == "retried"]
    assert {(await client.get(r))["status"] for r in parked} == {"CANCELLED"}
    edited = await Schedules(client).get("hourly-report")
    assert (edited["cron"], edited["interval_s"]) == (None, 45)
    audit = await client.stores.db.fetch("audit_list", None, None, None, None, 100, None, None)
    assert [a["reason"] for a in audit if a["action"] == "schedule_updated"] == ["every 45 s", "the report at night"]


async def test_events_view_polls_when_the_stream_is_unavailable(settings: Settings, client: Client) -> None:
    """The live view's fallback: with GET /v1/events/stream refused (an older API, a proxy that buffers
    or cuts streams), the events view says so and refreshes by the 2 s poll; new events still appear."""
    chromium = need_tool(CHROMIUM)
    from playwright.async_api import Route, expect

    _, secret = await create_token(client.stores.db, "operator", [], "poll-op", "test")
    app = create_app(settings, ApiConfig(token_cache_s=1, rate_limit=0))
    errors: list[str] = []
    with serve_in_thread(app) as base:
        async with dashboard_page(chromium) as page:
            page.on("pageerror", lambda e: errors.append(str(e)))

            async def refuse(route: Route) -> None:
                await route.fulfill(status=503, content_type="application/problem+json", body="{}")

            await page.route("**/v1/events/stream*", refuse)
            await log_in(page, base, secret)
            await page.click("a[href='#/events']")
            live = page.locator("#events-live")
            await expect(live).to_have_attribute("data-live", "poll")
            await expect(live).to_contain_text("live stream: HTTP 503")
            rid = await client.submit("t.noop", delay=3600)
            await expect(page.locator(f"#fleet-events-table a[href='#/run/{rid}']")).to_be_visible()
    assert not errors, errors


async def test_charts_come_from_a_rollup_counted_once(settings: Settings, client: Client, stores: Stores) -> None:
    """Issue 17: per-queue and fleet charts from a per-minute rollup the recorder keeps in the batch
    transaction (a replayed batch is not counted twice); scoped tokens see only their queues."""
    from fencepost.reconciler.recorder import Recorder
    from tests.conftest import record_all
    from tests.test_api import _make_api

    ok = [await client.submit("t.echo", i) for i in range(3)]
    bad = await client.submit("t.err.invalid")
    flaky = await client.submit("t.err.transient")  # two retries, then FAILED
    async with _worker(settings):
        for rid in [*ok, bad, flaky]:
            await client.wait(rid, timeout=30)
    raw = await stores.redis.xrange(stores.keys("tq").events)
    entries = [(stores.keys("tq").events, eid, fields) for eid, fields in raw]
    await record_all(stores)
    await Recorder(stores, consumer="replay")._record(entries)  # a batch delivered twice: counted once

    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        for path, who in (("/v1/queues/tq/stats", "op_tq"), ("/v1/stats", "admin")):
            r = await api.req("GET", path, who, params={"window": "1h"})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["window"] == "1h" and body["step_s"] == 60 and 60 <= len(body["points"]) <= 61
            total = {k: sum(p[k] for p in body["points"]) for k in ("started", "succeeded", "failed", "retried")}
            assert total == {"started": 7, "succeeded": 3, "failed": 2, "retried": 2}, (path, total)
            busy = [p for p in body["points"] if p["started"]]
            assert busy and all(p["lag_p50_ms"] is not None and p["lag_p95_ms"] >= p["lag_p50_ms"] for p in busy)
            assert any(p["run_p95_ms"] is not None for p in body["points"] if p["succeeded"] or p["failed"])
        fleet_of_other = (await api.req("GET", "/v1/stats", "op_other", params={"window": "24h"})).json()
        assert fleet_of_other["step_s"] == 900 and not any(p["started"] for p in fleet_of_other["points"])
        r = await api.req("GET", "/v1/stats", "admin", params={"window": "1y"})
        assert r.status_code == 422 and r.json()["field"] == "window"
        assert (await api.req("GET", "/v1/queues/tq/stats", "producer")).status_code == 403
