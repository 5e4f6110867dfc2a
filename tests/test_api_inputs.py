"""Bad input to the API gets a 4xx naming the right field and changes nothing (issue 24 items 4 and
13): text fields, queue names in paths and filters, query integers, rates, a dispatch change that
carries another setting's fields (a `rate` update with a `value` used to clear the queue's rate with
a 200; a `max_running` with a `key` set the whole queue's), a submit against the handler's
signature. Every API answer says Cache-Control: no-store; /metrics needs a token unless made public."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from fencepost.api import ApiConfig
from fencepost.client import Client
from fencepost.core.config import Settings
from tests.test_api import Api, _make_api


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        yield a


async def _audit_rows(client: Client) -> int:
    return await client.stores.db.pool.fetchval("SELECT count(*) FROM audit_log")  # type: ignore[union-attr]


@pytest.mark.parametrize("ch", ["\a", "\x1b", "\u202e", "\u200b", "\u0085", "\u2028"])
async def test_a_bulk_handler_filter_with_a_control_or_format_character_is_refused(api: Api, client: Client,
                                                                                   ch: str) -> None:
    """The issue's reproduction: these were stored in audit_log.data (and U+2028 cut `fencepost audit`)."""
    await client.submit("t.echo", 1)
    before = await _audit_rows(client)
    for body in ({"command": "cancel", "handler": f"t.{ch}echo"},
                 {"command": "cancel", "handler": f"t.{ch}echo", "count": True}):
        r = await api.req("POST", "/v1/queues/tq/bulk", "admin", json=body)
        assert r.status_code == 422 and r.json()["field"] == "handler", r.text
        assert f"U+{ord(ch):04X} at position 3" in r.json()["detail"], r.json()["detail"]
    assert await _audit_rows(client) == before


async def test_a_bulk_on_a_queue_that_does_not_exist_is_404_and_audits_nothing(api: Api, client: Client) -> None:
    before = await _audit_rows(client)
    r = await api.req("POST", "/v1/queues/nosuch/bulk", "admin", json={"command": "cancel"})
    assert r.status_code == 404 and r.json()["field"] == "queue", r.text
    assert await _audit_rows(client) == before


async def test_refusals_name_the_field_the_caller_sent(api: Api, client: Client) -> None:
    """The issue: /v1/audit?actor= named `name`; a dispatch value 1e-320 named `aging` / `weight`."""
    r = await api.req("GET", "/v1/audit", "admin", params={"actor": "tok\u202een"})
    assert r.status_code == 422 and r.json()["field"] == "actor", r.text
    await client.submit("t.echo", 1)
    for setting, extra in (("aging", {}), ("weight", {"tenant": "acme"})):
        r = await api.req("POST", "/v1/queues/tq/dispatch", "admin",
                          json={"setting": setting, "value": 1e-320, **extra})
        assert r.status_code == 422 and r.json()["field"] == "value", r.text


async def test_a_text_field_refusal_names_the_character_and_its_position_not_a_regex(api: Api) -> None:
    r = await api.req("POST", "/v1/workflows", "admin", json={"name": "ab\u202ec", "nodes": [
        {"name": "a", "handler": "t.echo", "args": [1], "queue": "tq"}]})
    assert r.status_code == 422 and r.json()["field"] == "name", r.text
    detail = r.json()["detail"]
    assert "U+202E at position 3" in detail and "regex" not in detail and "\\u" not in detail, detail


async def test_a_queue_name_in_a_path_is_validated(api: Api) -> None:
    """The issue: /v1/queues/a%20b/stats answered 200."""
    for path in ("/v1/queues/a%20b/stats", "/v1/queues/a%20b/dispatch"):
        r = await api.req("GET", path, "admin")
        assert r.status_code == 422 and r.json()["field"] == "queue", (path, r.text)


async def test_every_api_answer_says_no_store(api: Api) -> None:
    """The issue: no Cache-Control at all, not even on the answer that carries a new token's secret."""
    r = await api.req("POST", "/v1/tokens", "admin", json={"role": "producer"})
    assert r.status_code == 201 and r.headers["cache-control"] == "no-store"
    for method, path, who in (("GET", "/v1/me", "admin"), ("GET", "/v1/me", None), ("GET", "/healthz", None),
                              ("GET", "/v1/runs/999", "admin"), ("GET", "/openapi.json", None),
                              ("GET", "/v1/nothing", "admin")):
        r = await api.req(method, path, who)
        assert r.headers.get("cache-control") == "no-store", (path, r.status_code, r.headers)
    assert "no-store" not in (await api.req("GET", "/ui/app.js")).headers.get("cache-control", "")


