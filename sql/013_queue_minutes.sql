-- 013_queue_minutes: a per-minute rollup per queue for the dashboard's charts (issue 17), kept by the
-- recorder in the transaction that records the transitions it counts, so a replayed batch is not counted
-- twice and a page load never scans the events table.
-- lag_hist / run_hist: counts per bucket of start lag (due -> claimed) and run time (attempt started ->
-- finished), in milliseconds, with upper bounds 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
-- 60000, 300000, 900000, 3600000 and a last bucket for anything longer (16 buckets; fencepost.core.stats).
CREATE TABLE queue_minutes (
    queue      text NOT NULL,
    minute     timestamptz NOT NULL,
    started    integer NOT NULL DEFAULT 0,
    succeeded  integer NOT NULL DEFAULT 0,
    failed     integer NOT NULL DEFAULT 0,
    retried    integer NOT NULL DEFAULT 0,
    lag_hist   integer[] NOT NULL,
    run_hist   integer[] NOT NULL,
    PRIMARY KEY (minute, queue),
    CONSTRAINT minute_aligned CHECK (minute = date_trunc('minute', minute)),
    CONSTRAINT hist_sizes CHECK (cardinality(lag_hist) = 16 AND cardinality(run_hist) = 16)
);
