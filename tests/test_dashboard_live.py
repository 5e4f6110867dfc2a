"""The dashboard of issue 24 in headless Chromium against a real API, real Redis / PostgreSQL, the
recorder and a real worker: live from one event stream per tab (no 1 + N polling; the run page asks
for its events after a cursor), Back / Forward keep box, URL and list together, the dead letter paged
with a bulk bar acting server-side in one request, job text rendered as written (bidi controls
neutralised, errors once and wrapped, overdue runs labelled so, every filter labelled, no console
errors), and what Sidekiq Web / Oban Web offer: delete, retries and scheduled lists with run now,
per-handler charts, workers and busy slots per queue, a queue's concurrency changed from the page, a
batches view. Screenshots go to tests/artifacts/ (docs/screenshots/ holds copies).

FENCEPOST_DASHBOARD_STATIC=<dir> serves another build of the dashboard's files (to show that a test
fails on the files before the change)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import fencepost.api.app as app_module
from fencepost.api import ApiConfig, create_app
from fencepost.api.auth import create_token
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit
from fencepost.core.schedules import ScheduleSpec
from fencepost.core.stores import Stores
from fencepost.schedules import Schedules
from tests.conftest import need_tool, record_all, run_state, wait_state, wait_until
from tests.test_api import serve_in_thread
from tests.test_control import _worker
from tests.test_dashboard import ARTIFACTS, CHROMIUM, _recording, dashboard_page, log_in

pytestmark = pytest.mark.slow

if os.environ.get("FENCEPOST_DASHBOARD_STATIC"):
    app_module.STATIC_DIR = Path(os.environ["FENCEPOST_DASHBOARD_STATIC"])


def _app(settings: Settings, **config: Any) -> Any:
    return create_app(settings, ApiConfig(**{"token_cache_s": 1, "rate_limit": 0, **config}))


@contextlib.asynccontextmanager
async def _watched(page: Any) -> AsyncIterator[dict[str, list[Any]]]:
    """Every request the page makes, every response status and every console error or page error."""
    seen: dict[str, list[Any]] = {"requests": [], "statuses": [], "errors": []}
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.on("response", lambda r: seen["statuses"].append((r.status, r.url)))
    page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    yield seen


async def _renders(page: Any) -> int:
    return int(await page.evaluate("Number(document.body.dataset.renders || 0)"))


async def test_views_are_live_from_one_stream_without_polling_each_row(
        settings: Settings, client: Client, stores: Stores) -> None:
    """Issue 24 item 8: the schedules view made 1 + N requests every 2 s (51 schedules: 1,877 requests in
    75 s, then 429 for every tab of the token); the run page downloaded every event every 2 s."""
    chromium = need_tool(CHROMIUM)
    from playwright.async_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    store = Schedules(client)
    for i in range(51):
        await store.add(ScheduleSpec(name=f"report-{i:02d}", handler="t.noop", cron=f"{i % 60} 3 * * *"))
    _, secret = await create_token(client.stores.db, "operator", [], "live-op", "test")
    app = _app(settings, rate_limit=120)  # 120 requests a minute: what the old view used up in 5 s
    async with _recording(stores), _worker(settings):
        with serve_in_thread(app) as base:
            async with dashboard_page(chromium, viewport={"width": 1280, "height": 900}) as page, _watched(page) as seen:
                await log_in(page, base, secret, "live-op")
                await page.click("a[href='#/schedules']")
                await expect(page.locator("#schedules-table tbody tr")).to_have_count(51)
                await page.screenshot(path=str(ARTIFACTS / "dashboard-schedules-live.png"), full_page=True)
                first, before = len(seen["requests"]), await _renders(page)
                loop = asyncio.get_running_loop()
                ends = loop.time() + 12
                while loop.time() < ends:  # the fleet is busy meanwhile: events keep coming down the stream
                    await client.wait(await client.submit("t.noop"), timeout=30)
                    await asyncio.sleep(0.5)
                asked = seen["requests"][first:]
                assert len(asked) < 10, asked  # before: 52 every 2 s, 312 in 12 s
                assert await _renders(page) > before + 1, "the view was rebuilt as events came"
                assert not [s for s in seen["statuses"] if s[0] == 429], "never throttled"
                assert sum("/v1/events/stream" in u for u in seen["requests"]) == 1, "one stream for the tab"
                assert not [u for u in asked if re.search(r"/v1/schedules/[^/?]+/next", u)]

                # the run page: its events after a cursor, as they are recorded
                rid = await client.submit("t.noop", queue="idle", delay=3600)  # a queue nobody serves: it waits
                await page.goto(f"{base}/ui/#/run/{rid}")
                await expect(page.locator("#events-table")).to_contain_text("submitted")
                mark = len(seen["requests"])
                for n in range(3):
                    await client.pause(rid, reason=f"pause {n}")
                    await expect(page.locator("#events-table")).to_contain_text(f"pause {n}")
                    await client.resume(rid, reason=f"resume {n}")
                    await expect(page.locator("#events-table")).to_contain_text(f"resume {n}")
                await expect(page.locator("#events-table tbody tr")).to_have_count(7)
                runs = seen["requests"][mark:]
                assert not [u for u in runs if u.endswith(f"/v1/runs/{rid}/events")], "never the whole history"
                looks = [u for u in runs if f"/v1/runs/{rid}/timeline" in u]
                cursors = [int(m.group(1)) for u in looks if (m := re.search(r"after=(\d+)", u))]
                assert looks and len(cursors) == len(looks), looks  # every look after the page's cursor
                assert cursors == sorted(cursors), cursors
    assert not seen["errors"], seen["errors"]


async def test_back_and_forward_keep_the_filter_box_the_url_and_the_list_together(
        settings: Settings, client: Client) -> None:
    """Issue 24 item 9: typing payments, then emails, then Back: the URL and list said payments, the box
    emails; the bulk bar acted on the URL's filter, not on what the box showed."""
    chromium = need_tool(CHROMIUM)
    from playwright.async_api import expect

    pay = [await client.submit("t.noop", queue="payments", delay=3600) for _ in range(2)]
    mail = [await client.submit("t.noop", queue="emails", delay=3600) for _ in range(3)]
    _, secret = await create_token(client.stores.db, "admin", [], "back-admin", "test")
    async with _worker(settings):
        with serve_in_thread(_app(settings)) as base:
            async with dashboard_page(chromium, viewport={"width": 1280, "height": 900}) as page, _watched(page) as seen:
                await log_in(page, base, secret, "back-admin")
                await page.click("a[href='#/runs']")
                box = page.locator("#runs-filter input[name=queue]")
                rows = page.locator("#runs-table tbody tr[data-id]")
                await box.fill("payments")
                await page.wait_for_url(re.compile(r"queue=payments"))
                await expect(rows).to_have_count(len(pay))
                await box.fill("emails")
                await page.wait_for_url(re.compile(r"queue=emails"))
                await expect(rows).to_have_count(len(mail))
                await page.go_back()
                await page.wait_for_url(re.compile(r"queue=payments"))
                await expect(box).to_have_value("payments")
                await expect(rows).to_have_count(len(pay))
                assert {int(i) for i in await rows.evaluate_all("rs => rs.map(r => r.dataset.id)")} == set(pay)
                await page.go_forward()
                await page.wait_for_url(re.compile(r"queue=emails"))
                await expect(box).to_have_value("emails")
                await expect(rows).to_have_count(len(mail))
                await page.go_back()
                await expect(box).to_have_value("payments")
                # typed but not applied yet (the filter waits for a pause): the bulk bar acts on the box
                await box.fill("emails")
                await page.click("button[data-bulk=cancel]")
                await expect(page.locator("#confirm-title")).to_have_text(f"Cancel {len(mail)} runs?")
                await expect(page.locator("#confirm-text")).to_contain_text("queue emails")
                assert "queue=emails" in page.url
                await page.fill("#confirm-reason", "the box said emails")
                await page.click("#confirm-ok")
                await expect(page.locator("#bulk-result")).to_have_text(f"cancel: {len(mail)} of {len(mail)} done")
    assert not seen["errors"], seen["errors"]
    assert [await run_state(client.stores, r, "payments") for r in pay] == ["PENDING"] * len(pay)
    assert [await run_state(client.stores, r, "emails") for r in mail] == ["CANCELLED"] * len(mail)


