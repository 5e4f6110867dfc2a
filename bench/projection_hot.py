"""What a HOT-updatable projection would save (issue 23 item 1): the runs table as migrated (every index)
against the same table with fillfactor 70 and no index on a column the per-job update changes (status,
finished_at, started_at...: what a narrow state table would leave on runs), 50,000 runs inserted, then
each updated once to SUCCEEDED as apply_runs does. Bytes per run, and how many updates were HOT.

    python bench/projection_hot.py          # scratch databases on the PostgreSQL at 127.0.0.1:5432
    python bench/projection_hot.py --indexes                 # what each runs index costs a submit and a finish
    python bench/projection_hot.py --explain runs_created_page runs_waiting_run_at   # who needs an index
    python bench/projection_hot.py --narrow write --runs 50000 --rounds 5 [--claim]   # a real split, writes
    python bench/projection_hot.py --narrow read --rounds 7                           # ... and its readers

--narrow (docs/narrow-state-table.md): runs as migrated against the split (runs keeps the submit-time columns and
the indexes on them; run_state carries the columns apply_runs sets and the 7 state indexes, fillfactor 70 or
100), and against the split without state indexes (the lower bound above). write: per variant a scratch database
fp_narrow_*, --runs runs by insert_runs_fresh in calls of 1,000, then apply_runs SUCCEEDED in batches of --batch
(--claim: a RUNNING apply_runs first); bytes, WAL (EXPLAIN (ANALYZE, WAL) of each statement), backend CPU, HOT %,
and the same under a REPEATABLE READ snapshot held through the updates. read: the listing, dead-letter, gauge and
drift readers rewritten as runs JOIN run_state, at 200,000 runs, against the migrated ones.

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


# --- --narrow: a real split (issue 23 lever 4), not the lower bound above -----------------------------------------

# The columns apply_runs sets (sql/queries_runs.sql), all of which move to run_state, and queue (its indexes need it).
STATE_COLUMNS = ["status", "version", "attempt", "token", "lease_owner", "lease_expires_at", "run_at", "started_at",
                 "finished_at", "updated_at", "reason", "last_error_class", "last_error", "result", "pause_requested",
                 "stop_requested", "cancel_requested", "gen", "forced"]
STATE_INDEXES = ["runs_queue_status", "runs_active", "runs_finished_page", "runs_dead_page", "runs_dead_queue_page",
                 "runs_waiting_run_at", "runs_retry_wait_run_at"]
RUN_STATE = """
CREATE TABLE run_state (
    id bigint PRIMARY KEY,
    queue text NOT NULL,
    status text NOT NULL CHECK (status IN ('BLOCKED', 'PENDING', 'RUNNING', 'RETRY_WAIT', 'PAUSED', 'STOPPING',
                                           'STOPPED', 'SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED')),
    version bigint NOT NULL DEFAULT 0,
    attempt integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    token bigint,
    lease_owner text,
    lease_expires_at timestamptz,
    run_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    reason text,
    last_error_class text,
    last_error text,
    result bytea,
    pause_requested boolean NOT NULL DEFAULT false,
    stop_requested boolean NOT NULL DEFAULT false,
    cancel_requested boolean NOT NULL DEFAULT false,
    gen integer NOT NULL DEFAULT 0,
    forced boolean NOT NULL DEFAULT false,
    -- the CHECKs of runs that involve only state columns (001/012), so the split pays them too
    CONSTRAINT active_has_token CHECK (status NOT IN ('RUNNING', 'STOPPING') OR (token IS NOT NULL AND started_at IS NOT NULL)),
    CONSTRAINT claimed_has_attempt CHECK (status IN ('PENDING', 'BLOCKED', 'PAUSED', 'CANCELLED') OR attempt > 0),
    CONSTRAINT finished_iff_terminal CHECK ((status IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'STOPPED'))
                                           = (finished_at IS NOT NULL)),
    CONSTRAINT leased_iff_active CHECK ((status IN ('RUNNING', 'STOPPING')) = (lease_owner IS NOT NULL)),
    CONSTRAINT result_only_on_success CHECK (result IS NULL OR status = 'SUCCEEDED')
) WITH (fillfactor = 70)"""

VARIANTS = {"migrated": "as migrated", "split": "split", "split100": "split, fillfactor 100",
            "bare": "split, no state indexes"}


async def make_split(c, state_indexes=True, copy=False, fillfactor=70):
    """runs keeps the submit-time columns and the indexes on them; run_state takes the rest (copied when `copy`)."""
    defs = {r["indexname"]: r["indexdef"] for r in await c.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'runs'")}
    await c.execute(RUN_STATE.replace("fillfactor = 70", f"fillfactor = {fillfactor}"))
    if copy:
        await c.execute(f"INSERT INTO run_state (id, queue, {', '.join(STATE_COLUMNS)}) "
                        f"SELECT id, queue, {', '.join(STATE_COLUMNS)} FROM runs")
    await c.execute("DROP VIEW IF EXISTS history")  # reads runs' moving columns; nothing here reads it
    for col in STATE_COLUMNS:  # takes the state indexes and the CHECKs on these columns with it
        await c.execute(f"ALTER TABLE runs DROP COLUMN {col}")
    if copy:
        await c.execute("VACUUM FULL runs")  # the rows without the dropped columns' values, as a migration would leave
    if state_indexes:
        for name in STATE_INDEXES:
            await c.execute(defs[name].replace("INDEX runs_", "INDEX run_state_").replace(" ON public.runs ",
                                                                                           " ON public.run_state "))
    left = sorted(r[0] for r in await c.fetch("SELECT indexname FROM pg_indexes WHERE tablename = 'runs'"))
    assert left == ["runs_created_page", "runs_idempotency_key", "runs_outbox", "runs_pkey", "runs_queue_created_page",
                    "runs_schedule_fire", "runs_workflow"], left


def split_insert():
    """insert_runs_fresh for the split: the same statement, its runs insert narrowed and a run_state insert beside it."""
    q = query("insert_runs_fresh")
    a, b = q.index("), ins AS ("), q.index("), ev AS (")
    return q[:a] + """), ins AS (
    INSERT INTO runs (id, handler, queue, priority, payload, max_retries, timeout_s, trace_id,
                      workflow_id, outbox, tenant, concurrency_key, concurrency_limit, rate_key, rate_limit,
                      submitted_by)
    SELECT id, handler, queue, priority, payload, max_retries, timeout_s, trace_id,
           workflow_id, false, tenant, concurrency_key, concurrency_limit, rate_key, rate_limit,
           CASE WHEN status = 'PENDING' THEN $29::text END
    FROM input
), st AS (
    INSERT INTO run_state (id, queue, status, run_at) SELECT id, queue, status, run_at FROM input
""" + q[b:]


def split_apply():
    q = query("apply_runs")
    assert q.count("UPDATE runs r SET") == 1
    return q.replace("UPDATE runs r SET", "UPDATE run_state r SET")


def claim_args(ids):
    """apply_runs' arguments for a batch of claims (RUNNING, leased): the first of two updates when a run's claim
    and finish fall in different recorder batches."""
    n, now = len(ids), dt.datetime.now(dt.UTC)
    return [ids, ["RUNNING"] * n, [2] * n, [1] * n, ids, ["w-1"] * n, [now + dt.timedelta(seconds=60)] * n,
            [now] * n, [None] * n, [None] * n, [None] * n, [None] * n, [None] * n, [None] * n, [now] * n, [None] * n,
            [None] * n, [None] * n]


def finish_args(ids):
    """apply_runs' arguments for a batch of successes (claim and finish folded into one row, as one batch writes)."""
    n, now = len(ids), dt.datetime.now(dt.UTC)
    return [ids, ["SUCCEEDED"] * n, [3] * n, [1] * n, ids, ["w-1"] * n, [None] * n, [now] * n, [now] * n,
            [None] * n, [None] * n, [None] * n, [None] * n, [b"\xc0"] * n, [now] * n, [None] * n, [None] * n,
            [None] * n]


async def explain_wal(c, sql, args):
    """WAL bytes and full-page images of one statement's Insert / Update nodes (EXPLAIN ANALYZE, no timing)."""
    plan = await c.fetchval("EXPLAIN (ANALYZE, WAL, TIMING OFF, FORMAT JSON) " + sql, *args)
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def modify(node):
        own = ((node.get("WAL Bytes", 0), node.get("WAL FPI", 0)) if node.get("Node Type") == "ModifyTable"
               else (0, 0))
        kids = [modify(k) for k in node.get("Plans", [])]
        return own[0] + sum(k[0] for k in kids), own[1] + sum(k[1] for k in kids)

    return modify(plan[0]["Plan"])


async def sizes(c):
    out = {}
    for t in ("runs", "run_state"):
        if await c.fetchval("SELECT to_regclass($1) IS NOT NULL", t):
            out[t] = await c.fetchrow(
                "SELECT pg_total_relation_size($1::regclass) AS total, pg_relation_size($1::regclass) AS heap, "
                "pg_indexes_size($1::regclass) AS idx, (SELECT count(*) FROM pg_index WHERE indrelid = $1::regclass) "
                "AS nidx", t)
    return out


async def table_stats(c):
    await c.execute("SELECT pg_stat_force_next_flush()")
    await asyncio.sleep(0.6)
    await c.execute("SELECT pg_stat_clear_snapshot()")
    return {r["relname"]: r for r in await c.fetch(
        "SELECT relname, n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup FROM pg_stat_user_tables "
        "WHERE relname IN ('runs', 'run_state')")}


async def narrow_case(admin, variant, n, batch, hold, claim=False):
    """One scratch database: n runs inserted in calls of 1,000, then finished in apply_runs batches of `batch`."""
    name = f"fp_narrow_{variant}_{int(hold)}"
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    c = await asyncpg.connect(url)
    try:
        await upgrade(c)
        if variant != "migrated":
            await make_split(c, state_indexes=variant != "bare", fillfactor=100 if variant == "split100" else 70)
        ins = query("insert_runs_fresh") if variant == "migrated" else split_insert()
        fin = query("apply_runs") if variant == "migrated" else split_apply()
        await c.fetch(ins, *fresh_args(1))  # the queue row and the plans, outside the figures
        await c.execute("TRUNCATE runs" + (", run_state" if variant != "migrated" else "") + " CASCADE")
        await c.execute("VACUUM ANALYZE")
        await c.execute("CHECKPOINT")  # every round starts from a checkpoint: full-page images alike
        pid = await c.fetchval("SELECT pg_backend_pid()")
        r = {}
        lsn0 = await c.fetchval("SELECT pg_current_wal_insert_lsn()")
        cpu, wal, fpi = 0, 0, 0
        for _ in range(0, n, 1000):
            args = fresh_args(1000)
            t0 = on_core_ns(pid)
            w, f = await explain_wal(c, ins, args)
            cpu += on_core_ns(pid) - t0
            wal, fpi = wal + w, fpi + f
        lsn1 = await c.fetchval("SELECT pg_current_wal_insert_lsn()")
        r["ins_cpu"], r["ins_wal"], r["ins_fpi"] = cpu / n / 1e3, wal / n, fpi / n
        r["ins_lsn"] = await c.fetchval("SELECT pg_wal_lsn_diff($1, $2)", lsn1, lsn0) / n
        r["size_ins"] = await sizes(c)
        ids = [x["id"] for x in await c.fetch("SELECT id FROM runs ORDER BY id")]
        assert len(ids) == n
        # statistics as a live table has them: ANALYZEd while empty, the planner hashes the whole table per batch
        # (85 us per run at 50,000 runs) where a live recorder reads the primary key (3 index levels per run)
        await c.execute("ANALYZE runs" + (", run_state" if variant != "migrated" else ""))
        holder = None
        if hold:
            holder = await asyncpg.connect(url)
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await holder.fetchval("SELECT 1")
        if claim:  # the claim recorded in an earlier batch than the finish: a RUNNING update first
            cpu, wal = 0, 0
            for i in range(0, n, batch):
                args = claim_args(ids[i:i + batch])
                t0 = on_core_ns(pid)
                w, _ = await explain_wal(c, fin, args)
                cpu += on_core_ns(pid) - t0
                wal += w
            r["clm_cpu"], r["clm_wal"] = cpu / n / 1e3, wal / n
            r["size_clm"] = await sizes(c)
        cpu, wal, fpi = 0, 0, 0
        lsn0 = await c.fetchval("SELECT pg_current_wal_insert_lsn()")
        for i in range(0, n, batch):
            args = finish_args(ids[i:i + batch])
            t0 = on_core_ns(pid)
            w, f = await explain_wal(c, fin, args)
            cpu += on_core_ns(pid) - t0
            wal, fpi = wal + w, fpi + f
        lsn1 = await c.fetchval("SELECT pg_current_wal_insert_lsn()")
        r["fin_cpu"], r["fin_wal"], r["fin_fpi"] = cpu / n / 1e3, wal / n, fpi / n
        r["fin_lsn"] = await c.fetchval("SELECT pg_wal_lsn_diff($1, $2)", lsn1, lsn0) / n
        tbl = "runs" if variant == "migrated" else "run_state"
        assert await c.fetchval(f"SELECT count(*) FROM {tbl} WHERE status = 'SUCCEEDED'") == n
        r["size_fin"] = await sizes(c)
        r["stats"] = await table_stats(c)
        await c.execute("VACUUM runs" + (", run_state" if variant != "migrated" else ""))
        r["size_vac"] = await sizes(c)
        r["stats_vac"] = await table_stats(c)
        if holder:
            await holder.execute("ROLLBACK")
            await holder.close()
    finally:
        await c.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return r


def _tot(sz, key="total"):
    return sum(v[key] for v in sz.values())


async def narrow_write(a):
    admin = await asyncpg.connect(ADMIN)
    n = a.runs
    got = {(v, h): [] for v in VARIANTS for h in (False, True)}
    with open("/proc/loadavg") as f:
        load0 = f.read().split()[:3]
    for rnd in range(a.rounds):
        for hold in (False, True):
            for v in (VARIANTS if rnd % 2 == 0 else list(VARIANTS)[::-1]):  # interleaved, order flipped per round
                got[(v, hold)].append(await narrow_case(admin, v, n, a.batch, hold, a.claim))
                print(f"  round {rnd + 1} {'held snapshot' if hold else 'no hold':13} {VARIANTS[v]:26} done",
                      file=sys.stderr, flush=True)
    await admin.close()
    with open("/proc/loadavg") as f:
        load1 = f.read().split()[:3]
    print(f"--narrow: {n:,} runs per scratch database (fp_narrow_*), insert_runs_fresh in calls of 1,000, then "
          f"{'apply_runs RUNNING (claim), then ' if a.claim else ''}apply_runs SUCCEEDED in batches of {a.batch}; "
          f"{a.rounds} rounds, variants interleaved; medians "
          f"[min-max]; load average {' '.join(load0)} at start, {' '.join(load1)} at end")

    def med(v, hold, f):
        xs = [f(r) for r in got[(v, hold)]]
        return statistics.median(xs), min(xs), max(xs)

    def fmt(t, p=0):
        m, lo, hi = t
        return f"{m:,.{p}f} [{lo:,.{p}f}-{hi:,.{p}f}]"

    rows = [
        ("B/run after insert (tables+indexes)", lambda r: _tot(r["size_ins"]) / n, False, 0),
        ("  heap / indexes after insert", None, False, 0),
        ("B/run after finish", lambda r: _tot(r["size_fin"]) / n, False, 0),
        ("B/run after finish + VACUUM", lambda r: _tot(r["size_vac"]) / n, False, 0),
        ("insert WAL B/run (statement)", lambda r: r["ins_wal"], False, 0),
        ("insert WAL B/run (cluster LSN)", lambda r: r["ins_lsn"], False, 0),
        ("finish WAL B/run (statement)", lambda r: r["fin_wal"], False, 0),
        ("finish WAL B/run (cluster LSN)", lambda r: r["fin_lsn"], False, 0),
        ("insert backend CPU us/run", lambda r: r["ins_cpu"], False, 1),
        ("finish backend CPU us/run", lambda r: r["fin_cpu"], False, 1),
        *([("claim WAL B/run (statement)", lambda r: r["clm_wal"], False, 0),
           ("claim backend CPU us/run", lambda r: r["clm_cpu"], False, 1),
           ("B/run after claim", lambda r: _tot(r["size_clm"]) / n, False, 0)] if a.claim else []),
        ("finish updates HOT %", lambda r: 100 * sum(s["n_tup_hot_upd"] for s in r["stats"].values())
         / max(1, sum(s["n_tup_upd"] for s in r["stats"].values())), False, 0),
        ("held snapshot: B/run after finish", lambda r: _tot(r["size_fin"]) / n, True, 0),
        ("held snapshot: growth B/run in finish", lambda r: (_tot(r["size_fin"]) - _tot(r["size_ins"])) / n, True, 0),
        ("held snapshot: runs dead tuples", lambda r: r["stats"]["runs"]["n_dead_tup"], True, 0),
        ("held snapshot: run_state dead tuples", lambda r: r["stats"].get("run_state", {"n_dead_tup": 0})["n_dead_tup"]
         if "run_state" in r["stats"] else float("nan"), True, 0),
        ("held snapshot: HOT %", lambda r: 100 * sum(s["n_tup_hot_upd"] for s in r["stats"].values())
         / max(1, sum(s["n_tup_upd"] for s in r["stats"].values())), True, 0),
        ("held snapshot: finish WAL B/run", lambda r: r["fin_wal"], True, 0),
    ]
    print(f"{'':40}" + "".join(f"{VARIANTS[v]:>28}" for v in VARIANTS))
    for label, f, hold, p in rows:
        if f is None:
            print(f"{label:40}" + "".join(
                f"{statistics.median(_tot(r['size_ins'], 'heap') for r in got[(v, False)]) / n:>14,.0f} / "
                f"{statistics.median(_tot(r['size_ins'], 'idx') for r in got[(v, False)]) / n:<11,.0f}"
                for v in VARIANTS))
            continue
        print(f"{label:40}" + "".join(f"{fmt(med(v, hold, f), p):>28}" for v in VARIANTS))
    for hold in (False, True):
        for v in VARIANTS:
            r = got[(v, hold)][0]
            parts = ", ".join(f"{t} {s['total'] / n:.0f} B/run ({s['nidx']} indexes)" for t, s in r["size_fin"].items())
            print(f"  after finish, {'held' if hold else 'no hold'}, {VARIANTS[v]}: {parts}; per table dead: "
                  + ", ".join(f"{t} {s['n_dead_tup']}" for t, s in r["stats"].items()))
    b = {k: statistics.median(r["fin_cpu"] + r["ins_cpu"] for r in got[(k, False)]) for k in VARIANTS}
    w = {k: statistics.median(r["fin_wal"] + r["ins_wal"] for r in got[(k, False)]) for k in VARIANTS}
    print(f"ratios split / as migrated (medians): insert+finish CPU x{b['split'] / b['migrated']:.2f}, "
          f"WAL x{w['split'] / w['migrated']:.2f}; per round CPU "
          + ", ".join(f"x{(s['fin_cpu'] + s['ins_cpu']) / (m['fin_cpu'] + m['ins_cpu']):.2f}"
                      for s, m in zip(got[('split', False)], got[('migrated', False)])))


POPULATE = """
INSERT INTO queues (name) VALUES ('default') ON CONFLICT DO NOTHING;
INSERT INTO runs (handler, queue, status, payload, max_retries, timeout_s, attempt, created_at, run_at,
                  started_at, finished_at, token, submitted_by, last_error_class, last_error, reason)
SELECT 'bench.noop', 'q' || (g % 8), s, '\\x7b7d', 3, 300, CASE WHEN s = 'PENDING' THEN 0 ELSE 1 END,
       now() - make_interval(secs => 200000 - g),
       CASE WHEN s = 'RETRY_WAIT' OR (s = 'PENDING' AND g % 2 = 0) THEN now() + make_interval(secs => g % 5000)
            ELSE now() - make_interval(secs => 200000 - g) END,
       CASE WHEN s = 'PENDING' THEN NULL ELSE now() - make_interval(secs => 200000 - g) END,
       CASE WHEN s IN ('SUCCEEDED', 'FAILED') THEN now() - make_interval(secs => 200000 - g) + interval '1 s' END,
       CASE WHEN s = 'PENDING' THEN NULL ELSE 1 END, 'bench',
       CASE WHEN s = 'FAILED' THEN 'ValueError' END, CASE WHEN s = 'FAILED' THEN 'boom' END,
       CASE WHEN s = 'FAILED' AND g % 10 = 0 THEN 'review' END
FROM (SELECT g, CASE WHEN g % 100 < 88 THEN 'SUCCEEDED' WHEN g % 100 < 94 THEN 'PENDING'
                     WHEN g % 100 < 97 THEN 'RETRY_WAIT' ELSE 'FAILED' END AS s
      FROM generate_series(1, 200000) g) x"""

# The readers rewritten for the split: the state columns from run_state s, the rest from runs r, joined on id;
# each reads the index that moved (run_state_*) where the migrated one reads runs_*.
_BY_QUEUE_SPLIT = """
SELECT r.id, r.handler, r.queue, s.status, r.priority, s.attempt, s.run_at, r.created_at, s.started_at,
       s.finished_at, s.last_error_class, s.last_error, s.reason, s.version, r.workflow_id, r.schedule_id
FROM (
SELECT p.id, p.status FROM (
    SELECT s.status,
           CASE WHEN $17::boolean AND $16 = 'asc' AND ($15 = 'id' OR s.status = $18::text) THEN $19::bigint
                ELSE 0 END AS lo,
           CASE WHEN $17::boolean AND $16 = 'desc' AND ($15 = 'id' OR s.status = $18::text) THEN $19::bigint
                ELSE 9223372036854775807 END AS hi
    FROM unnest($2::text[]) s(status)
    WHERE NOT $17::boolean OR $15 = 'id'
       OR (CASE WHEN $16 = 'asc' THEN s.status >= $18::text ELSE s.status <= $18::text END)
) b
CROSS JOIN unnest($1::text[]) q(queue)
CROSS JOIN LATERAL (
    SELECT t.id, t.status
    FROM run_state t
    WHERE t.queue = q.queue AND (t.status, t.id) > (b.status, b.lo) AND (t.status, t.id) < (b.status, b.hi)
      AND ($8::bigint IS NULL OR t.id < $8)
      AND ($9::bigint IS NULL OR t.id = $9)
      -- the filters on submit-time columns: one probe of runs per candidate, folded away when none is given
      AND (($3::text IS NULL AND $4::timestamptz IS NULL AND $5::timestamptz IS NULL AND $7::text IS NULL
            AND $10::text IS NULL AND $11::text IS NULL AND $12::text IS NULL AND $13::text IS NULL)
           OR EXISTS (SELECT 1 FROM runs r WHERE r.id = t.id
      AND ($3::text IS NULL OR r.handler = $3)
      AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
      AND ($7::text IS NULL OR r.submitted_by = $7 OR r.submitted_by LIKE $7 || '@%'
           OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                      AND (e.actor = $7 OR e.actor LIKE $7 || '@%')))
      AND ($10::text IS NULL OR r.tenant = $10)
      AND ($11::text IS NULL OR r.concurrency_key = $11)
      AND ($12::text IS NULL OR r.idempotency_key = $12)
      AND ($13::text IS NULL OR (r.id > $14 AND position(convert_to($13, 'UTF8') IN r.payload) > 0))))
    ORDER BY CASE WHEN $16 = 'asc' THEN t.status END ASC, CASE WHEN $16 = 'asc' THEN t.id END ASC,
             t.status DESC, t.id DESC
    LIMIT $6::bigint + $20::bigint
) p
ORDER BY CASE WHEN $16 = 'asc' AND $15 = 'status' THEN p.status END ASC,
         CASE WHEN $16 = 'desc' AND $15 = 'status' THEN p.status END DESC,
         CASE WHEN $16 = 'asc' THEN p.id END ASC, p.id DESC
LIMIT $6 OFFSET $20
) k JOIN runs r ON r.id = k.id JOIN run_state s ON s.id = k.id
ORDER BY CASE WHEN $16 = 'asc' AND $15 = 'status' THEN k.status END ASC,
         CASE WHEN $16 = 'desc' AND $15 = 'status' THEN k.status END DESC,
         CASE WHEN $16 = 'asc' THEN k.id END ASC, k.id DESC"""

_DEAD_SPLIT = """
SELECT r.id, r.handler, r.queue, s.status, s.attempt, r.priority, s.version, s.run_at, r.created_at, s.started_at,
       s.finished_at, s.last_error_class, s.last_error, s.reason, r.workflow_id, r.schedule_id
FROM run_state s JOIN runs r ON r.id = s.id
WHERE s.status IN ('FAILED', 'TIMED_OUT')
  AND (CASE WHEN $6::boolean THEN s.status = 'FAILED' AND s.reason = 'review' ELSE s.reason IS DISTINCT FROM 'review' END)
  AND ($1::text IS NULL OR s.queue = $1)
  AND ($2::text[] IS NULL OR s.queue = ANY($2))
  AND ($4::timestamptz IS NULL OR (s.finished_at, s.id) < ($4, $5::bigint))
ORDER BY s.finished_at DESC, s.id DESC
LIMIT $3"""

_CREATED_SPLIT = """
SELECT r.id, r.handler, r.queue, s.status, r.priority, s.attempt, s.run_at, r.created_at, s.started_at,
       s.finished_at, s.last_error_class, s.last_error, s.reason, s.version, r.workflow_id, r.schedule_id
FROM runs r JOIN run_state s ON s.id = r.id
ORDER BY r.created_at DESC, r.id DESC LIMIT $1"""
_CREATED_MIGRATED = """
SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
       r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
FROM runs r ORDER BY r.created_at DESC, r.id DESC LIMIT $1"""


def _split_text(name):
    """A simple reader of runs' state columns, rewritten for the split by table name (no submit-time column)."""
    q = query(name)
    assert " FROM runs " in q or "FROM runs\n" in q or "FROM runs WHERE" in q, name
    return q.replace("FROM runs", "FROM run_state")


def _read_cases():
    def by_queue(statuses, sort="status"):
        return [["q3"], statuses, None, None, None, 50, None, None, None, None, None, None, None, 0, sort, "desc",
                False, None, None, 0]
    every = ["BLOCKED", "CANCELLED", "FAILED", "PAUSED", "PENDING", "RETRY_WAIT", "RUNNING", "STOPPED", "STOPPING",
             "SUCCEEDED", "TIMED_OUT"]
    due_split = """SELECT s.queue, CASE WHEN r.priority >= 200 THEN 'high' WHEN r.priority >= 100 THEN 'normal'
                   ELSE 'low' END AS band, count(*) AS n
                   FROM run_state s JOIN runs r ON r.id = s.id WHERE s.status = 'PENDING' AND s.run_at <= now()
                   GROUP BY 1, 2"""
    get_split = "SELECT * FROM runs r JOIN run_state s USING (id) WHERE id = $1"
    return {
        # label: (migrated sql, split sql, args)
        "queue q3 by status, newest first": (query("api_runs_page_by_queue"), _BY_QUEUE_SPLIT, by_queue(every)),
        "queue q3, status FAILED, newest": (query("api_runs_page_by_queue"), _BY_QUEUE_SPLIT, by_queue(["FAILED"], "id")),
        "dead-letter page, any queue": (query("api_dead_letter_page"), _DEAD_SPLIT, [None, None, 50, None, None, False]),
        "dead-letter page, queue q3": (query("api_dead_letter_page"), _DEAD_SPLIT, ["q3", None, 50, None, None, False]),
        "runs list by created_at desc": (_CREATED_MIGRATED, _CREATED_SPLIT, [50]),
        "active gauge: status counts, q3": (query("loadtest_status_counts"), _split_text("loadtest_status_counts"),
                                            ["q3"]),
        "gauge_due_bands": (query("gauge_due_bands"), due_split, []),
        "gauge_dead_and_review": (query("gauge_dead_and_review"), _split_text("gauge_dead_and_review"), []),
        "drift_active_ids q3, page of 500": (query("drift_active_ids"), _split_text("drift_active_ids"), ["q3", 0, 500]),
        "drift_recent_ids q3, 500": (query("drift_recent_ids"), _split_text("drift_recent_ids"), ["q3", 500]),
        "one run by id (get_run's hot half)": ("SELECT * FROM runs WHERE id = $1", get_split, [123457]),
    }


async def read_db(admin, name, split):
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')
    c = await asyncpg.connect(ADMIN.rsplit("/", 1)[0] + "/" + name)
    await upgrade(c)
    await c.execute(POPULATE)
    if split:
        await make_split(c, copy=True)
    await c.execute("VACUUM ANALYZE")
    return c


async def narrow_read(a):
    admin = await asyncpg.connect(ADMIN)
    dbs = {"migrated": await read_db(admin, "fp_narrow_read_0", False),
           "split": await read_db(admin, "fp_narrow_read_1", True)}
    for k, c in dbs.items():
        sz = await sizes(c)
        print(f"  {VARIANTS[k]}: " + ", ".join(f"{t} {s['total'] / 2**20:.1f} MB ({s['nidx']} indexes)"
                                              for t, s in sz.items()))
    got = {}
    try:
        for _ in range(a.rounds):
            for label, (m_sql, s_sql, args) in _read_cases().items():
                for k, sql in (("migrated", m_sql), ("split", s_sql)):
                    c = dbs[k]
                    async with c.transaction():
                        await c.execute("SET LOCAL plan_cache_mode = force_custom_plan")
                        text = "\n".join(r[0] for r in await c.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql, *args))
                    ms = float(re.search(r"Execution Time: ([\d.]+)", text).group(1))
                    buf = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", text)
                    nbuf = sum(int(x) for x in buf.groups() if x) if buf else 0
                    used = sorted({u for pair in re.findall(
                        r"Index (?:Only )?Scan(?: Backward)? using (\w+)|Bitmap Index Scan on (\w+)", text)
                        for u in pair if u} | ({"seq scan"} if "Seq Scan" in text else set()))
                    got.setdefault((label, k), []).append((ms, nbuf, used))
    finally:
        for c in dbs.values():
            await c.close()
        for name in ("fp_narrow_read_0", "fp_narrow_read_1"):
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"readers at 200,000 runs (88 % SUCCEEDED, 6 % PENDING, 3 % RETRY_WAIT, 3 % FAILED, 8 queues), "
          f"EXPLAIN (ANALYZE, BUFFERS), median ms of {a.rounds} [min-max], buffers; load average {load}")
    for label in _read_cases():
        line = f"  {label:36}"
        for k in ("migrated", "split"):
            xs = got[(label, k)]
            ms = [x[0] for x in xs]
            line += (f" {VARIANTS[k]}: {statistics.median(ms):7.2f} ms [{min(ms):.2f}-{max(ms):.2f}] "
                     f"{xs[-1][1]:6} buf {','.join(xs[-1][2]):38}")
        print(line)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--indexes", action="store_true")
    ap.add_argument("--explain", nargs="+", metavar="INDEX")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--narrow", choices=["write", "read", "both"], help="the split (run_state) against runs as migrated")
    ap.add_argument("--runs", type=int, default=50_000, help="--narrow write: runs per scratch database")
    ap.add_argument("--batch", type=int, default=500, help="--narrow write: runs per apply_runs call")
    ap.add_argument("--claim", action="store_true", help="--narrow write: a claim update (RUNNING) before the finish")
    args = ap.parse_args()
    if args.narrow:
        if args.narrow in ("write", "both"):
            asyncio.run(narrow_write(args))
        if args.narrow in ("read", "both"):
            asyncio.run(narrow_read(args))
    else:
        asyncio.run(indexes(args) if args.indexes else explain(args) if args.explain else main())
