"""Listing routes filter by the caller's scope before they limit, and page with keyset cursors
(issue 24 item 3): a scoped operator saw an empty dead letter once newer failures of another queue
filled the page; the review view the same."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from fencepost.api import ApiConfig
from fencepost.client import Client
from fencepost.core import cursors
from fencepost.core.config import Settings
from tests.test_api import Api, _make_api


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        yield a


async def _fail(client: Client, queue: str, n: int, *, review: bool = False, start_s: int = 0) -> list[int]:
    """n runs of `queue` dead-lettered (or in review), finished start_s.. seconds ago (older first)."""
    ids = [await client.submit("t.echo", i, queue=queue) for i in range(n)]
    await client.stores.db.pool.execute(  # type: ignore[union-attr]
        "UPDATE runs SET status = 'FAILED', attempt = 1, reason = $2, "
        "finished_at = now() - make_interval(secs => $3 + array_position($1::bigint[], id) * -1 + 1000) "
        "WHERE id = ANY($1)", ids, "review" if review else "max_retries", start_s)
    return ids


@pytest.mark.parametrize("path,review", [("/v1/dead-letter", False), ("/v1/review", True)])
async def test_a_scoped_operator_sees_its_queues_dead_letter_behind_newer_failures_elsewhere(
        api: Api, client: Client, path: str, review: bool) -> None:
    """The issue's reproduction: 42 failures in one queue, then 60 newer ones in another; the scoped
    operator's first page (limit 50) was [] while ?queue= found its 42."""
    mine = await _fail(client, "tq", 42, review=review, start_s=500)
    await _fail(client, "other", 60, review=review, start_s=0)
    r = await api.req("GET", path, "op_tq")
    assert r.status_code == 200, r.text
    got = [x["id"] for x in r.json()]
    assert sorted(got) == sorted(mine) and all(x["queue"] == "tq" for x in r.json()), got


async def test_the_dead_letter_pages_with_a_cursor_and_loses_no_row(api: Api, client: Client) -> None:
    ids = await _fail(client, "tq", 25)
    seen: list[int] = []
    cursor = None
    for _ in range(10):
        r = await api.req("GET", "/v1/dead-letter", "admin", params={"limit": 10, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        seen += [x["id"] for x in r.json()]
        cursor = r.headers.get("x-next-cursor")
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen)), seen
    assert seen == sorted(ids, reverse=True), "newest finished first"
    r = await api.req("GET", "/v1/dead-letter", "admin", params={"cursor": "yesterday"})
    assert r.status_code == 422 and r.json()["field"] == "cursor"


async def test_queue_figures_come_from_the_maintained_rollup_not_a_scan_of_runs(api: Api, client: Client) -> None:
    """Issue 24 item 12: GET /v1/queues counted finished runs and averaged attempt lags by scanning
    runs and attempts (362 ms at 1,000,000 runs); it reads the per-minute rollup the recorder keeps."""
    await client.submit("t.echo", 1)
    hist = [0] * 16
    hist[3] = 10  # ten starts 50-100 ms late
    await client.stores.db.pool.execute(  # type: ignore[union-attr]
        "INSERT INTO queue_minutes (queue, minute, started, succeeded, failed, retried, lag_hist, run_hist) "
        "VALUES ('tq', date_trunc('minute', now()), 10, 25, 5, 0, $1, $2)", hist, [0] * 16)
    r = await api.req("GET", "/v1/queues", "admin", params={"window": 300})
    (tq,) = [q for q in r.json() if q["queue"] == "tq"]
    assert tq["finished_last_window"] == 30 and tq["throughput_per_min"] == 6.0, tq
    assert tq["schedule_lag_s"] == 0.075, tq


