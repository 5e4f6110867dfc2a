"""The API the dashboard's operations views use (scheduler/api/routes_ops.py, issue 24), without a
browser: lists scoped before they are limited and paged by cursors, bulk actions that act on exactly
the runs counted (a run that moved is skipped, one failed after the count is not touched), delete
as a move to the archive, run-now of a delayed run, overdue runs of a queue with no workers, a run's
timeline after a cursor, state groups from fencepost.core.states."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from fencepost.api import ApiConfig
from fencepost.client import Client
from fencepost.core import states
from fencepost.core.config import Settings
from fencepost.core.errors import IllegalTransition
from fencepost.core.stores import Stores
from tests.conftest import record_all, run_state, wait_state
from tests.test_api import Api, _make_api
from tests.test_control import _worker


async def test_state_groups_come_from_core_states(settings: Settings, client: Client) -> None:
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        body = (await api.req("GET", "/v1/states")).json()
        assert body["states"] == [s.value for s in states.Status]
        assert {k: set(v) for k, v in body["groups"].items()} == {k: {s.value for s in v} for k, v in states.GROUPS.items()}
        assert set(body["commands"]["retry"]) == {s.value for s in states.FAILED_FOR_GOOD}
        assert set(body["commands"]["cancel"]) == {s.value for s in states.CANCEL_AT_ONCE | states.ACTIVE}


async def test_dead_letter_is_scoped_before_it_is_limited_and_paged_by_cursor(
        settings: Settings, client: Client, stores: Stores) -> None:
    """Issue 24 item 3: 60 newer failures elsewhere hid an operator's own dead letter."""
    mine = [await client.submit("t.err.invalid", queue="tq") for _ in range(5)]
    theirs = [await client.submit("t.err.invalid", queue="other") for _ in range(12)]
    async with _worker(settings, queues=["tq", "other"]):
        for rid in [*mine, *theirs]:
            await client.wait(rid, timeout=30)
    await record_all(stores)
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        seen: list[int] = []
        cursor = None
        for _ in range(5):
            params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            r = await api.req("GET", "/v1/ops/lists/dead", "op_tq", params=params)
            assert r.status_code == 200, r.text
            seen += [x["id"] for x in r.json()["runs"]]
            cursor = r.json()["next"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(mine) and len(seen) == len(set(seen))
        r = await api.req("GET", "/v1/ops/lists/dead", "op_tq", params={"cursor": "x_1"})
        assert r.status_code == 422 and r.json()["field"] == "cursor"


async def test_bulk_retry_acts_on_exactly_the_runs_counted(settings: Settings, client: Client, stores: Stores) -> None:
    """One request counts (a handle), one confirms; a run retried meanwhile is skipped, a run that
    failed after the count is not touched; the audit row lists what was acted on."""
    first = [await client.submit("t.err.invalid") for _ in range(3)]
    async with _worker(settings):
        for rid in first:
            await wait_state(stores, rid, {"FAILED"})
    await record_all(stores)
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        body = {"action": "retry", "list": "dead", "filter": {"queue": "tq"}, "reason": "fixed"}
        r = await api.req("POST", "/v1/ops/bulk", "op_tq", json=body)
        assert r.status_code == 428, r.text
        count = r.json()
        assert count["matched"] == 3 and count["acting"] == 3 and sorted(count["sample"]) == sorted(first)
        r = await api.req("POST", "/v1/ops/bulk/count", "op_tq", json=body)  # the same count, 200 for pages
        assert r.status_code == 200 and r.json()["acting"] == 3
        handle = r.json()["handle"]
        await client.retry(first[0], reason="someone else")  # moved since the count
        late = await client.submit("t.err.invalid")
        async with _worker(settings):
            await wait_state(stores, late, {"FAILED"})
        r = await api.req("POST", "/v1/ops/bulk", "op_tq", json={**body, "handle": handle, "confirm": 2})
        assert r.status_code == 428 and r.json()["acting"] == 3  # the confirm must name the count
        r = await api.req("POST", "/v1/ops/bulk", "op_tq", json={**body, "handle": handle, "confirm": 3})
        assert r.status_code == 200, r.text
        out = r.json()
        assert sorted(out["changed"]) == sorted(first[1:]) and [s["id"] for s in out["skipped"]] == [first[0]]
        assert await run_state(stores, late) == "FAILED"
        r = await api.req("POST", "/v1/ops/bulk", "op_tq", json={**body, "handle": handle, "confirm": 3})
        assert r.status_code == 404, "a handle is used once"
        audit = await client.stores.db.fetch("audit_list", None, None, None, None, 10, None, None)
        row = next(a for a in audit if a["action"] == "bulk_retry")
        data = json.loads(row["data"])
        assert data["handle"] == handle and sorted(data["ids"]) == sorted(first[1:]) and data["skipped"] == [first[0]]


async def test_delete_moves_finished_runs_out_of_the_lists_and_run_now_makes_a_delayed_run_due(
        settings: Settings, client: Client, stores: Stores) -> None:
    dead = await client.submit("t.err.invalid")
    async with _worker(settings):
        await wait_state(stores, dead, {"FAILED"})
    await record_all(stores)
    later = await client.submit("t.noop", delay=3600)
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        q = (await api.req("GET", "/v1/ops/queues", "admin")).json()
        tq = next(x for x in q if x["queue"] == "tq")
        assert tq["scheduled"] == 1 and tq["overdue"] == 0 and tq["workers"] == []
        for action, listed, rid in (("delete", "dead", dead), ("run_now", "scheduled", later)):
            body = {"action": action, "list": listed, "filter": {"queue": "tq"}, "reason": "cleanup"}
            counted = (await api.req("POST", "/v1/ops/bulk/count", "admin", json=body)).json()
            assert counted["acting"] == 1, counted
            r = await api.req("POST", "/v1/ops/bulk", "admin", json={**body, "handle": counted["handle"], "confirm": 1})
            assert r.status_code == 200 and r.json()["changed"] == [rid], r.text
        assert (await api.req("GET", "/v1/ops/lists/dead", "admin")).json()["runs"] == []
        assert (await api.req("GET", f"/v1/runs/{dead}", "admin")).json()["status"] == "FAILED"  # history stays
        assert (await client.get(later))["status"] in ("PENDING", "RUNNING", "SUCCEEDED")
        r = await api.req("POST", "/v1/ops/bulk/count", "op_tq", json={"action": "delete", "list": "dead"})
        assert r.status_code == 403, "deleting is for admins"
        async with _worker(settings):
            await wait_state(stores, later, {"SUCCEEDED"})


async def test_a_runs_timeline_after_a_cursor(settings: Settings, client: Client, stores: Stores) -> None:
    """The run page asks for what was recorded since its last look (event rows and attempt columns, the
    view `history`), not the whole history; a long answer pages by (recorded_at, id)."""
    rid = await client.submit("t.noop", delay=3600)
    await client.pause(rid, reason="a")
    await record_all(stores)
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        async def timeline(api: Api = api, **params: Any) -> dict[str, Any]:
            r = await api.req("GET", f"/v1/runs/{rid}/timeline", "admin", params=params)
            assert r.status_code == 200, r.text
            out: dict[str, Any] = r.json()
            return out

        t = await timeline()
        assert [e["type"] for e in t["events"]] == ["submitted", "paused"] and t["cursor"]
        one = await timeline(limit=1)
        assert one["more"] and [e["type"] for e in one["events"]] == ["submitted"]
        rest = await timeline(after=one["cursor"], from_id=one["last_id"])
        assert [e["type"] for e in rest["events"]] == ["paused"] and not rest["more"]
        await client.resume(rid, reason="b")
        await client.cancel(rid, reason="c")
        await record_all(stores)
        new = await timeline(after=t["cursor"])
        seen = {e["id"] for e in t["events"]}
        assert [e["type"] for e in new["events"] if e["id"] not in seen] == ["resumed", "cancelled"]
        assert len(new["events"]) <= 4, "a look reaches back a few seconds, not to the start"
        r = await api.req("GET", f"/v1/runs/{rid}/timeline", "admin", params={"after": "x"})
        assert r.status_code == 422 and r.json()["field"] == "after"


def _types(events: list[Any]) -> list[str]:
    return [e.type if hasattr(e, "type") else e["type"] for e in events]


async def test_run_now_is_one_transition_with_one_event_and_the_run_starts(
        settings: Settings, client: Client, stores: Stores) -> None:
    """Run now was a pause and a resume (two events, a PAUSED run in between that a concurrent resume or
    claim could act on): now one transition, `run_now`, with the token and the reason (the audit view
    lists it); a scheduled run and a retry-waiting run both start at once and run once."""
    later = await client.submit("t.noop", delay=3600)
    waiting = await client.submit("t.err.rate_limited", 3600)  # attempt 1: RETRY_WAIT for an hour
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        async with _worker(settings):
            await wait_state(stores, waiting, {"RETRY_WAIT"})
            for rid in (later, waiting):
                r = await api.req("POST", f"/v1/runs/{rid}/run_now", "op_tq", json={"reason": "customer waiting"})
                assert r.status_code == 200 and r.json()["state"] in ("PENDING", "RUNNING", "SUCCEEDED"), r.text
            for rid in (later, waiting):
                await wait_state(stores, rid, {"SUCCEEDED"}, timeout=20)
        await record_all(stores)
        for rid, attempts in ((later, 1), (waiting, 2)):
            events = await client.events(rid)
            types = _types(events)
            assert types.count("run_now") == 1 and "paused" not in types and "resumed" not in types, types
            assert types.count("claimed") == attempts and types[-1] == "succeeded", types
            ev = next(e for e in events if e.type == "run_now")
            assert ev.reason == "customer waiting" and ev.actor and ev.actor.startswith("token:"), ev
            row = await client.get(rid)
            assert row["attempt"] == attempts
        audit = (await api.req("GET", "/v1/audit", "admin")).json()
        assert sorted(int(a["target"]) for a in audit if a["action"] == "run_now") == sorted([later, waiting])
        r = await api.req("POST", f"/v1/runs/{later}/run_now", "op_tq", json={"reason": "again"})
        assert r.status_code == 409, "a finished run is not run again by run_now"


async def test_concurrent_run_now_claim_and_resume_take_effect_once(
        settings: Settings, client: Client, stores: Stores) -> None:
    """Eight run-nows and a resume sent at once (no expected version), then a worker claiming: exactly
    one run_now takes effect (the run is due then, so the others are refused, as the resume of a run
    that is not paused is), and the run is claimed and runs once. A counted bulk run_now whose run moved
    meanwhile is skipped, not applied."""
    rid = await client.submit("t.noop", delay=3600)
    ctl = client.control
    calls = [ctl.run_now(rid, reason=f"n{i}") for i in range(8)] + [ctl.resume(rid, reason="r")]
    out = await asyncio.gather(*calls, return_exceptions=True)
    won = [o for o in out[:8] if not isinstance(o, BaseException)]
    assert len(won) == 1 and won[0] == "PENDING", out
    assert all(isinstance(o, IllegalTransition) for o in out if isinstance(o, BaseException)), out
    async with _worker(settings):
        await wait_state(stores, rid, {"SUCCEEDED"}, timeout=20)
        # a counted set whose run moved (ran) since the count: the confirm skips it
        again = await client.submit("t.noop", delay=3600)
        async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
            body = {"action": "run_now", "list": "ids", "ids": [again], "reason": "bulk"}
            counted = (await api.req("POST", "/v1/ops/bulk/count", "op_tq", json=body)).json()
            assert counted["acting"] == 1, counted
            assert await ctl.run_now(again, reason="single") == "PENDING"
            await wait_state(stores, again, {"SUCCEEDED"}, timeout=20)
            r = await api.req("POST", "/v1/ops/bulk", "op_tq",
                              json={**body, "handle": counted["handle"], "confirm": 1})
            assert r.status_code == 200 and r.json()["changed"] == [] and r.json()["skipped"][0]["id"] == again, r.text
    await record_all(stores)
    for run in (rid, again):
        types = _types(await client.events(run))
        assert types.count("run_now") == 1 and types.count("claimed") == 1 and "paused" not in types, types


async def test_review_runs_are_resolved_in_bulk_by_the_server_acting_only_on_what_was_counted(
        settings: Settings, client: Client, stores: Stores) -> None:
    """The review page resolved one run at a time (a POST per run from the browser); now one count and
    one confirm close the counted review runs as succeeded or failed. A run resolved by someone else
    after the count is skipped; a FAILED run outside the review queue is never counted."""
    review = [await client.submit("t.err.side_effect") for _ in range(3)]
    plain = await client.submit("t.err.invalid")
    async with _worker(settings):
        for rid in [*review, plain]:
            await wait_state(stores, rid, {"FAILED"})
    await record_all(stores)
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        body = {"action": "resolve_succeeded", "list": "review", "filter": {"queue": "tq"}, "reason": "charged"}
        counted = (await api.req("POST", "/v1/ops/bulk/count", "op_tq", json=body)).json()
        assert counted["acting"] == 3 and sorted(counted["sample"]) == sorted(review), counted
        ids = {"action": "resolve_failed", "list": "ids", "ids": [plain, review[0]], "reason": "not charged"}
        ticked = (await api.req("POST", "/v1/ops/bulk/count", "op_tq", json=ids)).json()
        assert ticked["acting"] == 1 and ticked["sample"] == [review[0]], "a FAILED run not under review is not counted"
        r = await api.req("POST", "/v1/ops/bulk", "op_tq", json={**ids, "handle": ticked["handle"], "confirm": 1})
        assert r.status_code == 200 and r.json()["changed"] == [review[0]], r.text
        r = await api.req("POST", "/v1/ops/bulk", "op_tq", json={**body, "handle": counted["handle"], "confirm": 3})
        assert r.status_code == 200, r.text
        out = r.json()
        assert sorted(out["changed"]) == sorted(review[1:]) and [s["id"] for s in out["skipped"]] == [review[0]], out
        assert out["results"] == {"SUCCEEDED": 2}, out
        r = await api.req("POST", "/v1/ops/bulk/count", "op_tq", json={**body, "list": "dead"})
        assert r.status_code == 422 and r.json()["field"] == "list", r.text
    await record_all(stores)
    assert [await run_state(stores, rid) for rid in review] == ["FAILED", "SUCCEEDED", "SUCCEEDED"]
    assert await run_state(stores, plain) == "FAILED"
    audit = await client.stores.db.fetch("audit_list", None, None, None, None, 50, None, None)
    row = next(a for a in audit if a["action"] == "bulk_resolve_succeeded")
    assert row["reason"] == "charged" and sorted(json.loads(row["data"])["ids"]) == sorted(review[1:])
    assert all(e.type != "resolved" or e.reason == "not charged" for e in await client.events(review[0]))


def test_the_handler_rollups_histogram_bounds_are_the_ones_percentiles_read() -> None:
    """sql/queries_handlers.sql buckets run times in SQL; stats.percentile reads them back with BOUNDS_MS."""
    from pathlib import Path

    from fencepost.core.stats import BOUNDS_MS

    sql = (Path(__file__).resolve().parent.parent / "sql" / "queries_handlers.sql").read_text()
    arrays = re.findall(r"width_bucket\([^;]*?'\{([\d,]+)\}'::float8\[\]\)", sql)
    assert len(arrays) == 2, arrays
    assert all(tuple(int(x) for x in a.split(",")) == BOUNDS_MS for a in arrays)
    assert sql.count("count(*) FILTER (WHERE h = ") == len(BOUNDS_MS) + 1  # the rollup's; the live read groups by h


async def test_per_handler_figures_read_closed_buckets_from_the_rollup_and_the_rest_from_the_attempts(
        settings: Settings, client: Client, stores: Stores) -> None:
    """The 24 h and 7 d per-handler charts read every attempt of the window (1 s at 100,000 attempts a day):
    now closed 15-minute buckets are rolled up once (handler_buckets), the rest is read from the attempts,
    and the figures are the same as from the attempts alone; a bucket whose attempt still runs is not
    closed until it has finished, and then counts its finish."""
    pool = client.stores.db.pool
    assert pool is not None
    # in three 15-minute buckets (each group inside one): 3 h ago, 4 attempts (one failed, one still
    # running); 2 h ago, 2; the current bucket (not closed), 3
    t0 = int(time.time()) // 900 * 900
    plan = [(t0 - 10740, "succeeded", 0.02), (t0 - 10739, "succeeded", 0.3), (t0 - 10738, "error", 0.02),
            (t0 - 10737, None, None), (t0 - 7140, "succeeded", 2.0), (t0 - 7139, "succeeded", 2.0),
            (t0, "succeeded", 0.02), (t0, "error", 0.4), (t0, "succeeded", 0.02)]
    for i, (at, outcome, took) in enumerate(plan, start=1):
        rid = 9_000_000 + i
        status = {"succeeded": "SUCCEEDED", "error": "FAILED", None: "RUNNING"}[outcome]
        await pool.execute(
            "INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, attempt, run_at, started_at,"
            " finished_at, lease_owner, token) VALUES ($1, 'h.roll', 'tq', $2, '\\x929180'::bytea, 0, 300, 1,"
            " to_timestamp($3), to_timestamp($3),"
            " CASE WHEN $4::float8 IS NULL THEN NULL ELSE to_timestamp($3 + $4::float8) END,"
            " CASE WHEN $4::float8 IS NULL THEN 'w' END, CASE WHEN $4::float8 IS NULL THEN 1 END)",
            rid, status, float(at), took)
        await pool.execute(
            "INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome)"
            " SELECT id, 1, 1, 'w', started_at, finished_at, $2 FROM runs WHERE id = $1", rid, outcome)
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        async def figures(window: str, api: Api = api) -> dict[str, Any]:
            r = await api.req("GET", "/v1/ops/handlers", "op_tq", params={"window": window, "handler": "h.roll"})
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            [total] = [h for h in body["handlers"] if h["handler"] == "h.roll"]
            points = [p for p in body["points"] if p["started"]]
            return {"total": total, "points": [(p["started"], p["succeeded"], p["failed"]) for p in points]}

        live = await figures("1h")  # the attempts only
        assert live["total"]["started"] == 3 and live["total"]["failed"] == 1
        day = await figures("24h")
        assert (day["total"]["started"], day["total"]["succeeded"], day["total"]["failed"]) == (9, 6, 2), day
        assert day["points"] == [(4, 2, 1), (2, 2, 0), (3, 2, 1)], day
        assert 1000 <= day["total"]["run_p95_ms"] <= 2500, day  # the two 2 s runs, within their bucket
        closed = await pool.fetch("SELECT bucket, started FROM handler_buckets WHERE handler = 'h.roll' ORDER BY 1")
        assert [r["started"] for r in closed] == [2], "the bucket with a running attempt waits; the 2 h one is closed"
        assert await figures("24h") == day, "read again: the same figures, from the rollup this time"
        # the running attempt finishes: its bucket closes with it
        await pool.execute("UPDATE attempts SET finished_at = started_at + interval '1 second', outcome = 'succeeded'"
                           " WHERE run_id = 9000004")
        again = await figures("24h")
        assert (again["total"]["started"], again["total"]["succeeded"]) == (9, 7), again
        closed = await pool.fetch("SELECT started, succeeded FROM handler_buckets WHERE handler = 'h.roll' ORDER BY bucket")
        assert [(r["started"], r["succeeded"]) for r in closed] == [(4, 3), (2, 2)], closed
        week = await figures("7d")
        assert (week["total"]["started"], week["total"]["succeeded"], week["total"]["failed"]) == (9, 7, 2), week