async def test_dead_letter_pages_and_retries_everything_shown_in_one_request(
        settings: Settings, client: Client, stores: Stores) -> None:
    """Issue 24 item 10: checkboxes with no action bar, no paging past 1,000 rows, and "retry all" a loop
    of per-run POSTs from the browser; item 3: newer failures in another queue hid a scoped operator's own
    dead letter (the limit came before the scope)."""
    chromium = need_tool(CHROMIUM)
    from playwright.async_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dead = await client.submit_many([Submit(handler="t.err.invalid") for _ in range(60)])
    async with _worker(settings, concurrency=8):
        for rid in dead:
            await wait_state(stores, rid, {"FAILED"})
    elsewhere = await client.submit_many([Submit(handler="t.err.invalid", queue="other") for _ in range(70)])
    async with _worker(settings, queues=["other"], concurrency=8):  # newer failures, outside the token's scope
        for rid in elsewhere:
            await client.wait(rid, timeout=30)
    _, secret = await create_token(client.stores.db, "operator", ["tq"], "dlq-op", "test")
    async with _recording(stores):
        async def recorded() -> bool:
            return await client.stores.db.pool.fetchval(  # type: ignore[union-attr]
                "SELECT count(*) FROM runs WHERE status = 'FAILED'") == len(dead) + len(elsewhere)

        await wait_until(recorded, timeout=30, what="the failures recorded")
        with serve_in_thread(_app(settings)) as base:
            async with dashboard_page(chromium, viewport={"width": 1280, "height": 900}) as page, _watched(page) as seen:
                await log_in(page, base, secret, "dlq-op")
                await page.click("a[href='#/dead-letter']")
                rows = page.locator("#dead-table tbody tr[data-id]")
                await expect(rows).to_have_count(50)
                first_page = set(await rows.evaluate_all("rs => rs.map(r => r.dataset.id)"))
                await page.click("#next-page")
                await expect(rows).to_have_count(10)
                second = set(await rows.evaluate_all("rs => rs.map(r => r.dataset.id)"))
                assert first_page.isdisjoint(second) and {int(i) for i in first_page | second} == set(dead)
                await page.click("#first-page")
                await expect(rows).to_have_count(50)
                # a bulk bar over the ticked rows
                for rid in list(first_page)[:2]:
                    await page.check(f"#dead-table input[data-select='{rid}']")
                await expect(page.locator("#selection")).to_contain_text("2 selected")
                await page.screenshot(path=str(ARTIFACTS / "dashboard-dead-letter.png"), full_page=True)
                mark = len(seen["requests"])
                await page.click("#retry-all")
                await expect(page.locator("#confirm-title")).to_have_text("Retry 60 runs?")
                await page.fill("#confirm-reason", "the bug is fixed")
                await page.screenshot(path=str(ARTIFACTS / "dashboard-bulk-confirm.png"), full_page=True)
                await page.click("#confirm-ok")
                await expect(page.locator("#bulk-result")).to_have_text("retry: 60 of 60 done")
                posts = [u for u in seen["requests"][mark:] if "/v1/ops/bulk" in u or re.search(r"/v1/runs/\d+/retry", u)]
                assert [u.rsplit("/v1/", 1)[1] for u in posts] == ["ops/bulk/count", "ops/bulk"], posts
                await page.click("a[href='#/review']")
                await expect(page.locator("#list-bulk button[data-list-bulk=retry]")).to_be_visible()
    assert not seen["errors"], seen["errors"]
    assert {await run_state(stores, r) for r in dead} == {"PENDING"}
    audit = await client.stores.db.fetch("audit_list", None, None, None, None, 1000, None, None)
    row = next(a for a in audit if a["action"] == "bulk_retry")
    assert row["reason"] == "the bug is fixed" and sorted(json.loads(row["data"])["ids"]) == sorted(dead)