async def test_metrics_need_a_token_unless_made_public(settings: Settings, client: Client,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        assert (await api.req("GET", "/metrics")).status_code == 401
        assert (await api.req("GET", "/metrics", "producer")).status_code == 200
    monkeypatch.setenv("FENCEPOST_API_METRICS_TOKEN", "0")
    async for api in _make_api(settings, client, ApiConfig.from_env(token_cache_s=0, rate_limit=0)):
        r = await api.req("GET", "/metrics")
        assert r.status_code == 200 and "fencepost_api_requests_total" in r.text


@pytest.mark.parametrize("body,fld", [
    ({"handler": "t.spin", "kwargs": {"bogus": 1}}, "bogus"),
    ({"handler": "t.spin", "kwargs": {"n": "five"}}, "n"),
    ({"handler": "t.spin", "args": [1, 2]}, "args"),
    ({"handler": "t.spin"}, "n"),
    ({"handler": "t.spin", "args": [1], "kwargs": {"n": 2}}, "n"),
])
async def test_a_submit_is_checked_against_the_handlers_signature(api: Api, client: Client, body: dict[str, object],
                                                                  fld: str) -> None:
    """The issue's reproduction: {"kwargs": {"bogus": 1}} or a wrong type was a 201, then the run FAILED on
    the worker with InvalidInput. The API has no handler code: it checks the signature the worker declared."""
    r = await api.req("POST", "/v1/runs", "producer", json=body)
    assert r.status_code == 422 and r.json()["field"] == fld, r.text
    assert await client.stores.db.pool.fetchval("SELECT count(*) FROM runs") == 0  # type: ignore[union-attr]
    r = await api.req("POST", "/v1/runs", "producer", json={"handler": "t.spin", "kwargs": {"n": 3}})
    assert r.status_code == 201, r.text


async def test_cli_submit_by_name_is_checked_against_the_handlers_signature(settings: Settings, client: Client) -> None:
    import asyncio
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {"PATH": "/usr/bin:/bin", "FENCEPOST_REDIS_URL": settings.redis_url,
           "FENCEPOST_DATABASE_URL": settings.database_url, "FENCEPOST_PREFIX": settings.prefix}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fencepost.cli", "submit", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)

    out = await asyncio.to_thread(cli, "t.spin", "--kwargs", '{"bogus": 1}')
    assert out.returncode != 0 and "bogus" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert await client.stores.db.pool.fetchval("SELECT count(*) FROM runs") == 0  # type: ignore[union-attr]
    out = await asyncio.to_thread(cli, "t.spin", "--kwargs", '{"n": 2}')
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("body", "field"), [
    ({"setting": "rate", "value": 5}, "value"),
    ({"setting": "rate", "key": "k", "value": 5}, "value"),
    ({"setting": "weight", "tenant": "a", "value": 2, "rate": "1/1s"}, "rate"),
    ({"setting": "max_running", "value": 2, "rate": "1/1s"}, "rate"),
    ({"setting": "max_running", "key": "acme", "value": 2}, "key"),  # not a per-key max: refused, not queue-wide
    ({"setting": "aging", "tenant": "acme", "value": 5}, "tenant"),
    ({"setting": "limit", "key": "k", "tenant": "acme", "value": 2}, "tenant"),
    ({"setting": "weight", "tenant": "acme", "key": "k", "value": 2}, "key"),
])
async def test_a_dispatch_change_with_another_settings_field_is_refused_and_changes_nothing(
        api: Api, client: Client, body: dict[str, Any], field: str) -> None:
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "rate", "rate": "5/1s"})
    assert r.status_code == 200 and r.json()["rate"] == "5/1s", r.text
    before, audited = r.json(), await _audit_rows(client)
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={**body, "reason": "oops"})
    assert r.status_code == 422 and r.json()["field"] == field, r.text
    assert (await api.req("GET", "/v1/queues/tq/dispatch", "admin")).json() == before
    assert await _audit_rows(client) == audited


@pytest.mark.parametrize("path", ["/v1/events", "/v1/events/stream?duration=0", "/v1/runs", "/v1/dead-letter",
                                  "/v1/review", "/v1/audit", "/v1/workers"])
@pytest.mark.parametrize("queue", ["a%00b", "x" * 65, "a%20b", "%E2%80%AEq"])
async def test_a_queue_filter_that_no_queue_can_be_named_is_refused_naming_it(api: Api, path: str, queue: str) -> None:
    """The queue filter is validated like every queue name (the live stream answered 200 and streamed
    nothing for a%00b; /v1/events said 'a value cannot be stored' without a field)."""
    sep = "&" if "?" in path else "?"
    r = await api.req("GET", f"{path}{sep}queue={queue}", "admin")
    assert r.status_code == 422 and r.json()["field"] == "queue", r.text


@pytest.mark.parametrize("rate", ["5/2", "5/1s\n", "\n5/1s", "5/1s\t", "5/1s\x1c", "5/1s\x85", "5/1s\u2028",
                                  "\u0665/1s", "5/\u0661s"])
async def test_a_rate_with_control_characters_or_other_scripts_digits_is_refused(
        api: Api, client: Client, rate: str) -> None:
    """The rate spelling is ASCII digits and spaces: Python's \\s and \\d also matched newlines, the
    file separator, NEL, U+2028 and Arabic-Indic digits, and such a rate was stored and audited. A
    bare '5/2' (the stored form) has no unit: the client took it from a submit as 5 per 2 ms."""
    audited = await _audit_rows(client)
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "rate", "rate": rate, "reason": "x"})
    assert r.status_code == 422 and r.json()["field"] == "rate", r.text
    assert await _audit_rows(client) == audited
    r = await api.req("POST", "/v1/runs", "admin", json={"handler": "t.echo", "args": [1], "queue": "tq", "rate_key": "k",
                                                       "rate_limit": rate})
    assert r.status_code == 422 and r.json()["field"] == "rate_limit", r.text


@pytest.mark.parametrize(("path", "field"), [
    ("/v1/events?type=%1b[31m", "type"),
    ("/v1/events?limit=1_0", "limit"),
    ("/v1/events?limit=%D9%A1", "limit"),  # an Arabic-Indic one
    ("/v1/events?limit=%205%20", "limit"),
    ("/v1/runs?limit=%EF%BC%95", "limit"),  # a full-width five
])
async def test_query_text_and_integers_are_checked_on_every_list(api: Api, path: str, field: str) -> None:
    """`?type=` of /v1/events went to SQL unchecked (the stream checked it); query integers took
    whatever Python's int() takes."""
    r = await api.req("GET", path, "admin")
    assert r.status_code == 422 and r.json()["field"] == field, r.text
