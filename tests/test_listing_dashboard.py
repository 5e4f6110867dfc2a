"""The runs view offers only the sorts the server serves (issue 24): attempt, handler and state over more
runs than the count cap are refused by GET /v1/runs (a 422 naming `sort`, tests/test_listing_plans.py), so
the view shows those column heads as plain text then, and a URL asking for one anyway shows the list in
id order with the server's reason. Headless Chromium against the real API.

FENCEPOST_DASHBOARD_STATIC=<dir> serves another build of the dashboard's files (to show that the test
fails on the files before the change)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fencepost.api.app as app_module
from fencepost.api import ApiConfig, create_app, routes_runs
from fencepost.api.auth import create_token
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit
from tests.conftest import need_tool
from tests.test_api import serve_in_thread
from tests.test_dashboard import CHROMIUM, dashboard_page, log_in

pytestmark = pytest.mark.slow

if os.environ.get("FENCEPOST_DASHBOARD_STATIC"):
    app_module.STATIC_DIR = Path(os.environ["FENCEPOST_DASHBOARD_STATIC"])


async def test_the_runs_view_offers_only_the_sorts_the_server_serves(
        settings: Settings, client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    chromium = need_tool(CHROMIUM)
    from playwright.async_api import expect

    monkeypatch.setattr(routes_runs, "COUNT_CAP", 5)  # the cap, as 10,000 is at 1,000,000 runs
    await client.submit_many([Submit(handler="t.echo", args=(i,), queue="tq") for i in range(8)])
    other = await client.submit_many([Submit(handler="t.echo", args=(i,), queue="other") for i in range(3)])
    _, secret = await create_token(client.stores.db, "admin", [], "sorter", "test")
    app = create_app(settings, ApiConfig(token_cache_s=1, rate_limit=0))
    with serve_in_thread(app) as base:
        async with dashboard_page(chromium, viewport={"width": 1400, "height": 900}) as page:
            await log_in(page, base, secret, "sorter")
            count = page.locator("#runs-count")
            await page.goto(f"{base}/ui/#/runs")
            await expect(count).to_have_text("1–11 of 5+")  # more than the cap: no exact count
            for key in ("attempt", "handler", "status"):
                await expect(page.locator(f"[data-sort-off={key}]")).to_have_count(1)
                await expect(page.locator(f"button[data-sort={key}]")).to_have_count(0)
            await expect(page.locator("button[data-sort=created_at]")).to_have_count(1)
            # within a queue state is served (an index), and 3 matches are counted exactly: all three
            await page.goto(f"{base}/ui/#/runs?queue=other")
            await expect(count).to_have_text("1–3 of 3")
            await page.click("button[data-sort=attempt]")
            await expect(page.locator("#runs-table tbody tr[data-id]")).to_have_count(3)
            assert "sort=attempt" in page.url
            got = await page.locator("#runs-table tbody tr[data-id]").evaluate_all("rs => rs.map(r => +r.dataset.id)")
            assert sorted(got) == sorted(other)
            # a URL with a sort the server refuses: the list in id order, the reason said
            await page.goto(f"{base}/ui/#/runs?sort=attempt&order=asc")
            await expect(page.locator("#runs-sort-refused")).to_contain_text("sort by attempt")
            await expect(count).to_have_text("1–11 of 5+")
            assert await page.locator("#error").text_content() in ("", None)
