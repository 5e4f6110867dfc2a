"""Review of this session's API routes (attacks with real requests): a dispatch change names only
its own setting's fields (a `rate` update carrying a `value` used to clear the queue's rate with a
200; a `max_running` with a `key` set the whole queue's); a batch whose runs are gone from the record
(a load test's cleanup, retention) is not readable by a scoped token and not a 500; a queue filter is
a queue name."""

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
        await a.token("operator", "tq", name="operator-in")
        await client.submit("t.echo", 0, queue="other")  # both queues exist
        yield a


async def _audit(client: Client) -> int:
    pool = client.stores.db.pool
    assert pool is not None
    return int(await pool.fetchval("SELECT count(*) FROM audit_log WHERE action LIKE 'dispatch_%'"))


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
    before, audited = r.json(), await _audit(client)
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={**body, "reason": "oops"})
    assert r.status_code == 422 and r.json()["field"] == field, r.text
    assert (await api.req("GET", "/v1/queues/tq/dispatch", "admin")).json() == before
    assert await _audit(client) == audited


async def test_a_batch_whose_runs_left_the_record_is_shown_without_a_server_error(api: Api, client: Client) -> None:
    """Its members and callbacks purged (a load test's cleanup here; a dropped archive partition too):
    counted PURGED for an admin (it was a 500: a None state among the counts), and not shown to a
    scoped token, which cannot be shown that they were in its queues (it passed the scope check with
    no queue known, then answered "no run with id N", naming the callback)."""
    runs = {"runs": [{"handler": "t.echo", "args": [1], "queue": "other"}] * 2}
    gone = (await api.req("POST", "/v1/batches", "admin",
                          json={**runs, "on_complete": {"handler": "t.echo", "args": [1], "queue": "other"}})).json()
    half = (await api.req("POST", "/v1/batches", "admin",
                          json={**runs, "on_success": {"handler": "t.echo", "args": [1], "queue": "tq"}})).json()
    await client.stores.db.execute("loadtest_cleanup", "other")  # the runs leave the record, the batches stay
    missing = await api.req("GET", "/v1/batches/00000000-0000-4000-8000-000000000000", "operator-in")
    for made in (gone, half):
        r = await api.req("GET", f"/v1/batches/{made['id']}", "operator-in")
        assert r.status_code == 404 and set(r.json()) == set(missing.json()), r.text
        assert r.json()["detail"] == f"no batch with id {made['id']}"
        r = await api.req("GET", f"/v1/batches/{made['id']}", "admin")
        assert r.status_code == 200, r.text
        assert (r.json()["total"], r.json()["counts"]) == (2, {"PURGED": 2})
    assert (await api.req("GET", f"/v1/batches/{gone['id']}", "admin")).json()["on_complete"] == {
        "id": gone["on_complete"], "status": "PURGED", "reason": None}
    assert (await api.req("GET", f"/v1/batches/{half['id']}", "admin")).json()["on_success"]["status"] == "BLOCKED"


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
    audited = await _audit(client)
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "rate", "rate": rate, "reason": "x"})
    assert r.status_code == 422 and r.json()["field"] == "rate", r.text
    assert await _audit(client) == audited
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


async def test_a_submit_rate_without_a_unit_is_refused_by_the_client(client: Client) -> None:
    """'5/2' is the stores' form (5 per 2 ms); a caller's rate names its unit, as on the CLI and the API."""
    from fencepost.core.errors import InvalidInput
    with pytest.raises(InvalidInput) as exc:
        await client.submit("t.echo", 0, queue="tq", rate_key="k", rate_limit="5/2")
    assert exc.value.field == "rate_limit"
