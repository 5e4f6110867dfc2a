-- 039_handler_buckets: the per-handler charts' rollup (issue 24, the dashboard at 1,000,000 runs). The
-- charts read every attempt of their window joined with its run (for the handler): 0.8-1.0 s for the 24 h
-- and 7 d windows over 100,000 attempts. Closed 15-minute buckets of attempt starts are rolled up once
-- (GET /v1/ops/handlers does it on its way: ops_handler_rollup) into one row per bucket, queue and
-- handler: started, succeeded, failed, and the run times of the finished ones in the 16 buckets of the
-- queue charts (fencepost.core.stats.BOUNDS_MS). A bucket closes 30 minutes after its end once every
-- attempt in it has finished (6 hours after, whatever is still running: counted as started only).
-- The rollup keeps what the runs table loses to retention; rows are never updated, so two API
-- processes rolling up the same bucket write it once (ON CONFLICT DO NOTHING).
CREATE TABLE handler_buckets (
    bucket    timestamptz NOT NULL,
    queue     text NOT NULL,
    handler   text NOT NULL,
    started   integer NOT NULL,
    succeeded integer NOT NULL,
    failed    integer NOT NULL,
    run_hist  integer[] NOT NULL CHECK (cardinality(run_hist) = 16),
    PRIMARY KEY (bucket, queue, handler),
    CHECK (bucket = date_bin('15 minutes', bucket, timestamptz '1970-01-01 00:00:00+00'))
);
CREATE TABLE handler_buckets_done (
    bucket    timestamptz PRIMARY KEY,
    rolled_at timestamptz NOT NULL DEFAULT now()
);
