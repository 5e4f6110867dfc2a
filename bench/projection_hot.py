"""What a HOT-updatable projection would save (issue 23 item 1): the runs table as migrated (every index)
against the same table with fillfactor 70 and no index on a column the per-job update changes (status,
finished_at, started_at...: what a narrow state table would leave on runs), 50,000 runs inserted, then
each updated once to SUCCEEDED as apply_runs does. Bytes per run, and how many updates were HOT.

    python bench/projection_hot.py          # scratch databases on the PostgreSQL at 127.0.0.1:5432
    python bench/projection_hot.py --indexes                 # what each runs index costs a submit and a finish
    python bench/projection_hot.py --explain runs_created_page runs_waiting_run_at   # who needs an index

--indexes and --explain use one scratch database `fp_runs_cost` of 200,000 runs (88 % SUCCEEDED, 6 % PENDING,
half of them due later, 3 % RETRY_WAIT, 3 % FAILED, 8 queues, created a second apart). --indexes: a
1,000-run insert_runs_fresh and the finish update of the same runs (as apply_runs writes SUCCEEDED), each
in a transaction that first drops one index and is rolled back, every variant once per round (interleaved),
medians of --rounds: the backend's CPU (ns from /proc/<pid>/schedstat: time on a core, not waiting) and the
WAL the statements write (EXPLAIN (ANALYZE, WAL) of a second insert and of the finish of its runs), per run.
WAL bytes are exact; CPU moves by a few us between rounds on a shared machine.
--explain: EXPLAIN (ANALYZE, BUFFERS) of the readers that could use the named indexes (the listing,
dashboard, history, gauge and scale queries), as migrated and with each named index dropped (rolled back):
the time, the runs indexes the plan read, the buffers.
"""
import argparse
import asyncio
import datetime as dt
import json
import re
import statistics
import sys

import asyncpg

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from fencepost.core.record import query, upgrade

N = 50_000
UPDATE = """UPDATE runs SET status = 'SUCCEEDED', version = 2, attempt = 1, token = id, started_at = now(),
            finished_at = now(), result = '\\xc0', updated_at = now() WHERE id = ANY($1)"""