async def test_job_text_renders_as_written_errors_once_and_wrapped_overdue_labelled(
        settings: Settings, client: Client, stores: Stores) -> None:
    """Issue 24 item 11: a U+202E in an error rendered reversed ("evil" showed as "live"); a failed run's
    error text appeared four times and the page was 1,735 px wide; overdue runs of a queue with no workers
    were "Delayed"; filters were labelled by placeholders only; a bulk count (428) was a console error."""
    chromium = need_tool(CHROMIUM)
    from playwright.async_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    evil = await client.submit("t.err.invalid")
    wide = await client.submit("t.err.mapped", "x" * 3000)
    async with _worker(settings):
        for rid in (evil, wide):
            await wait_state(stores, rid, {"FAILED"})
    late = await client.submit("t.noop", queue="idle", delay=0.2)  # a queue nobody serves
    _, secret = await create_token(client.stores.db, "admin", [], "render-admin", "test")
    async with _recording(stores):
        async def recorded() -> bool:
            return {(await client.get(r))["status"] for r in (evil, wide)} == {"FAILED"}

        await wait_until(recorded, timeout=30, what="the failures recorded")
        # a worker's error text with a right-to-left override in it, as the attempt row stores it (Python's
        # repr escapes it in a KeyError; a handler's own message carries it as it is)
        message = "amount must be positive: \u202eevil"
        await client.stores.db.pool.execute(  # type: ignore[union-attr]
            "UPDATE attempts SET error_message = $2 WHERE run_id = $1", evil, message)
        await client.stores.db.pool.execute(  # type: ignore[union-attr]
            "UPDATE runs SET last_error = $2 WHERE id = $1", evil, message)
        await client.stores.redis.hset(stores.keys("tq").run(evil), "error", message)
        with serve_in_thread(_app(settings)) as base:
            async with dashboard_page(chromium, viewport={"width": 1280, "height": 900}) as page, _watched(page) as seen:
                await log_in(page, base, secret, "render-admin")
                for rid in (evil, wide):
                    await page.goto(f"{base}/ui/#/run/{rid}")
                    await expect(page.locator("#view h1")).to_have_text(f"Run {rid}")
                    await expect(page.locator("#run-status [data-state]")).to_have_attribute("data-state", "FAILED")
                    await expect(page.locator("#events-table")).to_contain_text("failed")
                    width = await page.evaluate("document.documentElement.scrollWidth")
                    assert width <= 1280, f"the page is {width} px wide"
                text = await page.locator("#view").text_content()
                assert text.count("'" + "x" * 3000 + "'") == 1, "the error text shown once"
                await page.goto(f"{base}/ui/#/run/{evil}")
                await expect(page.locator("#view h1")).to_have_text(f"Run {evil}")
                await expect(page.locator("#attempts-table")).to_contain_text("⟨U+202E⟩evil")
                text = await page.locator("#view").inner_text()
                assert "\u202e" not in text and text.count("evil") == 1, text
                assert await page.locator("#attempts-table bdi[dir=ltr]").count() > 0
                await page.screenshot(path=str(ARTIFACTS / "dashboard-run-failed.png"), full_page=True)

                await page.click("a[href='#/queues']")
                idle = page.locator("#queues-table tr[data-id='']").filter(has_text="idle")
                await expect(page.locator("#queues-table th", has_text="Overdue")).to_be_visible()
                assert not await page.locator("#queues-table th", has_text="Delayed").count()
                await expect(idle.locator("[data-overdue]")).to_have_text("1", timeout=15_000)
                await expect(idle.locator("[data-workers]")).to_have_text("no workers")
                assert await run_state(stores, late, "idle") == "PENDING"
                await page.screenshot(path=str(ARTIFACTS / "dashboard-queues.png"), full_page=True)

                # every filter field has its own <label for>, on every view with a filter
                for view in ("runs", "dead-letter", "review", "retries", "scheduled", "events"):
                    await page.goto(f"{base}/ui/#/{view}")
                    form = page.locator("form.filters[role=search]")
                    await expect(form).to_have_count(1)
                    unlabelled = await form.evaluate("""f => [...f.querySelectorAll('input, select')]
                        .filter(i => !i.id || !f.querySelector(`label[for="${i.id}"]`)).map(i => i.name)""")
                    assert unlabelled == [], (view, unlabelled)
                # a bulk count is an ordinary answer: no console error for it
                await page.goto(f"{base}/ui/#/dead-letter")
                await page.click("#retry-all")
                await expect(page.locator("#confirm-title")).to_have_text("Retry 2 runs?")
                await page.click("#confirm-cancel")
    assert not seen["errors"], seen["errors"]


