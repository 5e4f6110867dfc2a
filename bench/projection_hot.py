"""What a HOT-updatable projection would save (issue 23 item 1): the runs table as migrated (every index)
against the same table with fillfactor 70 and no index on a column the per-job update changes (status,
finished_at, started_at...: what a narrow state table would leave on runs), 50,000 runs inserted, then
each updated once to SUCCEEDED as apply_runs does. Bytes per run, and how many updates were HOT.

    python bench/projection_hot.py          # scratch databases on the PostgreSQL at 127.0.0.1:5432
"""
import asyncio
import sys

import asyncpg

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from fencepost.core.record import upgrade

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

asyncio.run(main())
