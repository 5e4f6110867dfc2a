"""Cursor pages of the listing routes at 1,000,000 runs (issue 24): the first page and a page deep in the
listing (a cursor made from a row in the middle) of every route that pages by cursor, median and max.

    .venv/bin/python bench/listing_cursors.py [--db NAME] [--build] [--repeat 20] [--only TEXT] [--explain]

--build fills database NAME (created if missing, default fp_bench_cursors) with 1,000,000 runs in 10
queues (created_at ties: 100 runs per 3 ms, as batch submits share theirs; a quarter PENDING, 5% FAILED),
750,000 attempts with claims and finishes, 220,000 events, 20,000 audit rows and 1,000 schedules, all by
generate_series (about a minute on two cores). The API runs in this process (ASGI, no sockets): what is
timed is the route with PostgreSQL and Redis. --explain prints EXPLAIN ANALYZE of each page's statement as
the route sends it (a custom plan; the deep cursor): its execution time and the indexes it reads, figures
a loaded machine disturbs less than the route's. Drop the database yourself when done.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import statistics
import time
from typing import Any

import asyncpg
import httpx

PG = os.environ.get("FENCEPOST_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
REDIS = os.environ.get("FENCEPOST_BENCH_REDIS", "redis://127.0.0.1:6379/0")

BUILD = """
INSERT INTO queues (name) SELECT 'q' || i FROM generate_series(0, 9) i ON CONFLICT DO NOTHING;
INSERT INTO runs (id, handler, queue, status, payload, max_retries, timeout_s, attempt, created_at, run_at, started_at,
                  finished_at, submitted_by, reason)
SELECT g, 'h' || (g % 20), 'q' || (g % 10),
       CASE WHEN g % 20 = 0 THEN 'FAILED' WHEN g % 4 = 1 THEN 'PENDING' ELSE 'SUCCEEDED' END,
       '\\x92a1'::bytea, 3, 60, CASE WHEN g % 4 = 1 THEN 0 ELSE 1 + g % 3 END, t, t,
       CASE WHEN g % 4 = 1 THEN NULL ELSE t + interval '1 s' END, CASE WHEN g % 4 = 1 THEN NULL ELSE t + interval '2 s' END,
       'token:1@10.0.0.1', CASE WHEN g % 20 = 0 THEN 'max_retries' END
FROM (SELECT g, now() - interval '50 minutes' + (g / 100) * interval '3 ms' AS t FROM generate_series(1, 1000000) g) s;
SELECT setval(pg_get_serial_sequence('runs', 'id'), 1000000);
INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome, claim_version, claim_stream_id,
                      finish_type, finish_from, finish_to, finish_version, finish_stream_id)
SELECT id, 1, 1, 'w1', started_at, finished_at, CASE WHEN status = 'FAILED' THEN 'error' ELSE 'succeeded' END, 1,
       (extract(epoch FROM started_at) * 1000)::bigint * 65536 + (id % 1000), lower(status), 'RUNNING', status, 2,
       (extract(epoch FROM finished_at) * 1000)::bigint * 65536 + (id % 1000) + 1000
FROM runs WHERE started_at IS NOT NULL;
INSERT INTO events (run_id, type, actor, at, stream, stream_id)
SELECT g * 4 + 2, 'checkpointed', 'worker', now() - interval '50 minutes' + (g / 50) * interval '10 ms',
       CASE WHEN g % 2 = 0 THEN 'fp:q' END, CASE WHEN g % 2 = 0 THEN 1000000000 + g END
FROM generate_series(1, 200000) g;
INSERT INTO events (run_id, type, actor, at)
SELECT g * 10, 'paused', 'token:2@10.0.0.2', now() - interval '40 minutes' + (g / 10) * interval '1 s'
FROM generate_series(1, 20000) g;
INSERT INTO audit_log (actor, action, queue, at)
SELECT 'token:2@x', 'queue_paused', 'q' || (g % 10), now() - interval '45 minutes' + (g / 10) * interval '1 s'
FROM generate_series(1, 20000) g;
INSERT INTO schedules (name, handler, payload, cron, timezone, next_fire_time, due_at)
SELECT 's' || lpad(g::text, 6, '0'), 'h1', '\\x9280'::bytea, '0 3 * * *', 'UTC', now() + interval '1 day',
       now() + interval '1 day' FROM generate_series(1, 1000) g;