async def test_operators_get_what_sidekiq_and_oban_web_offer(settings: Settings, client: Client, stores: Stores) -> None:
    """Issue 24 "What to build": delete of runs (confirmed, audited), retries waiting and scheduled runs
    as their own lists with run now, per-handler charts, workers and busy slots per queue, a queue's
    concurrency changed from the page (audited), a batches view."""
    chromium = need_tool(CHROMIUM)
    from playwright.async_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        await client.submit("t.echo", i)
    gone = await client.submit("t.err.invalid")
    batch = await client.submit_batch([Submit(handler="t.echo", args=(i,)) for i in range(3)],
                                      on_complete=Submit(handler="t.noop"), name="nightly-export")
    async with _worker(settings):
        await wait_state(stores, gone, {"FAILED"})
        for rid in batch.run_ids:
            await wait_state(stores, rid, {"SUCCEEDED"})
    later = await client.submit("t.noop", delay=3600)
    flaky = await client.submit("t.err.rate_limited", 3600)  # RETRY_WAIT for an hour after its first attempt
    _, secret = await create_token(client.stores.db, "admin", [], "parity-admin", "test")
    async with _recording(stores), _worker(settings) as worker:
        await wait_state(stores, flaky, {"RETRY_WAIT"})
        with serve_in_thread(_app(settings)) as base:
            async with dashboard_page(chromium, viewport={"width": 1400, "height": 900}) as page, _watched(page) as seen:
                await log_in(page, base, secret, "parity-admin")
                # workers serving each queue with their busy slots; the queue's concurrency, changed here
                tq = page.locator("#queues-table tr").filter(has=page.locator("a[href='#/runs?queue=tq']"))
                await expect(tq.locator("[data-workers]")).to_contain_text(f"{worker.opts.concurrency}")
                await expect(tq.locator("[data-workers]")).to_contain_text(f"{worker.id} 0/{worker.opts.concurrency}")
                await expect(tq.locator("[data-latency]")).to_have_text(re.compile(r"^\d+\.\ds$"))
                await page.fill("#conc-tq", "3")
                await page.click("button[data-concurrency=tq]")
                await expect(page.locator("#confirm-title")).to_have_text("Change the concurrency of tq?")
                await page.fill("#confirm-reason", "the database is small")
                await page.click("#confirm-ok")
                await expect(page.locator("#queues-result")).to_have_text("concurrency of tq: 3")
                await expect(tq.locator("[data-max-running=tq]")).to_have_text("3")
                await page.screenshot(path=str(ARTIFACTS / "dashboard-queues-workers.png"), full_page=True)

                # scheduled runs and retries waiting: their own lists, with run now
                await page.click("a[href='#/scheduled']")
                await expect(page.locator(f"#scheduled-table tr[data-id='{later}']")).to_be_visible()
                await page.screenshot(path=str(ARTIFACTS / "dashboard-scheduled.png"), full_page=True)
                await page.click(f"#scheduled-table tr[data-id='{later}'] button[data-row-action=run_now]")
                await expect(page.locator("#confirm-title")).to_have_text("Run now 1 runs?")
                await page.click("#confirm-ok")
                await expect(page.locator("#bulk-result")).to_have_text("run_now: 1 of 1 done")
                await wait_state(stores, later, {"SUCCEEDED"})
                await page.click("a[href='#/retries']")
                await expect(page.locator(f"#retries-table tr[data-id='{flaky}']")).to_contain_text("t.err.rate_limited")
                await page.screenshot(path=str(ARTIFACTS / "dashboard-retries.png"), full_page=True)
                await page.click("#list-bulk button[data-list-bulk=run_now]")
                await expect(page.locator("#confirm-title")).to_have_text("Run now 1 runs?")
                await page.click("#confirm-ok")
                await expect(page.locator("#bulk-result")).to_have_text("run_now: 1 of 1 done")
                await wait_state(stores, flaky, {"SUCCEEDED"})  # its second attempt, now instead of in an hour

                # delete: counted, confirmed, audited; the run leaves the lists, its history stays
                await page.goto(f"{base}/ui/#/dead-letter?handler=t.err.invalid")
                await expect(page.locator("#dead-table tbody tr[data-id]")).to_have_count(1)
                await expect(page.locator(f"#dead-table tr[data-id='{gone}']")).to_be_visible()
                await page.click("#list-bulk button[data-list-bulk=delete]")
                await expect(page.locator("#confirm-text")).to_contain_text("their history stays")
                await page.fill("#confirm-reason", "known bad input")
                await page.click("#confirm-ok")
                await expect(page.locator("#bulk-result")).to_contain_text("delete: 1 of 1 done")
                await expect(page.locator(f"#dead-table tr[data-id='{gone}']")).to_have_count(0)
                await page.goto(f"{base}/ui/#/run/{gone}")
                await expect(page.locator("#run-status [data-state]")).to_have_attribute("data-state", "FAILED")

                # per-handler charts beside the per-queue ones
                await page.goto(f"{base}/ui/#/charts?window=1h")
                await expect(page.locator("#handlers-table a[data-handler='t.echo']")).to_be_visible()
                await page.click("#handlers-table a[data-handler='t.echo']")
                await expect(page.locator("#chart-handler-throughput polyline[data-series=started]")).to_have_count(1)
                await expect(page.locator("#chart-handler-errors")).to_be_attached()
                await expect(page.locator("#chart-handler-runtime circle").first).to_be_attached()
                await page.screenshot(path=str(ARTIFACTS / "dashboard-handler-charts.png"), full_page=True)

                # batches
                await page.click("a[href='#/batches']")
                row = page.locator("#batches-table tbody tr").filter(has_text="nightly-export")
                await expect(row).to_contain_text("3")
                await page.screenshot(path=str(ARTIFACTS / "dashboard-batches.png"), full_page=True)
                await row.locator("a").first.click()
                await expect(page.locator("#batch-counts [data-count=SUCCEEDED]")).to_have_text("3")
    assert not seen["errors"], seen["errors"]
    audit = await client.stores.db.fetch("audit_list", None, None, None, None, 1000, None, None)
    actions = {a["action"]: a for a in audit}
    assert "bulk_delete" in actions and actions["bulk_delete"]["reason"] == "known bad input"
    assert any(a["reason"] == "the database is small" for a in audit), [a["action"] for a in audit]
    assert "bulk_run_now" in actions
    await record_all(stores)
    for rid in (later, flaky):  # run now is one transition: one run_now event, no pause and resume
        types = [e.type for e in await client.events(rid)]
        assert types.count("run_now") == 1 and "paused" not in types and "resumed" not in types, types


