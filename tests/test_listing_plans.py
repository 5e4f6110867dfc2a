"""Listing routes at 1,000,000 runs (issue 24): each page reads a bounded range through an index, whatever
the table holds. Asserted on the statements a route sends, EXPLAIN ANALYZEd with the route's own parameters
on a small dataset laid out as the 1M bench's is (one big queue, a newer block of another): the rows a page
reads from `runs`, `events` and `attempts` stay near what it shows. Sorts no index serves are refused with a
422 naming `sort` when the filters match more runs than the count cap."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from fencepost.api import ApiConfig, routes_runs
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.record import query
from tests.test_api import Api, _make_api


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        yield a


def _pool(api: Api) -> Any:
    return api.client.stores.db.pool


def _record_statements(api: Api, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    """The named queries the app sends from now on, with their arguments."""
    db = api.app.state.api.client.stores.db
    sent: list[tuple[str, tuple[Any, ...]]] = []

    def recording(read: Any) -> Any:
        async def recorded(name: str, *args: Any, **kw: Any) -> Any:
            sent.append((name, args))
            return await read(name, *args, **kw)
        return recorded

    for method in ("fetch", "rows"):  # a page of untyped Records or of typed rows
        monkeypatch.setattr(db, method, recording(getattr(db, method)))
    return sent


def _rows_read(plan: dict[str, Any], tables: set[str], index: str | None = None) -> int:
    """Rows the plan read from TABLES (a partition counts as its table; INDEX: only through that index):
    returned plus filtered out, per loop."""
    n = 0
    rel = plan.get("Relation Name", "")
    if any(rel == t or rel.startswith(f"{t}_") for t in tables) and index in (None, plan.get("Index Name")):
        loops = plan.get("Actual Loops", 1)
        n += int((plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
                  + plan.get("Rows Removed by Index Recheck", 0)) * loops)
    return n + sum(_rows_read(p, tables, index) for p in plan.get("Plans", []))


async def _explain(api: Api, name: str, args: tuple[Any, ...], *, no_seqscan: bool = False) -> dict[str, Any]:
    """The plan of a named query with the route's arguments, as run. NO_SEQSCAN: as a large table is read (a
    small one is read whole, whatever the statement)."""
    async with _pool(api).acquire() as conn, conn.transaction():
        if no_seqscan:
            await conn.execute("SET LOCAL enable_seqscan = off")
        raw = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {query(name)}", *args)
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


async def _fill(api: Api, big: int = 20_000, newer: int = 5_000) -> None:
    """BIG runs of tq (PENDING, the oldest ids), then NEWER runs of `other` (SUCCEEDED), as the bench's
    1,000,000 pending runs sit below its finished ones."""
    await _pool(api).execute(f"""
        INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, attempt, created_at, run_at,
                          finished_at)
        SELECT i, 't.echo', CASE WHEN i <= {big} THEN 'tq' ELSE 'other' END,
               CASE WHEN i <= {big} THEN 'PENDING' ELSE 'SUCCEEDED' END, '\\x929180'::bytea, 3, 60,
               CASE WHEN i <= {big} THEN 0 ELSE 1 END, now() - make_interval(secs => {big + newer} - i), now(),
               CASE WHEN i <= {big} THEN NULL ELSE now() END
        FROM generate_series(1, {big + newer}) i""")
    await _pool(api).execute(f"SELECT setval(pg_get_serial_sequence('runs', 'id'), {big + newer + 1})")
    await _pool(api).execute("ANALYZE runs")


@pytest.mark.parametrize("who,params", [
    ("admin", {"queue": "tq", "status": "PENDING"}),
    ("op_tq", {}),
    ("admin", {"queue": "tq"}),
    ("admin", {"queue": "tq", "sort": "status", "order": "asc"}),
])
async def test_a_queue_listing_reads_one_index_range_per_state_not_the_queue(
        api: Api, monkeypatch: pytest.MonkeyPatch, who: str, params: dict[str, str]) -> None:
    """`/v1/runs?queue=...` (and a scoped token's list) read every run of the queue and sorted them, or walked
    the primary key past every newer run of other queues (57-128 ms at 1M): now one range of
    runs_queue_status per state, each limited, so a page reads at most states x limit rows, also deep."""
    await _fill(api)
    sent = _record_statements(api, monkeypatch)
    cursor: str | None = None
    for page in range(3):  # the first page and two deeper ones (by cursor)
        sent.clear()
        r = await api.req("GET", "/v1/runs", who, params={**params, "limit": 50, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        rows = r.json()
        assert len(rows) == 50 and all(x["queue"] == "tq" for x in rows)
        if params.get("sort") != "status":
            assert [x["id"] for x in rows] == list(range(20_000 - 50 * page, 20_000 - 50 * (page + 1), -1))
        cursor = r.headers["x-next-cursor"]
        pages = [(n, a) for n, a in sent if n.startswith("api_runs_page")]
        assert pages, sent
        for name, args in pages:
            read = _rows_read(await _explain(api, name, args), {"runs"})
            assert read <= 11 * 50 + 50, (name, read)


async def test_the_dashboards_offset_pages_of_a_queue_read_its_ranges_not_the_table(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard pages the runs list by offset: within a queue those pages read the same ranges, each up to
    limit + offset rows (the plain filter walked the primary key past every newer run of other queues)."""
    await _fill(api)
    sent = _record_statements(api, monkeypatch)
    r = await api.req("GET", "/v1/runs", "admin", params={"queue": "tq", "status": "PENDING", "offset": 100, "limit": 50})
    assert r.status_code == 200, r.text
    assert [x["id"] for x in r.json()] == list(range(19_900, 19_850, -1))
    (name, args), = [(n, a) for n, a in sent if n.startswith(("api_runs_page", "dashboard_runs"))
                     and n != "dashboard_runs_count"]
    read = _rows_read(await _explain(api, name, args), {"runs"})
    assert read <= 150 + 50, (name, read)


async def test_sorts_no_index_serves_are_offered_up_to_the_count_cap_else_a_422_naming_sort(
        api: Api, client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sorting every run by attempt, handler or status was a sort of the table (200-920 ms at 1M). They are
    served where an index or a filter makes them cheap (status within a queue; the column a filter fixes),
    and as a top-N sort of at most COUNT_CAP matches (X-Total-Count-Exact: true); else refused, naming sort."""
    monkeypatch.setattr(routes_runs, "COUNT_CAP", 5)
    for i in range(8):
        await client.submit("t.echo", i, queue="tq")
    other = [await client.submit("t.noop", queue="other") for _ in range(3)]
    await _pool(api).execute("UPDATE runs SET attempt = id % 3 WHERE true")
    for sort in ("attempt", "handler", "status"):
        r = await api.req("GET", "/v1/runs", "admin", params={"sort": sort})
        assert r.status_code == 422, (sort, r.text)
        body = r.json()
        assert body["field"] == "sort" and sort in body["detail"] and "5" in body["detail"], body
        r = await api.req("GET", "/v1/runs", "admin", params={"sort": sort, "queue": "other", "order": "asc"})
        assert r.status_code == 200, r.text
        assert sorted(x["id"] for x in r.json()) == sorted(other)
        assert r.headers["x-total-count-exact"] == "true"
    # an index serves these whatever the count
    for params in ({"sort": "status", "queue": "tq"}, {"sort": "status", "status": "PENDING"},
                   {"sort": "handler", "handler": "t.echo"}):
        r = await api.req("GET", "/v1/runs", "admin", params=params)
        assert r.status_code == 200, (params, r.text)
    r = await api.req("GET", "/v1/runs", "op_tq", params={"sort": "status"})  # a scoped token: its queues
    assert r.status_code == 200 and {x["queue"] for x in r.json()} == {"tq"}, r.text
    r = await api.req("GET", "/v1/runs", "op_tq", params={"sort": "attempt"})
    assert r.status_code == 422 and r.json()["field"] == "sort"


async def test_the_fleet_history_loses_no_row_where_two_queues_streams_share_an_id(api: Api, client: Client) -> None:
    """An attempt's claim or finish has minus its stream id for id, and two queues' streams hand out the same
    ids: three runs of three queues claimed and finished in one millisecond under one stream id were one
    cursor key (time, stream id, id), and a page ending on one of them skipped the others."""
    rids = [await client.submit("t.echo", i, queue=q) for i, q in enumerate(("tq", "other", "third"))]
    t1 = await _pool(api).fetchval("SELECT date_trunc('second', now()) - interval '1 minute'")
    await _pool(api).execute("""
        INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome, claim_version,
                              claim_stream_id, finish_type, finish_from, finish_to, finish_version, finish_stream_id)
        SELECT id, 1, 1, 'w', $2, $2, 'succeeded', 1, 7000, 'succeeded', 'RUNNING', 'SUCCEEDED', 2, 7001
        FROM unnest($1::bigint[]) AS u(id)""", rids, t1)
    hist = await _pool(api).fetch("SELECT id, run_id FROM history WHERE run_id = ANY($1)", rids)
    assert len(hist) == 9  # a submit, a claim and a finish each
    want = sorted((h["id"], h["run_id"]) for h in hist)
    since = (t1 - timedelta(seconds=1)).isoformat()
    for limit in (1, 2, 4):
        seen: list[tuple[int, int]] = []
        cursor = None
        for _ in range(20):
            r = await api.req("GET", "/v1/events", "admin", params={"since": since, "limit": limit,
                                                                   **({"cursor": cursor} if cursor else {})})
            assert r.status_code == 200, r.text
            seen += [(e["id"], e["run_id"]) for e in r.json() if e["run_id"] in rids]
            cursor = r.headers.get("x-next-cursor")
            if cursor is None:
                break
        assert sorted(seen) == want and len(seen) == len(set(seen)), (limit, seen)
    # a cursor of the three-part key (an older API's) still pages on, as it meant then
    legacy = base64.urlsafe_b64encode(json.dumps(["events", t1.isoformat(), 7001, -7001]).encode()).decode()
    r = await api.req("GET", "/v1/events", "admin", params={"since": since, "cursor": legacy.rstrip("=")})
    assert r.status_code == 200, r.text
    assert sorted((e["id"], e["run_id"]) for e in r.json() if e["run_id"] in rids) == sorted(
        (-7000, rid) for rid in rids), r.json()  # the claims: older than every finish at that key


@pytest.mark.parametrize("who,params", [("admin", {"queue": "tq"}), ("op_tq", {})])
async def test_a_queue_filter_on_the_fleet_history_reads_the_pages_time_span_not_the_window(
        api: Api, client: Client, monkeypatch: pytest.MonkeyPatch, who: str, params: dict[str, str]) -> None:
    """A queue whose history is claims and finishes (no event rows) had the events half of GET /v1/events read
    every event of the window to find none of its own (events carry no queue; 400-580 ms at 1M). The attempts
    half fills the page first, and the events half reads only the page's time span. A scoped token's submits
    are read queue by queue (its queues in one scan walked every queue's runs of the window: 480-750 ms)."""
    await _pool(api).execute("""
        INSERT INTO events (queue, type, actor, at)
        SELECT 'other', 'queue_paused', 'cli:x', now() - make_interval(secs => i * 0.36) FROM generate_series(1, 5000) i""")
    await _pool(api).execute("""
        INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, created_at, run_at, submitted_by)
        SELECT 200000 + i, 't.echo', 'other', 'PENDING', '\\x929180'::bytea, 3, 60, now() - make_interval(secs => i * 0.01),
               now(), 'token:1@x'
        FROM generate_series(1, 5000) i""")
    await _pool(api).execute("""
        INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, attempt, created_at, run_at,
                          finished_at)
        SELECT 100000 + i, 't.echo', 'tq', 'SUCCEEDED', '\\x929180'::bytea, 3, 60, 1, now(), now(), now()
        FROM generate_series(1, 200) i""")
    await _pool(api).execute("""
        INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome, claim_version,
                              claim_stream_id, finish_type, finish_from, finish_to, finish_version, finish_stream_id, queue)
        SELECT 100000 + i, 1, 1, 'w', now() - make_interval(secs => i * 0.05), now() - make_interval(secs => i * 0.05),
               'succeeded', 1, 9000000 + 2 * i, 'succeeded', 'RUNNING', 'SUCCEEDED', 2, 9000000 + 2 * i + 1, 'tq'
        FROM generate_series(1, 200) i""")
    await _pool(api).execute("ANALYZE events")
    await _pool(api).execute("ANALYZE runs")
    sent = _record_statements(api, monkeypatch)
    r = await api.req("GET", "/v1/events", who, params={**params, "limit": 50})
    assert r.status_code == 200, r.text
    assert len(r.json()) == 50 and {e["queue"] for e in r.json()} == {"tq"}
    (name, args), = [(n, a) for n, a in sent if n != "known_queue"]
    plan = await _explain(api, name, args, no_seqscan=True)
    read = _rows_read(plan, {"events"})
    assert read < 500, f"{name} read {read} event rows for a page of tq's claims and finishes"
    read = _rows_read(plan, {"runs"}, "runs_created_page")  # the submits of every queue, in time order
    assert read < 500, f"{name} read {read} runs of other queues for tq's submits"


@pytest.mark.parametrize("who,params", [("admin", {"queue": "tq"}), ("op_tq", {})])
async def test_a_queue_filter_on_the_audit_view_reads_its_pages_rows_not_other_queues(
        api: Api, monkeypatch: pytest.MonkeyPatch, who: str, params: dict[str, str]) -> None:
    """`/v1/audit?queue=...` (and a scoped token's audit view) walked audit_log_at_id from the cursor past
    every other queue's entry, and the run commands' half walked every operator command older than the
    cursor when the queue had fewer than a page of them (38-70 ms deep at 1M). Now the log is read queue by
    queue on audit_log_queue_at_id (up to a page per queue) and the run commands' half only within the time
    span of a page the log's half fills, whatever the depth and the other queues."""
    await _pool(api).execute("""
        INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, created_at, run_at)
        SELECT 300000 + i, 't.echo', CASE WHEN i = 0 THEN 'tq' ELSE 'other' END, 'PENDING', '\\x929180'::bytea,
               3, 60, now(), now()
        FROM generate_series(0, 9) i""")
    # 5,000 log entries a tenth of them tq's, and 2,500 run commands among them, 50 of them on tq's run
    await _pool(api).execute("""
        INSERT INTO audit_log (actor, action, queue, at)
        SELECT 'token:2@x', 'queue_paused', CASE WHEN i % 10 = 0 THEN 'tq' ELSE 'other' END,
               now() - make_interval(secs => i * 0.36)
        FROM generate_series(1, 5000) i""")
    await _pool(api).execute("""
        INSERT INTO events (run_id, queue, type, actor, at)  -- each with its run's queue, as written since 047
        SELECT 300000 + CASE WHEN i % 100 = 50 THEN 0 ELSE 1 + i % 9 END, CASE WHEN i % 100 = 50 THEN 'tq' ELSE 'other' END,
               'paused', 'token:2@x', now() - make_interval(secs => i * 0.36 + 0.1)
        FROM generate_series(2, 5000, 2) i""")
    await _pool(api).execute("ANALYZE audit_log")
    await _pool(api).execute("ANALYZE events")
    want = [(r["source"], r["id"]) for r in await _pool(api).fetch("""
        SELECT * FROM (SELECT 'config' AS source, id, at FROM audit_log WHERE queue = 'tq'
                       UNION ALL SELECT 'run', id, at FROM events WHERE run_id = 300000) x
        ORDER BY at DESC, id DESC, source DESC""")]
    assert len(want) == 550
    sent = _record_statements(api, monkeypatch)
    seen: list[tuple[str, int]] = []
    cursor: str | None = None
    for page in range(11):  # every page, the last ones deep in the log
        sent.clear()
        r = await api.req("GET", "/v1/audit", who, params={**params, "limit": 50, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        rows = r.json()
        assert len(rows) == 50 and {x["queue"] for x in rows} == {"tq"}, rows
        seen += [(x["source"], x["id"]) for x in rows]
        cursor = r.headers.get("x-next-cursor")
        if page in (0, 5, 9):
            (name, args), = [(n, a) for n, a in sent if n == "audit_list"]
            plan = await _explain(api, name, args, no_seqscan=True)
            log, commands = _rows_read(plan, {"audit_log"}), _rows_read(plan, {"events"})
            assert log <= 2 * 50 and commands <= 300, (
                f"page {page}: {name} read {log} log entries and {commands} run commands for a page of tq's")
    assert seen == want


async def _other_queues_history(api: Api) -> None:
    """The last hour of queue `other` as the recorder writes it since 047 (each row with its queue): 5,000 event
    rows of its runs (retries, operator commands) and 5,000 claims and finishes, and submits of its runs."""
    await _pool(api).execute("""
        INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, attempt, created_at, run_at,
                          finished_at, submitted_by)
        SELECT 400000 + i, 't.echo', 'other', 'SUCCEEDED', '\\x929180'::bytea, 3, 60, 1,
               now() - make_interval(secs => i * 0.7), now(), now(), 'token:1@x'
        FROM generate_series(1, 5000) i""")
    await _pool(api).execute("""
        INSERT INTO events (run_id, queue, type, from_status, to_status, version, actor, at)
        SELECT 400000 + i, 'other', 'paused', 'PENDING', 'PAUSED', 1, 'token:2@x', now() - make_interval(secs => i * 0.7)
        FROM generate_series(1, 5000) i""")
    await _pool(api).execute("""
        INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome, claim_version,
                              claim_stream_id, finish_type, finish_from, finish_to, finish_version, finish_stream_id, queue)
        SELECT 400000 + i, 1, 1, 'w', now() - make_interval(secs => i * 0.7), now() - make_interval(secs => i * 0.7 - 0.1),
               'succeeded', 2, 8000000 + 2 * i, 'succeeded', 'RUNNING', 'SUCCEEDED', 3, 8000000 + 2 * i + 1, 'other'
        FROM generate_series(1, 5000) i""")
    for table in ("events", "attempts", "runs"):
        await _pool(api).execute(f"ANALYZE {table}")


@pytest.mark.parametrize("who,params", [("admin", {"queue": "tq"}), ("op_tq", {})])
async def test_the_history_of_a_queue_with_nothing_in_the_window_reads_no_other_queues_rows(
        api: Api, monkeypatch: pytest.MonkeyPatch, who: str, params: dict[str, str]) -> None:
    """GET /v1/events of a queue that had nothing in the window (and a scoped token's history) read every event,
    claim and finish of the window to find none of its own: a row's queue was its run's (0.3-1.1 s at 1M with
    20,000 commands in the hour). Each half now reads the queue's own range of 047's indexes: nothing here."""
    await _other_queues_history(api)
    sent = _record_statements(api, monkeypatch)
    r = await api.req("GET", "/v1/events", who, params={**params, "limit": 50})
    assert r.status_code == 200, r.text
    assert r.json() == []
    (name, args), = [(n, a) for n, a in sent if n == "fleet_events_page"]
    plan = await _explain(api, name, args, no_seqscan=True)
    read = {t: _rows_read(plan, {t}) for t in ("events", "attempts")}
    assert all(n <= 5 for n in read.values()), f"{name} read {read} rows for a queue with no history in the window"


async def test_a_queues_history_pages_read_its_own_rows_whatever_the_other_queues_hold(
        api: Api, client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of a queue with a few rows among another queue's thousands reads about a page of rows, first page
    and deep, and a row written without its queue (an older recorder during an upgrade) is found through its run."""
    await _other_queues_history(api)
    rid = await client.submit("t.echo", 1, queue="tq")
    await _pool(api).execute("""
        INSERT INTO events (run_id, queue, type, from_status, to_status, version, actor, at)
        SELECT $1, 'tq', 'paused', 'PENDING', 'PAUSED', i, 'token:2@x', now() - make_interval(secs => i * 7.1)
        FROM generate_series(1, 120) i""", rid)
    await _pool(api).execute("""
        INSERT INTO events (run_id, type, from_status, to_status, version, actor, at)
        VALUES ($1, 'resumed', 'PAUSED', 'PENDING', 999, 'token:2@x', now() - interval '1 second')""", rid)
    sent = _record_statements(api, monkeypatch)
    seen: list[int] = []
    cursor: str | None = None
    for page in range(4):
        sent.clear()
        r = await api.req("GET", "/v1/events", "admin",
                          params={"queue": "tq", "limit": 50, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        assert {e["queue"] for e in r.json()} <= {"tq"}
        seen += [e["id"] for e in r.json()]
        (name, args), = [(n, a) for n, a in sent if n == "fleet_events_page"]
        plan = await _explain(api, name, args, no_seqscan=True)
        read = _rows_read(plan, {"events", "attempts"})
        assert read <= 4 * 50, f"page {page}: {name} read {read} history rows for a page of tq's"
        cursor = r.headers.get("x-next-cursor")
        if cursor is None:
            break
    want = [r["id"] for r in await _pool(api).fetch(
        "SELECT id FROM events WHERE run_id = $1 ORDER BY at DESC, id DESC", rid)]
    assert [i for i in seen if i > 0] == want and len(want) == 121, "every row of tq, the queue-less one too"


async def test_the_audit_view_of_a_queue_of_run_commands_reads_its_own_commands_deep_in_the_log(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue whose audit page is mostly commands on its runs (no log rows to bound the span) looked each
    command's run up and read other queues' commands from the cursor down (55-227 ms deep at 1M with 20,000
    commands); its commands are now one range of events_operator_queue_at."""
    await _other_queues_history(api)
    await _pool(api).execute("""
        INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, created_at, run_at)
        VALUES (500000, 't.echo', 'tq', 'PENDING', '\\x929180'::bytea, 3, 60, now(), now())""")
    await _pool(api).execute("""
        INSERT INTO events (run_id, queue, type, actor, at)
        SELECT 500000, 'tq', 'paused', 'token:2@x', now() - make_interval(secs => i * 29.3) FROM generate_series(1, 120) i""")
    await _pool(api).execute("ANALYZE events")
    sent = _record_statements(api, monkeypatch)
    seen = 0
    cursor: str | None = None
    for page in range(4):
        sent.clear()
        r = await api.req("GET", "/v1/audit", "admin",
                          params={"queue": "tq", "limit": 50, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        assert {x["queue"] for x in r.json()} <= {"tq"}
        seen += len(r.json())
        (name, args), = [(n, a) for n, a in sent if n == "audit_list"]
        plan = await _explain(api, name, args, no_seqscan=True)
        read = _rows_read(plan, {"events"})
        assert read <= 2 * 50, f"page {page}: {name} read {read} run commands for a page of tq's"
        cursor = r.headers.get("x-next-cursor")
        if cursor is None:
            break
    assert seen == 120


async def _many_queues_history(api: Api, queues: int, per_queue: int, *, busy: int = 0) -> None:
    """QUEUES queues (q0, q1, ...) with PER_QUEUE claims and finishes each in the last 20 minutes, times
    interleaved across queues and on whole seconds (rows of several queues share a time), every fifth queue
    empty; BUSY claims and finishes of queue `busy` besides; each run a submit."""
    await _pool(api).execute("INSERT INTO queues (name) SELECT 'q' || i FROM generate_series(0, $1 - 1) i "
                             "UNION ALL SELECT 'busy' ON CONFLICT DO NOTHING", queues)
    await _pool(api).execute("""
        INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, attempt, created_at, run_at,
                          finished_at, submitted_by)
        SELECT 600000 + n, 't.echo', queue, 'SUCCEEDED', '\\x929180'::bytea, 3, 60, 1, at - interval '2 seconds',
               now(), now(), 'token:1@x'
        FROM (SELECT row_number() OVER () AS n, queue, at FROM (
                  SELECT 'q' || i AS queue, date_trunc('second', now()) - make_interval(secs => (j * $1 + i) * 7 % 1200) AS at
                  FROM generate_series(0, $1 - 1) i, generate_series(1, $2) j WHERE i % 5 <> 0
                  UNION ALL
                  SELECT 'busy', date_trunc('second', now()) - make_interval(secs => k * 1200 / $3) FROM generate_series(1, $3) k
              ) x) y""", queues, per_queue, busy)
    await _pool(api).execute("""
        INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome, claim_version,
                              claim_stream_id, finish_type, finish_from, finish_to, finish_version, finish_stream_id, queue)
        SELECT id, 1, 1, 'w', created_at + interval '2 seconds', created_at + make_interval(secs => 2 + id % 3),
               'succeeded', 2, 1000 + 2 * (id % 97), 'succeeded', 'RUNNING', 'SUCCEEDED', 3, 1001 + 2 * (id % 97), queue
        FROM runs WHERE id > 600000""")
    for table in ("attempts", "runs", "queues"):
        await _pool(api).execute(f"ANALYZE {table}")


async def test_an_unfiltered_fleet_history_page_reads_about_a_page_whatever_the_number_of_queues(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unfiltered GET /v1/events read the attempts' claims and finishes queue by queue, up to a page from
    each queue: queues x limit rows of each half (395 ms at 500 queues). A probe per queue now finds its newest
    row, and only rows at or after the limit-th newest of those are read: one index entry per queue and about a
    page of rows, first page and deep."""
    await _many_queues_history(api, queues=200, per_queue=10)
    sent = _record_statements(api, monkeypatch)
    cursor: str | None = None
    for page in range(3):
        sent.clear()
        r = await api.req("GET", "/v1/events", "admin", params={"limit": 50, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        assert len(r.json()) == 50
        cursor = r.headers["x-next-cursor"]
        (name, args), = [(n, a) for n, a in sent if n == "fleet_events_page"]
        read = _rows_read(await _explain(api, name, args, no_seqscan=True), {"attempts"})
        # claims and finishes: a probe per queue, and the rows at or after the threshold (604 here)
        assert read <= 2 * (201 + 4 * 50), f"page {page}: {name} read {read} attempt rows for a page of 50"


@pytest.mark.parametrize("limit", [50, 7])
async def test_the_unfiltered_fleet_history_pages_are_the_history_in_order_with_a_busy_queue_and_empty_ones(
        api: Api, limit: int) -> None:
    """The threshold reads fewer rows, not other ones: paging the unfiltered history of one busy queue, many quiet
    ones, empty ones and rows of several queues at one time gives every row of the window once, in the page order
    (at, stream id, id, run id, newest first), as sorting the whole history gives it."""
    await _many_queues_history(api, queues=40, per_queue=3, busy=300)
    since = await _pool(api).fetchval("SELECT now() - interval '1 hour'")
    want = sorted(((h["at"], -1 if h["stream_id"] is None else h["stream_id"], h["id"], h["run_id"] or 0)
                   for h in await _pool(api).fetch(
                       "SELECT id, run_id, at, stream_id FROM history WHERE at >= $1", since)), reverse=True)
    assert len(want) > 3 * 300
    seen: list[tuple[int, int]] = []
    cursor: str | None = None
    for _ in range(12 if limit == 7 else 100):  # limit 7: the first pages; 50: every page
        r = await api.req("GET", "/v1/events", "admin", params={"since": since.isoformat(), "limit": limit,
                                                               **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        seen += [(e["id"], e["run_id"]) for e in r.json()]
        cursor = r.headers.get("x-next-cursor")
        if cursor is None:
            break
    expected = [(i, run) for _, _, i, run in want]
    assert seen == (expected if limit == 50 else expected[:len(seen)]) and len(seen) >= min(len(want), 12 * limit)


@pytest.mark.parametrize("limit", [50, 7])
async def test_a_scoped_fleet_history_of_many_queues_pages_through_every_row_of_its_queues_in_order(
        api: Api, limit: int) -> None:
    """A scoped token's history of many queues (and a queue's) reads its claims, finishes, submits and event rows
    queue by queue above the same threshold: every page is the history of those queues sorted, whatever the
    other queues hold."""
    await _many_queues_history(api, queues=40, per_queue=3, busy=300)
    await _pool(api).execute("""
        INSERT INTO events (run_id, queue, type, actor, at)
        SELECT id, queue, 'paused', 'token:2@x', created_at + interval '1 second' FROM runs WHERE id > 600000 AND id % 4 = 0""")
    await _pool(api).execute("ANALYZE events")
    since = await _pool(api).fetchval("SELECT now() - interval '1 hour'")
    history = await _pool(api).fetch("SELECT id, run_id, queue, at, stream_id FROM history WHERE at >= $1", since)
    for queue, scope in ((None, ["busy"] + [f"q{i}" for i in range(0, 40, 2)]), ("busy", None), ("q3", None)):
        want = [(h["id"], h["run_id"]) for h in sorted(
            (h for h in history if h["queue"] == queue or (scope and h["queue"] in scope)),
            key=lambda h: (h["at"], -1 if h["stream_id"] is None else h["stream_id"], h["id"], h["run_id"] or 0),
            reverse=True)]
        assert want
        seen: list[tuple[int, int]] = []
        key: list[Any] = [None, None, None, None]
        for _ in range(200):
            rows = await _pool(api).fetch(query("fleet_events_page"), since, None, queue, limit, scope, *key)
            seen += [(r["id"], r["run_id"]) for r in rows]
            if len(rows) < limit:
                break
            last = rows[-1]
            key = [last["at"], -1 if last["stream_id"] is None else last["stream_id"], last["id"], last["run_id"] or 0]
        assert seen == want, (queue, scope, limit)