"""


async def build(dsn: str) -> None:
    from fencepost.core.record import upgrade

    conn = await asyncpg.connect(dsn)
    try:
        await upgrade(conn)
        if await conn.fetchval("SELECT count(*) FROM runs") == 0:
            t0 = time.perf_counter()
            await conn.execute(BUILD)
            await conn.execute("VACUUM ANALYZE")
            print(f"built in {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        await conn.close()


async def deep_cursors(conn: asyncpg.Connection) -> dict[str, str]:
    """A cursor from a row in the middle of each listing (what page 5,000 of 100 would send)."""
    from fencepost.core import cursors

    mid = await conn.fetchrow("SELECT * FROM runs WHERE id = 500001")
    dead = await conn.fetchrow("SELECT finished_at, id FROM runs WHERE id = 500000")
    ev = await conn.fetchrow("SELECT at, stream_id, id, run_id FROM events WHERE run_id = 400002 AND type = 'checkpointed'")
    au = await conn.fetchrow("SELECT at, id FROM audit_log WHERE id = 10000")
    fin = await conn.fetchrow("SELECT * FROM runs WHERE id = 500002")  # a finished one (500001 is PENDING)
    out = {f"runs/{s}/{o}": cursors.encode(f"runs/{s}/{o}", cursors.key_of(f"runs/{s}/{o}", fin if s == "finished_at"
                                                                            else mid))
           for s in ("id", "created_at", "finished_at", "attempt", "handler", "status") for o in ("asc", "desc")}
    out["dead"] = cursors.encode("dead", [dead["finished_at"], dead["id"]])
    out["events"] = cursors.encode("events", [ev["at"], ev["stream_id"] or -1, ev["id"], ev["run_id"]])
    out["audit"] = cursors.encode("audit", [au["at"], au["id"], "config"])
    out["schedules"] = cursors.encode("schedules", ["s000500"])
    return out


def routes(deep: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    since = "2000-01-01T00:00:00+00:00"
    out: list[tuple[str, dict[str, Any]]] = []
    for s in ("id", "created_at", "finished_at", "attempt", "handler", "status"):
        for o in ("desc", "asc"):
            out += [("/v1/runs", {"sort": s, "order": o}), ("/v1/runs", {"sort": s, "order": o, "cursor": deep[f"runs/{s}/{o}"]})]
    for s in ("finished_at", "attempt", "handler", "status"):  # within one queue (a tenth of the runs)
        out.append(("/v1/runs", {"sort": s, "order": "desc", "queue": "q3", "cursor": deep[f"runs/{s}/desc"]}))
    out += [("/v1/runs", {"queue": "q3"}), ("/v1/runs", {"queue": "q3", "cursor": deep["runs/id/desc"]}),
            ("/v1/runs", {"queue": "q3", "status": "PENDING", "cursor": deep["runs/id/desc"]}),
            ("/v1/runs", {"sort": "created_at", "queue": "q3", "cursor": deep["runs/created_at/desc"]}),
            ("/v1/events", {"since": since}), ("/v1/events", {"since": since, "cursor": deep["events"]}),
            ("/v1/events", {"since": since, "queue": "q3", "cursor": deep["events"]}),
            ("/v1/runs/400002/events", {}), ("/v1/audit", {}), ("/v1/audit", {"cursor": deep["audit"]}),
            ("/v1/audit", {"queue": "q3", "cursor": deep["audit"]}),
            ("/v1/dead-letter", {}), ("/v1/dead-letter", {"cursor": deep["dead"]}),
            ("/v1/schedules", {}), ("/v1/schedules", {"cursor": deep["schedules"]})]
    return out


def _lit(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, dt.datetime):
        return f"'{v.isoformat()}'"
    if isinstance(v, list):
        return "ARRAY[" + ", ".join(_lit(x) for x in v) + "]"
    return "'" + str(v).replace("'", "''") + "'"


async def explain(dsn: str) -> None:
    """EXPLAIN ANALYZE of each page's statement as the route sends it (a custom plan, the deep cursor):
    its execution time and the indexes it reads (partitions' own index names left out)."""
    from fencepost.core.record import query
    from fencepost.core.states import Status

    c = await asyncpg.connect(dsn)
    try:
        await c.execute("SET plan_cache_mode = force_custom_plan")
        mid = await c.fetchrow("SELECT * FROM runs WHERE id = 500001")
        fin = await c.fetchrow("SELECT * FROM runs WHERE id = 500002")
        ev = await c.fetchrow("SELECT at, stream_id, id, run_id FROM events WHERE run_id = 400002")
        au = await c.fetchrow("SELECT at, id FROM audit_log WHERE id = 10000")
        dead = await c.fetchrow("SELECT finished_at, id FROM runs WHERE id = 500000")
        f = ["text", "text", "text", "timestamptz", "timestamptz", "int", "text[]", "text", "bigint", "bigint",
             "text", "text", "text", "text"]

        def filters(queue: str | None = None) -> list[Any]:
            return [queue, None, None, None, None, 100, *([None] * 8)]

        key = json.dumps([au["at"].isoformat(), au["id"], "config"])
        since = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
        ind = [*f, "text", "text", "bigint", "boolean", "timestamptz", "bigint"]
        oth = [*f, "text", "text", "bigint", "boolean", "bigint", "text", "bigint"]
        fsh = [*f, "text", "bigint", "boolean", "timestamptz", "bigint"]
        byq = ["text[]", "text[]", "text", "timestamptz", "timestamptz", "int", "text", "bigint", "bigint", "text", "text",
               "text", "text", "bigint", "text", "text", "boolean", "text", "bigint", "bigint"]
        states = [s.value for s in Status]
        evt = ["timestamptz", "text", "text", "int", "text[]", "timestamptz", "bigint", "bigint", "bigint"]
        aud = ["text", "text", "timestamptz", "timestamptz", "int", "text[]", "jsonb"]
        cases: list[tuple[str, str, list[str], list[Any]]] = [
            ("runs created_at desc", "api_runs_page_indexed", ind,
             [*filters(), "created_at", "desc", 0, True, mid["created_at"], mid["id"]]),
            ("runs id asc", "api_runs_page_indexed", ind, [*filters(), "id", "asc", 0, True, None, mid["id"]]),
            ("runs created_at desc queue=q3", "api_runs_page_indexed", ind,
             [*filters("q3"), "created_at", "desc", 0, True, mid["created_at"], mid["id"]]),
            ("runs finished_at desc", "api_runs_page_finished", fsh,
             [*filters(), "desc", 0, True, fin["finished_at"], fin["id"]]),
            ("runs finished_at desc (unfinished tail)", "api_runs_page_finished", fsh,
             [*filters(), "desc", 0, True, None, mid["id"]]),
            # sorts no index serves: over every run the route answers 422 (sort) now; within a queue, and for
            # the id sort too, it reads one range of runs_queue_status per state
            ("runs status desc (refused: 422)", "api_runs_page_other", oth,
             [*filters(), "status", "desc", 0, True, None, mid["status"], mid["id"]]),
            ("runs status desc queue=q3", "api_runs_page_by_queue", byq,
             [["q3"], states, *[None] * 3, 100, *[None] * 7, 0, "status", "desc", True, mid["status"], mid["id"], 0]),
            ("runs id desc queue=q3", "api_runs_page_by_queue", byq,
             [["q3"], states, *[None] * 3, 100, *[None] * 7, 0, "id", "desc", True, None, mid["id"], 0]),
            ("runs id desc scoped q3,q4", "api_runs_page_by_queue", byq,
             [["q3", "q4"], states, *[None] * 3, 100, *[None] * 7, 0, "id", "desc", True, None, mid["id"], 0]),
            ("runs id desc queue=q3 PENDING", "api_runs_page_by_queue", byq,
             [["q3"], ["PENDING"], *[None] * 3, 100, *[None] * 7, 0, "id", "desc", True, None, mid["id"], 0]),
            ("runs X-Total-Count", "dashboard_runs_count", [*f[:5], *f[6:], "bigint", "bigint"],
             [None] * 13 + [10001, 0]),
            ("events", "fleet_events_page", evt,
             [since, None, None, 100, None, ev["at"], ev["stream_id"] or -1, ev["id"], ev["run_id"]]),
            ("events queue=q3", "fleet_events_page", evt,
             [since, None, "q3", 100, None, ev["at"], ev["stream_id"] or -1, ev["id"], ev["run_id"]]),
            ("events scoped q3", "fleet_events_page", evt,
             [since, None, None, 100, ["q3"], ev["at"], ev["stream_id"] or -1, ev["id"], ev["run_id"]]),
            ("audit", "audit_list", aud, [None, None, None, None, 100, None, key]),
            ("audit queue=q3", "audit_list", aud, [None, "q3", None, None, 100, None, key]),
            ("dead letter", "api_dead_letter_page", ["text", "text[]", "int", "timestamptz", "bigint", "boolean"],
             [None, None, 100, dead["finished_at"], dead["id"], False]),
            ("a run's events", "run_events_page", ["bigint", "int", "timestamptz", "bigint", "bigint"],
             [400002, 1000, None, None, None]),
            ("schedules", "schedule_page_scoped", ["int", "text[]", "text"], [100, None, "s000500"]),
        ]
        print(f"{'statement (deep cursor)':40} {'execution':>11}  indexes")
        for label, name, types, args in cases:
            await c.execute("DEALLOCATE ALL")
            await c.execute(f"PREPARE p({', '.join(types)}) AS {query(name)}")
            plan = [r[0] for r in await c.fetch(f"EXPLAIN (ANALYZE) EXECUTE p({', '.join(_lit(a) for a in args)})")]
            ms = next(float(r.split()[2]) for r in plan if r.startswith("Execution Time"))
            used = sorted({m for r in plan for m in re.findall(r"using (\w+)", r) if not re.search(r"_y20|_default", m)})
            seq = " seq scan of runs," if any(re.search(r"Seq Scan on runs r", r) for r in plan) else ""
            print(f"{label:40} {ms:>8.2f} ms {seq} {', '.join(used)}", flush=True)
    finally:
        await c.close()


async def measure(dsn: str, repeat: int, only: str | None = None) -> None:
    from fencepost.api import ApiConfig, create_app
    from fencepost.api.auth import create_token
    from fencepost.core.config import Settings

    settings = Settings(redis_url=REDIS, database_url=dsn, prefix=f"fpbc{os.getpid()}")
    app = create_app(settings, ApiConfig(rate_limit=0, token_cache_s=60))
    async with app.router.lifespan_context(app):
        db = app.state.api.client.stores.db
        _, admin = await create_token(db, "admin", [], "bench", "bench")
        conn = await asyncpg.connect(dsn)
        try:
            deep = await deep_cursors(conn)
        finally:
            await conn.close()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api",
                                     headers={"Authorization": f"Bearer {admin}"}) as http:
            print(f"{'route':24} {'query':44} {'rows':>4} {'median ms':>9} {'max ms':>7}")
            for path, params in routes(deep):
                params = {"limit": 100, **params}
                if only is not None and only not in f"{path}?{params}":
                    continue
                times, n, status = [], 0, 0
                for i in range(repeat + 2):
                    t0 = time.perf_counter()
                    r = await http.get(path, params=params)
                    if i >= 2:  # two warm-up calls: connections, prepared statements, the token cache
                        times.append((time.perf_counter() - t0) * 1000)
                    status, n = r.status_code, len(r.json()) if r.status_code == 200 else -1
                shown = " ".join(f"{k}={'<deep>' if k == 'cursor' else v}" for k, v in params.items() if k != "limit")
                print(f"{path:24} {shown:44} {n:>4} {statistics.median(times):>9.1f} {max(times):>7.1f}"
                      + ("" if status == 200 else f"  status {status}"), flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="fp_bench_cursors")
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--only", help="only the routes whose path and query contain this text")
    ap.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE the statements instead")
    args = ap.parse_args()
    dsn = f"{PG}/{args.db}"
    if args.build:
        admin = await asyncpg.connect(f"{PG}/postgres")
        try:
            if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", args.db):
                await admin.execute(f'CREATE DATABASE "{args.db}"')
        finally:
            await admin.close()
        await build(dsn)
    await (explain(dsn) if args.explain else measure(dsn, args.repeat, args.only))


if __name__ == "__main__":
    asyncio.run(main())