async def test_review_page_resolves_in_bulk_on_the_server(settings: Settings, client: Client, stores: Stores) -> None:
    """The review page's action bar: the rows ticked resolved as failed, then everything that matches
    resolved as succeeded, each one count and one confirm (no POST per run from the browser), audited;
    the rows leave the review queue."""
    chromium = need_tool(CHROMIUM)
    from playwright.async_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    review = await client.submit_many([Submit(handler="t.err.side_effect") for _ in range(4)])
    async with _worker(settings):
        for rid in review:
            await wait_state(stores, rid, {"FAILED"})
    _, secret = await create_token(client.stores.db, "operator", ["tq"], "review-op", "test")
    async with _recording(stores):
        async def recorded() -> bool:
            return await client.stores.db.pool.fetchval(  # type: ignore[union-attr]
                "SELECT count(*) FROM runs WHERE reason = 'review'") == len(review)

        await wait_until(recorded, timeout=30, what="the review runs recorded")
        with serve_in_thread(_app(settings)) as base:
            async with dashboard_page(chromium, viewport={"width": 1280, "height": 900}) as page, _watched(page) as seen:
                await log_in(page, base, secret, "review-op")
                await page.click("a[href='#/review']")
                rows = page.locator("#review-table tbody tr[data-id]")
                await expect(rows).to_have_count(4)
                await page.check(f"#review-table input[data-select='{review[0]}']")
                await expect(page.locator("#selection")).to_contain_text("1 selected")
                await page.screenshot(path=str(ARTIFACTS / "dashboard-review-bulk.png"), full_page=True)
                mark = len(seen["requests"])
                await page.click("#selection button[data-bulk-selected=resolve_failed]")
                await expect(page.locator("#confirm-title")).to_have_text("Resolve 1 runs as failed?")
                await page.fill("#confirm-reason", "not charged")
                await page.click("#confirm-ok")
                await expect(page.locator("#bulk-result")).to_have_text("resolve_failed: 1 of 1 done")
                await expect(rows).to_have_count(3)
                await page.click("#list-bulk button[data-list-bulk=resolve_succeeded]")
                await expect(page.locator("#confirm-title")).to_have_text("Resolve 3 runs as succeeded?")
                await page.fill("#confirm-reason", "charged, checked with the bank")
                await page.click("#confirm-ok")
                await expect(page.locator("#bulk-result")).to_have_text("resolve_succeeded: 3 of 3 done")
                await expect(rows).to_have_count(0)
                posts = [u.rsplit("/v1/", 1)[1] for u in seen["requests"][mark:]
                         if "/v1/ops/bulk" in u or re.search(r"/v1/runs/\d+/resolve", u)]
                assert posts == ["ops/bulk/count", "ops/bulk"] * 2, posts
    assert not seen["errors"], seen["errors"]
    assert [await run_state(stores, r) for r in review] == ["FAILED", "SUCCEEDED", "SUCCEEDED", "SUCCEEDED"]
    audit = await client.stores.db.fetch("audit_list", None, None, None, None, 1000, None, None)
    actions = {a["action"]: a for a in audit}
    assert actions["bulk_resolve_failed"]["reason"] == "not charged"
    assert sorted(json.loads(actions["bulk_resolve_succeeded"]["data"])["ids"]) == sorted(review[1:])