async def case(admin, name, hot):
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')
    c = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:5432/{name}")
    await upgrade(c)
    if hot:
        idx = [r["indexname"] for r in await c.fetch(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'runs' AND indexname <> 'runs_pkey'")]
        for i in idx:
            await c.execute(f'DROP INDEX "{i}"')
        await c.execute("CREATE INDEX runs_queue_id ON runs (queue, id)")  # what a narrow state table would leave
        await c.execute("ALTER TABLE runs SET (fillfactor = 70)")
    for _ in range(0, N, 1000):
        await c.execute("INSERT INTO runs (handler, queue, status, payload, max_retries, timeout_s, submitted_by) "
                        "SELECT 'bench.tiny', 'bench', 'PENDING', '\\x90', 3, 300, 'client' FROM generate_series(1, 1000)")
    ids = [r["id"] for r in await c.fetch("SELECT id FROM runs ORDER BY id")]
    for i in range(0, N, 1000):
        await c.execute(UPDATE, ids[i:i + 1000])
    await asyncio.sleep(1)
    await c.execute("SELECT pg_stat_force_next_flush()")
    size = await c.fetchval("SELECT pg_total_relation_size('runs')")
    heap = await c.fetchval("SELECT pg_relation_size('runs')")
    st = await c.fetchrow("SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'runs'")
    nidx = await c.fetchval("SELECT count(*) FROM pg_indexes WHERE tablename = 'runs'")
    await c.close()
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return size, heap, st, nidx

async def main():
    admin = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/postgres")
    for hot in (False, True):
        size, heap, st, nidx = await case(admin, f"fp_hot_{int(hot)}", hot)
        print(f"{'HOT-able (fillfactor 70, 2 indexes)' if hot else 'runs as in 021 (' + str(nidx) + ' indexes)':38} "
              f"{size / N:7.0f} bytes/run (heap {heap / N:5.0f}), updates {st['n_tup_upd']}, "
              f"HOT {st['n_tup_hot_upd']}, dead {st['n_dead_tup']}")
    await admin.close()

SCRATCH = "fp_runs_cost"
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


async def scratch() -> asyncpg.Connection:
    """The populated scratch database (made once, kept for later runs)."""
    admin = await asyncpg.connect(ADMIN)
    if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", SCRATCH):
        await admin.execute(f'CREATE DATABASE "{SCRATCH}"')
    await admin.close()
    c = await asyncpg.connect(ADMIN.rsplit("/", 1)[0] + "/" + SCRATCH)
    await upgrade(c)
    if not await c.fetchval("SELECT count(*) FROM runs"):
        await c.execute("""
        INSERT INTO queues (name) VALUES ('default') ON CONFLICT DO NOTHING;
        INSERT INTO runs (handler, queue, status, payload, max_retries, timeout_s, attempt, created_at, run_at,
                          started_at, finished_at, token, submitted_by)
        SELECT 'bench.noop', 'q' || (g % 8), s, '\\x7b7d', 3, 300, CASE WHEN s = 'PENDING' THEN 0 ELSE 1 END,
               now() - make_interval(secs => 200000 - g),
               CASE WHEN s = 'RETRY_WAIT' OR (s = 'PENDING' AND g % 2 = 0) THEN now() + make_interval(secs => g % 5000)
                    ELSE now() - make_interval(secs => 200000 - g) END,
               CASE WHEN s = 'PENDING' THEN NULL ELSE now() - make_interval(secs => 200000 - g) END,
               CASE WHEN s IN ('SUCCEEDED', 'FAILED') THEN now() - make_interval(secs => 200000 - g) + interval '1 s' END,
               CASE WHEN s = 'PENDING' THEN NULL ELSE 1 END, 'bench'
        FROM (SELECT g, CASE WHEN g % 100 < 88 THEN 'SUCCEEDED' WHEN g % 100 < 94 THEN 'PENDING'
                             WHEN g % 100 < 97 THEN 'RETRY_WAIT' ELSE 'FAILED' END AS s
              FROM generate_series(1, 200000) g) x""")
        await c.execute("VACUUM ANALYZE runs")
    return c


def fresh_args(n):
    """insert_runs_fresh's arguments for n runs of one handler (every column but payload folded)."""
    scalars = ["bench.noop", "default", 0, dt.datetime.now(dt.UTC), 3, 300.0, "PENDING", None, "", None, None, None,
               None]
    return [[b'{"a":[1,2],"k":{}}'] * n, [None] * n] + [[] for _ in range(13)] + scalars + ["bench"]


def on_core_ns(pid):
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


async def wal_bytes(c, sql, args):
    """The WAL one statement writes, from EXPLAIN (ANALYZE, WAL)."""
    plan = await c.fetchval("EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + sql, *args)
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def modify(node):  # the Insert / Update nodes write the rows and their index entries (CTEs included)
        own = node.get("WAL Bytes", 0) if node.get("Node Type") == "ModifyTable" else 0
        return own + sum(modify(child) for child in node.get("Plans", []))

    return modify(plan[0]["Plan"])


FINISH = ("UPDATE runs SET status = 'SUCCEEDED', attempt = 1, token = 1, started_at = now(), finished_at = now(), "
          "version = version + 2 WHERE id = ANY($1::bigint[])")


async def indexes(a):
    c = await scratch()
    pid = await c.fetchval("SELECT pg_backend_pid()")
    sql, n = query("insert_runs_fresh"), 1000
    names = [r[0] for r in await c.fetch(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'runs' AND indexname <> 'runs_pkey' ORDER BY 1")]
    variants = [None, *names]
    got = {v: [] for v in variants}
    for _ in range(a.rounds):
        for v in variants:
            tx = c.transaction()
            await tx.start()
            try:
                if v:
                    await c.execute(f'DROP INDEX "{v}"')
                await c.fetch(sql, *fresh_args(n))  # warm
                c0 = on_core_ns(pid)
                rows = await c.fetch(sql, *fresh_args(n))
                c1 = on_core_ns(pid)
                ids = [r["id"] for r in rows if r["id"] is not None]
                c2 = on_core_ns(pid)
                await c.execute(FINISH, ids)
                c3 = on_core_ns(pid)
                # this backend's own WAL (the cluster's WAL position also moves with everyone else's writes)
                w1 = await wal_bytes(c, sql, fresh_args(n))
                w2 = await wal_bytes(c, FINISH, [[i + n for i in ids]])
            finally:
                await tx.rollback()
            got[v].append(((c1 - c0) / n / 1e3, w1 / n, (c3 - c2) / n / 1e3, w2 / n))
    await c.close()
    med = {v: [statistics.median(x[i] for x in xs) for i in range(4)] for v, xs in got.items()}
    b = med[None]
    print(f"runs at 200,000 rows: a 1,000-run insert_runs_fresh, then the finish update of those runs; backend CPU and "
          f"WAL per run, medians of {a.rounds} interleaved rounds")
    print(f"  {'every index':32} insert {b[0]:5.1f} us {b[1]:5.0f} B    finish {b[2]:5.1f} us {b[3]:5.0f} B")
    for v in names:
        m = med[v]
        print(f"  {'its cost: ' + v:32} insert {b[0] - m[0]:+5.1f} us {b[1] - m[1]:+5.0f} B    "
              f"finish {b[2] - m[2]:+5.1f} us {b[3] - m[3]:+5.0f} B")


def _cases():
    now = dt.datetime.now(dt.UTC)
    page = [None, None, None, None, None, 50, None, None, None, None, None, None, None, None, "created_at", "desc", 0,
            False, None, None]
    return {
        "fleet_events_page, 10 min": ("fleet_events_page", [now - dt.timedelta(minutes=10), None, None, 100, None,
                                                            None, None, None, None]),
        "fleet_events_page, 1 day, submitted": ("fleet_events_page", [now - dt.timedelta(days=1), "submitted", None,
                                                                      100, None, None, None, None, None]),
        "fleet_events_page, 3 days, one queue": ("fleet_events_page", [now - dt.timedelta(days=3), None, "q3", 100,
                                                                       None, None, None, None, None]),
        "events_recorded_since, 5 s": ("events_recorded_since", [None, 5.0, 500]),
        "events_recorded_since, 1 h": ("events_recorded_since", [now - dt.timedelta(hours=1), 1.0, 500]),
        "ops_list_retries": ("ops_list_retries", [None, None, None, None, None, 50]),
        "ops_list_retries, one queue": ("ops_list_retries", ["q3", None, None, None, None, 50]),
        "ops_list_scheduled": ("ops_list_scheduled", [None, None, None, None, None, 50]),
        "gauge_due_bands": ("gauge_due_bands", []),
        "scale_measure": ("scale_measure", ["q3", 60.0, ["SUCCEEDED"]]),
        "runs list by created_at desc": ("api_runs_page_indexed", page),
    }


async def explain(a):
    c = await scratch()
    for label, (name, args) in _cases().items():
        for drop in [None, *a.explain]:
            best = None
            tx = c.transaction()
            await tx.start()
            try:
                if drop:
                    await c.execute(f'DROP INDEX IF EXISTS "{drop}"')
                await c.execute("SET LOCAL plan_cache_mode = force_custom_plan")
                for _ in range(3):
                    text = "\n".join(r[0] for r in await c.fetch("EXPLAIN (ANALYZE, BUFFERS) " + query(name), *args))
                    ms = float(re.search(r"Execution Time: ([\d.]+)", text).group(1))
                    best = min(best or (ms, text), (ms, text))
            finally:
                await tx.rollback()
            ms, text = best
            used = sorted(set(re.findall(r"Index (?:Only )?Scan(?: Backward)? using (runs\w*)|Bitmap Index Scan on (runs\w*)",
                                         text)))
            used = sorted({u for pair in used for u in pair if u} | ({"seq scan"} if "Seq Scan on runs " in text else set()))
            buffers = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", text)
            nbuf = sum(int(x) for x in buffers.groups() if x) if buffers else 0
            print(f"  {label:34} {'without ' + drop if drop else 'as migrated':34} {ms:8.2f} ms {nbuf:7} buffers  "
                  f"{', '.join(used)}")
    await c.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--indexes", action="store_true")
    ap.add_argument("--explain", nargs="+", metavar="INDEX")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    asyncio.run(indexes(args) if args.indexes else explain(args) if args.explain else main())