async def test_cli_dlq_through_the_api_shows_the_scoped_operators_rows(settings: Settings, client: Client,
                                                                       tmp_path: Any) -> None:
    """The issue's reproduction: `fencepost dlq --api` as an operator scoped to one queue printed "(none)"
    once newer failures of another queue filled the page."""
    import asyncio
    import subprocess
    import sys

    from fencepost.api.auth import create_token
    from tests.conftest import ROOT, stop
    from tests.test_api import start_api

    mine = await _fail(client, "tq", 3, start_s=500)
    await _fail(client, "other", 60)
    _, secret = await create_token(client.stores.db, "operator", ["tq"], "oncall", "test")
    proc, url = await start_api(settings, tmp_path / "api.log")
    try:
        env = {"PATH": "/usr/bin:/bin", "FENCEPOST_API_URL": url, "FENCEPOST_API_TOKEN": secret,
               "FENCEPOST_REDIS_URL": "redis://127.0.0.1:1/0", "FENCEPOST_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}
        out = await asyncio.to_thread(lambda: subprocess.run(
            [sys.executable, "-m", "fencepost.cli", "dlq", "--json"], cwd=ROOT, env=env, capture_output=True,
            text=True, timeout=60))
        assert out.returncode == 0, out.stderr
        assert sorted(r["id"] for r in json.loads(out.stdout)) == sorted(mine), out.stdout
    finally:
        stop([proc])


async def test_the_fleet_history_lists_events_and_attempts_claims_and_finishes_newest_first(
        api: Api, client: Client) -> None:
    """GET /v1/events limits each half of the history (event rows, attempts' claims and finishes) on its own
    before merging them (issue 24 item 12): what it lists is still the newest of both, in order."""
    from tests.conftest import record_all
    from tests.test_drift import claim, finish

    rid = await client.submit("t.echo", 1)
    (cid, token), = await claim(client.stores, 1)
    assert cid == rid and await finish(client.stores, rid, token) == "SUCCEEDED"
    await record_all(client.stores)
    r = await api.req("GET", "/v1/events", "admin")
    assert r.status_code == 200, r.text
    mine = [(e["type"], e["queue"]) for e in r.json() if e["run_id"] == rid]
    assert [t for t, _ in mine][:3] == ["succeeded", "claimed", "submitted"][:len(mine)] and len(mine) >= 3, mine
    assert {q for _, q in mine} == {"tq"}
    ats = [e["at"] for e in r.json()]
    assert ats == sorted(ats, reverse=True)
    r = await api.req("GET", "/v1/events", "op_other")
    assert all(e["run_id"] != rid for e in r.json()), "another scope's history"


# -- keyset cursors on every listing (issue 24): walking the pages yields each row exactly once ----------------
# Each listing below is filled with rows that tie on its sort key (one transaction's submits share created_at;
# rows inserted with one timestamp), walked a few rows a page, with new rows inserted between the pages. The
# routes paged by time (`before`) or not at all lost or repeated the rows sharing a time.

async def _walk(api: Api, path: str, params: dict[str, Any], limit: int, key: Any, between: Any = None,
                who: str = "admin") -> list[Any]:
    """Every page of a listing, following X-Next-Cursor; `between` runs after each page (concurrent inserts)."""
    seen: list[Any] = []
    cursor = None
    for _ in range(300):
        r = await api.req("GET", path, who, params={**params, "limit": limit, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [key(x) for x in page]
        cursor = r.headers.get("x-next-cursor")
        if cursor is None:
            return seen
        assert len(page) == limit, "a page with a next cursor is full"
        if between is not None:
            await between()
    raise AssertionError(f"{path}: no last page after 300 pages")


def _once(seen: list[Any], before: list[Any]) -> None:
    assert len(seen) == len(set(seen)), [x for x in seen if seen.count(x) > 1]
    assert set(before) <= set(seen), sorted(set(before) - set(seen))


async def _pg(client: Client) -> Any:
    return client.stores.db.pool


async def _tied_runs(client: Client, n: int) -> list[int]:
    """N runs of tq submitted in one transaction (one created_at), with tied attempts, handlers, states and
    finish times (a third unfinished)."""
    from fencepost.core.models import Submit

    ids = await client.submit_many([Submit(handler="t.echo", args=(i,), queue="tq") for i in range(n)])
    await (await _pg(client)).execute(
        "UPDATE runs SET attempt = id % 3, handler = CASE WHEN id % 2 = 0 THEN 't.echo' ELSE 't.noop' END, "
        "status = (ARRAY['PENDING', 'FAILED', 'SUCCEEDED'])[id % 3 + 1], "
        "finished_at = CASE WHEN id % 3 = 0 THEN NULL ELSE date_trunc('second', now()) + (id % 2) * interval '1 s' END "
        "WHERE id = ANY($1)", ids)
    return ids


_RUN_SORTS = [(s, o) for s in ("id", "created_at", "finished_at", "attempt", "handler", "status") for o in ("asc", "desc")]


@pytest.mark.parametrize("sort,order", _RUN_SORTS)
async def test_the_runs_list_pages_by_cursor_in_every_sort_with_ties_and_inserts(
        api: Api, client: Client, sort: str, order: str) -> None:
    ids = await _tied_runs(client, 23)
    rows = {r["id"]: dict(r) for r in await (await _pg(client)).fetch("SELECT * FROM runs WHERE id = ANY($1)", ids)}

    def expected_key(rid: int) -> Any:
        v = rows[rid][sort] if sort != "id" else rid
        if sort == "finished_at":  # NULL last in both orders
            return (v is None, (v.timestamp() if v else 0) * (1 if order == "asc" else -1), rid * (1 if order == "asc" else -1))
        return (v, rid)

    expected = sorted(ids, key=expected_key, reverse=order == "desc" and sort != "finished_at")
    got = await _walk(api, "/v1/runs", {"queue": "tq", "sort": sort, "order": order}, 5, lambda x: x["id"])
    assert got == expected, (got, expected)

    async def insert() -> None:
        await client.submit("t.echo", 0, queue="tq")

    walked = await _walk(api, "/v1/runs", {"queue": "tq", "sort": sort, "order": order}, 4, lambda x: x["id"], insert)
    _once(walked, ids)


async def test_the_fleet_history_pages_by_cursor_through_rows_sharing_a_time(api: Api, client: Client) -> None:
    """Submits of one transaction share created_at, events and attempts' claims and finishes share `at`, in the
    order a reader of the history sees them (stream entries newest first, then the rest by id)."""
    from fencepost.core.models import Submit

    rids = await client.submit_many([Submit(handler="t.echo", args=(i,), queue="tq") for i in range(9)])
    pg = await _pg(client)
    t1 = await pg.fetchval("SELECT date_trunc('second', now()) - interval '1 minute'")
    for i in range(12):
        await pg.execute("INSERT INTO events (queue, type, actor, at, stream, stream_id) VALUES ('tq', 'queue_paused', "
                         "'cli:x', $1, $2, $3)", t1, "s" if i % 2 else None, 9000 + i if i % 2 else None)
    for i, rid in enumerate(rids[:4]):
        await pg.execute(
            "INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome, claim_version, "
            "claim_stream_id, finish_type, finish_from, finish_to, finish_version, finish_stream_id) "
            "VALUES ($1, 1, 1, 'w', $2, $2, 'succeeded', 1, $3::bigint, 'succeeded', 'RUNNING', 'SUCCEEDED', 2, $3::bigint + 1)",
            rid, t1, 7000 + 2 * i)
    hist = await pg.fetch("SELECT h.id, h.at, COALESCE(h.stream_id, -1) AS s FROM history h "
                          "LEFT JOIN runs r ON r.id = h.run_id WHERE COALESCE(r.queue, h.queue) = 'tq'")
    expected = [h["id"] for h in sorted(hist, key=lambda h: (h["at"], h["s"], h["id"]), reverse=True)]
    since = {"queue": "tq", "since": "2000-01-01T00:00:00+00:00"}
    got = await _walk(api, "/v1/events", since, 4, lambda e: e["id"])
    assert got == expected, (got, expected)
    assert len(expected) == 9 + 12 + 8

    async def insert() -> None:
        await client.submit("t.echo", 0, queue="tq")
        await pg.execute("INSERT INTO events (queue, type, actor, at) VALUES ('tq', 'queue_paused', 'cli:x', $1)", t1)

    _once(await _walk(api, "/v1/events", since, 3, lambda e: e["id"], insert), expected)
    # a scoped operator walks its own queue's history only
    mine = await _walk(api, "/v1/events", {"since": since["since"]}, 5, lambda e: (e["id"], e["queue"]), who="op_tq")
    assert {q for _, q in mine} == {"tq"} and len(mine) == len(set(mine))


async def test_a_runs_timeline_pages_by_cursor_in_the_order_recorded(api: Api, client: Client) -> None:
    rid = await client.submit("t.echo", 1, queue="tq")
    pg = await _pg(client)
    t1 = await pg.fetchval("SELECT date_trunc('second', now())")
    for i in range(11):
        await pg.execute("INSERT INTO events (run_id, type, actor, at, stream, stream_id) VALUES ($1, 'checkpointed', "
                         "'worker', $2, $3, $4)", rid, t1, "s" if i % 3 else None, 8000 - i if i % 3 else None)
    await pg.execute(
        "INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome, claim_version, "
        "claim_stream_id, finish_type, finish_from, finish_to, finish_version, finish_stream_id) "
        "VALUES ($1, 1, 1, 'w', $2, $2, 'succeeded', 1, 7990, 'succeeded', 'RUNNING', 'SUCCEEDED', 2, 7995)", rid, t1)
    expected = [r["id"] for r in await client.stores.db.fetch("run_events", rid)]
    assert len(expected) == 1 + 11 + 2
    got = await _walk(api, f"/v1/runs/{rid}/events", {}, 3, lambda e: e["id"])
    assert got == expected
    r = await api.req("GET", f"/v1/runs/{rid}/events", "admin")
    assert [e["id"] for e in r.json()] == expected and "x-next-cursor" not in r.headers, "one page by default"


async def test_the_audit_view_pages_by_cursor_through_entries_sharing_a_time(api: Api, client: Client) -> None:
    """The audit view paged by `before` (a time): entries sharing the last entry's time were lost. Log rows and
    run events may also share an id: the cursor names the source."""
    rid = await client.submit("t.echo", 1, queue="tq")
    pg = await _pg(client)
    t1 = await pg.fetchval("SELECT date_trunc('second', now()) - interval '1 minute'")
    for _ in range(8):
        await pg.execute("INSERT INTO audit_log (actor, action, queue, at) VALUES ('token:1@x', 'queue_paused', 'tq', $1)", t1)
        await pg.execute("INSERT INTO events (run_id, type, actor, at) VALUES ($1, 'paused', 'token:1@x', $2)", rid, t1)
    everything = await client.stores.db.fetch("audit_list", None, "tq", None, None, 1000, None, None)
    expected = [(r["source"], r["id"]) for r in everything]
    assert len(expected) == 16
    got = await _walk(api, "/v1/audit", {"queue": "tq"}, 3, lambda a: (a["source"], a["id"]))
    assert got == expected

    async def insert() -> None:
        await pg.execute("INSERT INTO audit_log (actor, action, queue, at) VALUES ('token:1@x', 'queue_paused', 'tq', now())")

    _once(await _walk(api, "/v1/audit", {"queue": "tq"}, 5, lambda a: (a["source"], a["id"]), insert), expected)
    old = await api.req("GET", "/v1/audit", "admin", params={"queue": "tq", "before": t1.isoformat()})
    assert old.status_code == 200 and old.json() == [], "before: entries before that time, as before"


@pytest.mark.parametrize("path,review", [("/v1/dead-letter", False), ("/v1/review", True)])
async def test_the_dead_letter_and_review_page_through_runs_finished_at_one_time(
        api: Api, client: Client, path: str, review: bool) -> None:
    ids = await _fail(client, "tq", 17, review=review)
    pg = await _pg(client)
    await pg.execute("UPDATE runs SET finished_at = date_trunc('second', now()) WHERE id = ANY($1)", ids[5:])
    extra: list[int] = []

    async def insert() -> None:
        extra.extend(await _fail(client, "tq", 1, review=review))

    got = await _walk(api, path, {"queue": "tq"}, 4, lambda x: x["id"], insert)
    _once(got, ids)
    legacy = await api.req("GET", path, "admin", params={"cursor": "2000-01-01T00:00:00+00:00,1"})
    assert legacy.status_code == 200 and legacy.json() == [], "the first cursors (<time>,<id>) are still taken"


async def test_schedules_and_workflows_page_by_cursor(api: Api, client: Client) -> None:
    import uuid as _uuid

    from fencepost.core.schedules import ScheduleSpec
    from fencepost.schedules import Schedules

    store = Schedules(client)
    names = [f"s-{i:02d}" for i in range(8)]
    for n in names:
        await store.add(ScheduleSpec(name=n, handler="t.noop", cron="0 3 * * *"))
    added = iter(f"s-{i:02d}x" for i in range(50))

    async def add_schedule() -> None:
        await store.add(ScheduleSpec(name=next(added), handler="t.noop", cron="0 3 * * *"))

    got = await _walk(api, "/v1/schedules", {}, 3, lambda s: s["name"], add_schedule)
    _once(got, names)
    assert got == sorted(got)
    pg = await _pg(client)
    t1 = await pg.fetchval("SELECT now()")
    wids = [_uuid.uuid4() for _ in range(7)]
    for w in wids:
        await pg.execute("INSERT INTO workflows (id, name, created_at) VALUES ($1, 'w', $2)", w, t1)

    async def add_workflow() -> None:
        await pg.execute("INSERT INTO workflows (id, name, created_at) VALUES ($1, 'w', now())", _uuid.uuid4())

    got_w = await _walk(api, "/v1/workflows", {}, 3, lambda w: w["id"], add_workflow)
    _once(got_w, [str(w) for w in wids])


_CURSOR_ROUTES = ["/v1/runs", "/v1/events", "/v1/audit", "/v1/dead-letter", "/v1/review", "/v1/schedules",
                  "/v1/workflows", "/v1/runs/{rid}/events"]


@pytest.mark.parametrize("path", _CURSOR_ROUTES)
async def test_a_bad_cursor_is_a_422_naming_the_cursor(api: Api, client: Client, path: str) -> None:
    from fencepost.core import cursors

    rid = await client.submit("t.echo", 1, queue="tq")
    path = path.format(rid=rid)
    other = cursors.encode("schedules", ["x"]) if path != "/v1/schedules" else cursors.encode("events", [
        "2026-01-01T00:00:00+00:00", 1, 2, 3])
    for bad in ("!!!", "bm90IGpzb24", other, cursors.encode("runs/id/desc", [5])[:-2] + "zz"):
        if path == "/v1/runs" and bad == other:
            continue
        r = await api.req("GET", path, "admin", params={"cursor": bad})
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["field"] == "cursor", r.json()
    if path == "/v1/runs":
        by_id = cursors.encode("runs/id/desc", [5])
        r = await api.req("GET", path, "admin", params={"cursor": by_id, "sort": "created_at"})
        assert r.status_code == 422 and r.json()["field"] == "cursor", "a cursor of another sort"
        r = await api.req("GET", path, "admin", params={"cursor": by_id, "offset": 10})
        assert r.status_code == 422 and r.json()["field"] == "cursor", "cursor and offset"


async def test_the_cli_pages_ls_events_and_audit_with_cursor_and_all(settings: Settings, client: Client,
                                                                     tmp_path: Any) -> None:
    """`fencepost ls / events / audit` print the next page's cursor (stderr), take it back with --cursor and
    walk every page with --all: on the stores, and `events` through the API too."""
    import asyncio
    import subprocess
    import sys

    from fencepost.api.auth import create_token
    from fencepost.core.models import Submit
    from tests.conftest import ROOT, stop, worker_env
    from tests.test_api import start_api

    ids = await client.submit_many([Submit(handler="t.echo", args=(i,), queue="tq") for i in range(7)])
    pg = await _pg(client)
    for _ in range(5):
        await pg.execute("INSERT INTO audit_log (actor, action, queue, at) VALUES ('cli:x', 'queue_paused', 'tq', "
                         "date_trunc('second', now()))")

    async def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        out = await asyncio.to_thread(lambda: subprocess.run(
            [sys.executable, "-m", "fencepost.cli", *args], cwd=ROOT, env=worker_env(settings, **env),
            capture_output=True, text=True, timeout=60))
        assert out.returncode == 0, out.stderr
        return out

    first = await cli("ls", "--queue", "tq", "--limit", "3", "--json")
    cursor = first.stderr.split("next page: --cursor ")[1].split()[0]
    second = await cli("ls", "--queue", "tq", "--limit", "3", "--json", "--cursor", cursor)
    every = await cli("ls", "--queue", "tq", "--limit", "3", "--json", "--all")
    ls = [r["id"] for r in json.loads(first.stdout)] + [r["id"] for r in json.loads(second.stdout)]
    assert ls == sorted(ids, reverse=True)[:6]
    assert [r["id"] for r in json.loads(every.stdout)] == sorted(ids, reverse=True) and "next page" not in every.stderr
    audit = json.loads((await cli("audit", "--queue", "tq", "--limit", "2", "--all", "--json")).stdout)
    assert len(audit) == 5 and len({a["id"] for a in audit}) == 5
    fleet = json.loads((await cli("events", "--queue", "tq", "--limit", "2", "--all", "--json")).stdout)
    assert sorted(-e["id"] for e in fleet if e["type"] == "submitted") == sorted(ids)
    _, secret = await create_token(client.stores.db, "operator", ["tq"], "oncall", "test")
    proc, url = await start_api(settings, tmp_path / "api.log")
    try:
        via = json.loads((await cli("events", "--queue", "tq", "--limit", "2", "--all", "--json", FENCEPOST_API_URL=url,
                                    FENCEPOST_API_TOKEN=secret)).stdout)
        assert [e["id"] for e in via] == [e["id"] for e in fleet]
        page = await cli("events", "--queue", "tq", "--limit", "4", FENCEPOST_API_URL=url, FENCEPOST_API_TOKEN=secret)
        assert "next page: --cursor " in page.stderr
    finally:
        stop([proc])


async def test_batches_page_by_cursor_through_batches_created_in_one_instant(
        api: Api, client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """GET /v1/batches paged by time (`before` = the last batch's created_at): the other batches created in
    that instant were skipped. Its `next` is a cursor now; a scoped token's short page (the bounded scan)
    has one too, where the scan stopped."""
    from fencepost.api import routes_ops

    pg = await _pg(client)
    tq = [await client.submit("t.echo", i, queue="tq") for i in range(10)]
    other = [await client.submit("t.echo", i, queue="other") for i in range(8)]
    t1 = await pg.fetchval("SELECT date_trunc('second', now()) - interval '1 minute'")
    made: list[str] = []
    for i, rid in enumerate(tq + other):  # 7 tq batches in one instant, 3 older; 8 of `other`, newest
        at = t1 + timedelta(seconds=60) if rid in other else t1 if i < 7 else t1 - timedelta(seconds=i)
        made.append(str(await pg.fetchval(
            "WITH b AS (INSERT INTO batches (id, name, created_at) VALUES (gen_random_uuid(), $1, $2) RETURNING id) "
            "INSERT INTO batch_members (run_id, batch_id) SELECT $3, id FROM b RETURNING batch_id", f"b{i}", at, rid)))
    rows = await pg.fetch("SELECT id::text AS id, created_at FROM batches")
    expected = [r["id"] for r in sorted(rows, key=lambda r: (r["created_at"], r["id"]), reverse=True)]

    async def walk(who: str, limit: int) -> list[str]:
        seen: list[str] = []
        cursor = None
        for _ in range(50):
            r = await api.req("GET", "/v1/batches", who, params={"limit": limit, **({"cursor": cursor} if cursor else {})})
            assert r.status_code == 200, r.text
            seen += [b["id"] for b in r.json()["batches"]]
            cursor = r.json()["next"]
            if cursor is None:
                return seen
        raise AssertionError("no last page")

    assert await walk("admin", 2) == expected
    assert await walk("admin", 3) == expected
    monkeypatch.setattr(routes_ops, "BATCH_SCAN", 4)  # a scoped page reads at most 4 batches' members
    assert await walk("op_tq", 2) == [b for b in expected if b in made[:10]]
    r = await api.req("GET", "/v1/batches", "admin", params={"cursor": cursors.encode("batches", [t1, "not-a-uuid"])})
    assert r.status_code == 422 and r.json()["field"] == "cursor", r.text