async def test_runs_are_searched_sorted_and_paged_from_the_page(settings: Settings, client: Client) -> None:
    """The comparison table's "search runs by id, argument text, tenant, keys, time; sort; page with counts",
    typed into the runs view's labelled fields: each narrows the list (and the count) as the API does,
    a column header sorts, the pager walks every match."""
    chromium = need_tool(CHROMIUM)
    from playwright.async_api import expect

    ids = await client.submit_many([Submit(handler="t.echo", args=(f"order-{i:03d}",), tenant="acme" if i % 2 else None,
                                           idempotency_key=f"k-{i}",
                                           concurrency_key="cust-7" if i == 9 else None,
                                           concurrency_limit=5 if i == 9 else None) for i in range(60)])
    _, secret = await create_token(client.stores.db, "operator", ["tq"], "search-op", "test")
    with serve_in_thread(_app(settings)) as base:
        async with dashboard_page(chromium, viewport={"width": 1400, "height": 900}) as page, _watched(page) as seen:
            await log_in(page, base, secret, "search-op")
            await page.goto(f"{base}/ui/#/runs?queue=tq")
            rows = page.locator("#runs-table tbody tr[data-id]")
            count = page.locator("#runs-count")
            await expect(count).to_have_text("1–50 of 60")
            await page.click("#next-page")
            await expect(count).to_have_text("51–60 of 60")
            await expect(rows).to_have_count(10)
            await page.click("#prev-page")
            await expect(count).to_have_text("1–50 of 60")

            async def search(field: str, value: str, expect_ids: list[int]) -> None:
                await page.fill(f"#runs-filter-{field}", value)
                await expect(count).to_have_text(f"1–{len(expect_ids)} of {len(expect_ids)}" if expect_ids else "0 of 0")
                got = [int(i) for i in await rows.evaluate_all("rs => rs.map(r => r.dataset.id)")]
                assert got == sorted(expect_ids, reverse=True), (field, value, got)
                assert f"{field}=" in page.url
                await page.fill(f"#runs-filter-{field}", "")
                await expect(count).to_have_text("1–50 of 60")

            await search("arg", "order-042", [ids[42]])
            await search("id", str(ids[7]), [ids[7]])
            await search("tenant", "acme", ids[1::2])
            await search("idempotency_key", "k-3", [ids[3]])
            await search("concurrency_key", "cust-7", [ids[9]])
            await search("since", "2099-01-01T00:00", [])
            await page.click("button[data-sort=id]")  # id, newest first -> oldest first
            await expect(rows.first).to_have_attribute("data-id", str(ids[0]))
            assert "sort=id" in page.url and "order=asc" in page.url
            await page.click("button[data-sort=created_at]")
            await expect(rows.first).to_have_attribute("data-id", str(ids[-1]))
    assert not seen["errors"], seen["errors"]
