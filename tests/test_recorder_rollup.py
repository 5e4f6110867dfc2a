"""The recorder counts the dashboard's per-minute rollup itself (issue 18: the per-event rollup
statement was the largest per-job cost of its transaction). The histograms must be the ones the
attempts and the claims' start lag give, whether a run's claim and finish arrive in one batch (run
time known to the recorder) or in two (run time read from the attempt row PostgreSQL holds)."""

from __future__ import annotations

import time

from fencepost.client import Client
from fencepost.core.hot import ClaimArgs, Finish, FinishArgs
from fencepost.core.stores import Stores
from fencepost.reconciler.recorder import Recorder

BUCKETS = ("ARRAY[10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 900000, "
           "3600000]::bigint[]")


async def test_rollup_counted_by_the_recorder_matches_the_attempts(client: Client, stores: Stores) -> None:
    ids = [await client.submit("t.noop") for _ in range(6)]
    keys = stores.keys("tq")
    t0 = (int(time.time() * 1000) // 60_000 + 1) * 60_000 + 1_000  # every transition in one minute
    await stores.redis.set(keys.testclock, t0)  # the scripts' one clock, held by the test (tests/conftest.py)
    jobs = await stores.scripts.claim_due(keys, ClaimArgs(6, "w", 30_000, 100))
    assert sorted(j.id for j in jobs) == sorted(ids)
    early, late = jobs[:3], jobs[3:]
    await stores.redis.set(keys.testclock, t0 + 30)
    await stores.scripts.finish_runs(keys, FinishArgs(3), [Finish(j.id, j.token, "ok", b"\xc0", "", 0)
                                                                    for j in early])
    await stores.redis.set(keys.testclock, t0 + 700)
    await stores.scripts.finish_runs(keys, FinishArgs(3), [Finish(j.id, j.token, "ok", b"\xc0", "", 0)
                                                                     for j in late])
    stream = keys.events
    entries = [(stream, eid, f) for eid, f in await stores.redis.xrange(stream)]
    assert [f[b"type"] for _, _, f in entries] == [b"claimed"] * 6 + [b"succeeded"] * 6
    rec = Recorder(stores, consumer="r")
    await rec._ensure_groups(["tq"])
    await rec.record(entries[:9], fresh=True)  # the claims and three finishes: run times known here
    await rec.record(entries[9:], fresh=True)  # three finishes whose claims were recorded before
    await rec._record(entries[9:])  # replayed: counted once

    pool = stores.db.pool
    assert pool is not None
    row = await pool.fetchrow("SELECT * FROM queue_minutes WHERE queue = 'tq'")
    assert row is not None and row["minute"].timestamp() * 1000 == t0 - 1_000
    assert (row["started"], row["succeeded"], row["failed"], row["retried"]) == (6, 6, 0, 0)
    run_hist = [0] * 16
    for r in await pool.fetch(f"SELECT width_bucket((extract(epoch FROM finished_at - started_at) * 1000)::bigint, "
                              f"{BUCKETS}) + 1 AS b, count(*) AS n FROM attempts GROUP BY 1"):
        run_hist[r["b"] - 1] = r["n"]
    assert run_hist[2] == 3 and run_hist[6] == 3  # 30 ms and 700 ms
    assert list(row["run_hist"]) == run_hist
    lags = [max(0, int(f[b"ts"]) - int(f[b"due"])) for _, _, f in entries[:6]]
    lag_hist = [0] * 16
    for r in await pool.fetch(f"SELECT width_bucket(l, {BUCKETS}) + 1 AS b, count(*) AS n "
                              "FROM unnest($1::bigint[]) l GROUP BY 1", lags):
        lag_hist[r["b"] - 1] = r["n"]
    assert list(row["lag_hist"]) == lag_hist and sum(lag_hist) == 6
