-- Named queries: Queues: declared queues, their settings, epochs, commands and figures.
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: queue_epochs
-- params: none
-- returns: name text, epoch int8, paused bool
SELECT name, epoch, paused FROM queues ORDER BY name;

-- name: api_queue_figures
-- params: window_s float8, scope text[]
-- returns: queue text, paused bool, finished int8, lag_s float8
-- Per queue over the last $1 seconds (whole minutes): finished runs (throughput) and the mean delay between
-- a run being due and its attempt starting (schedule lag), from the per-minute rollup the recorder
-- maintains (queue_minutes): counters, not a scan of runs or attempts, at any table size. The mean is
-- taken over the start-lag histogram's bucket midpoints (fencepost.core.stats.BOUNDS_MS).
WITH m AS (
    SELECT queue, succeeded + failed AS finished, lag_hist FROM queue_minutes
    WHERE minute >= date_trunc('minute', now() - make_interval(secs => $1)) AND ($2::text[] IS NULL OR queue = ANY($2))
), lag AS (
    SELECT m.queue, sum(u.n) AS n,
           sum(u.n * (ARRAY[5, 17.5, 37.5, 75, 175, 375, 750, 1750, 3750, 7500, 20000, 45000, 180000, 600000,
                            2250000, 3600000]::double precision[])[u.i]) AS ms
    FROM m, unnest(m.lag_hist) WITH ORDINALITY AS u(n, i) GROUP BY m.queue
)
SELECT q.name AS queue, q.paused,
       COALESCE((SELECT sum(finished) FROM m WHERE m.queue = q.name), 0)::bigint AS finished,
       (SELECT CASE WHEN lag.n > 0 THEN lag.ms / lag.n / 1000 END FROM lag WHERE lag.queue = q.name) AS lag_s
FROM queues q WHERE ($2::text[] IS NULL OR q.name = ANY($2)) ORDER BY q.name;

-- name: pause_queue
-- params: name text, paused bool
-- returns: n int8
WITH q AS (
    UPDATE queues SET paused = $2 WHERE name = $1 RETURNING name
)
SELECT count(*) AS n FROM q;

-- name: queue_event
-- params: queue text, type text, actor text, reason text
-- returns: nothing
INSERT INTO events (queue, type, actor, reason, at) VALUES ($1, $2, $3, $4, now());

-- name: queue_settings
-- params: name text
-- returns: name text, weights jsonb, limits jsonb, max_running int4, priority_age_ms int8, rate_limit text,
-- returns: rate_limits jsonb
SELECT name, weights, limits, max_running, priority_age_ms, rate_limit, rate_limits FROM queues WHERE name = $1;

-- name: set_queue_weight
-- params: name text, p2 text, p3 float8
-- returns: name text
-- $3 NULL removes the tenant's weight (back to 1).
UPDATE queues SET weights = CASE WHEN $3::double precision IS NULL THEN weights - $2::text
                                 ELSE weights || jsonb_build_object($2::text, $3::double precision) END
WHERE name = $1 RETURNING name;

-- name: set_queue_limit
-- params: name text, p2 text, p3 int4
-- returns: name text
-- $3 NULL removes the override (the runs' declared limit applies again).
UPDATE queues SET limits = CASE WHEN $3::integer IS NULL THEN limits - $2::text
                                ELSE limits || jsonb_build_object($2::text, $3::integer) END
WHERE name = $1 RETURNING name;

-- name: set_queue_max_running
-- params: name text, max_running int4
-- returns: name text
UPDATE queues SET max_running = $2::integer WHERE name = $1 RETURNING name;

-- name: set_queue_aging
-- params: name text, priority_age_ms int8
-- returns: name text
UPDATE queues SET priority_age_ms = $2::bigint WHERE name = $1 RETURNING name;

-- name: set_queue_rate
-- params: name text, rate_limit text
-- returns: name text
-- The queue-wide rate ('N/ms'; NULL: none).
UPDATE queues SET rate_limit = $2::text WHERE name = $1 RETURNING name;

-- name: set_queue_key_rate
-- params: name text, p2 text, p3 text
-- returns: name text
-- $3 NULL removes the override (the runs' declared rate applies again).
UPDATE queues SET rate_limits = CASE WHEN $3::text IS NULL THEN rate_limits - $2::text
                                     ELSE rate_limits || jsonb_build_object($2::text, $3::text) END
WHERE name = $1 RETURNING name;

-- name: lock_queue_settings
-- params: name text
-- returns: name text
-- Held while a settings change is copied to Redis: concurrent changes reach Redis in order.
SELECT name FROM queues WHERE name = $1 FOR UPDATE;

-- name: rollup_minutes
-- params: queue text[], minute timestamptz[], started int4[], succeeded int4[], failed int4[],
-- params: retried int4[], p7 int4[], p8 int4[], queue_2 text[], minute_2 timestamptz[], run_id int8[],
-- params: attempt int4[]
-- returns: nothing
-- The recorder's batch into queue_minutes (in the transaction of the events it counts). The recorder
-- counts the batch per (queue, minute) itself: $1 queue, $2 minute, $3-$6 started / succeeded / failed /
-- retried, $7 and $8 the 16-bucket start-lag and run-time histograms, flattened (16 per row, buckets of
-- fencepost.core.stats.BOUNDS_MS). Run times it cannot know (the attempt started in an earlier batch)
-- come from the attempt row this transaction just wrote: $9 queue, $10 minute, $11 run id, $12 attempt
-- of each such finish, bucketed here and added to its row's run-time histogram.
WITH g AS (
    SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::int[], $4::int[], $5::int[], $6::int[])
        WITH ORDINALITY AS g(queue, minute, started, succeeded, failed, retried, n)
), looked AS (
    SELECT l.queue, l.minute,
           (SELECT (extract(epoch FROM a.finished_at - a.started_at) * 1000)::bigint FROM attempts a
            WHERE a.run_id = l.run_id AND a.attempt = l.attempt) AS run_ms
    FROM unnest($9::text[], $10::timestamptz[], $11::bigint[], $12::int[]) AS l(queue, minute, run_id, attempt)
), lb AS MATERIALIZED (  -- one attempt lookup per finish, not one per bucket
    SELECT queue, minute,
           width_bucket(run_ms, ARRAY[10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000,
                                      900000, 3600000]::bigint[]) + 1 AS b
    FROM looked
), agg AS (
    SELECT g.queue, g.minute, g.started, g.succeeded, g.failed, g.retried,
           ($7::int[])[(g.n - 1) * 16 + 1:g.n * 16] AS lag_hist,
           ARRAY(SELECT ($8::int[])[(g.n - 1) * 16 + i]
                        + (SELECT count(*) FROM lb WHERE lb.queue = g.queue AND lb.minute = g.minute AND lb.b = i)::int
                 FROM generate_series(1, 16) i ORDER BY i) AS run_hist
    FROM g
)
INSERT INTO queue_minutes AS q (queue, minute, started, succeeded, failed, retried, lag_hist, run_hist)
SELECT * FROM agg
ON CONFLICT (minute, queue) DO UPDATE SET
    started = q.started + EXCLUDED.started, succeeded = q.succeeded + EXCLUDED.succeeded,
    failed = q.failed + EXCLUDED.failed, retried = q.retried + EXCLUDED.retried,
    lag_hist = ARRAY(SELECT x + y FROM unnest(q.lag_hist, EXCLUDED.lag_hist) WITH ORDINALITY AS u(x, y, i) ORDER BY i),
    run_hist = ARRAY(SELECT x + y FROM unnest(q.run_hist, EXCLUDED.run_hist) WITH ORDINALITY AS u(x, y, i) ORDER BY i);

-- name: queue_stats
-- params: queue text, min_minute timestamptz, p3 interval, queue_2 text[]
-- returns: t timestamptz, started int4, succeeded int4, failed int4, retried int4, lag_hist int4[],
-- returns: run_hist int4[]
-- The rollup for a chart: per step from $2, summed over $1 (NULL: every queue in scope $4); $3 the step.
WITH m AS (
    SELECT date_bin($3::interval, minute, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS t, *
    FROM queue_minutes
    WHERE minute >= $2 AND ($1::text IS NULL OR queue = $1) AND ($4::text[] IS NULL OR queue = ANY($4))
), h AS (
    SELECT t, i, sum(l)::int AS l, sum(r)::int AS r
    FROM m, unnest(m.lag_hist, m.run_hist) WITH ORDINALITY AS u(l, r, i) GROUP BY t, i
)
SELECT c.t, c.started, c.succeeded, c.failed, c.retried,
       ARRAY(SELECT l FROM h WHERE h.t = c.t ORDER BY i) AS lag_hist,
       ARRAY(SELECT r FROM h WHERE h.t = c.t ORDER BY i) AS run_hist
FROM (SELECT t, sum(started)::int AS started, sum(succeeded)::int AS succeeded, sum(failed)::int AS failed,
             sum(retried)::int AS retried FROM m GROUP BY t) c
ORDER BY c.t;

-- name: rebuild_epoch
-- params: name text
-- returns: epoch int8
-- The epoch a rebuild stamps: a new one when the current one may have been stamped, else the
-- current one again (an earlier rebuild bumped it and failed before stamping: no token exists
-- under it). The cap (epoch < 8192, tokens are doubles in Lua) raises check_violation.
UPDATE queues SET epoch = CASE WHEN epoch_stamped THEN epoch + 1 ELSE epoch END, epoch_stamped = false
WHERE name = $1 RETURNING epoch;

-- name: epoch_stamping
-- params: name text, epoch int8
-- returns: nothing
-- Written just before the stamp reaches Redis: from here tokens may exist under this epoch.
UPDATE queues SET epoch_stamped = true WHERE name = $1 AND epoch = $2;

-- name: ops_queue_rows
-- params: name text[]
-- returns: name text, paused bool, max_running int4
-- The queues in scope ($1) with the queue-wide concurrency limit.
SELECT name, paused, max_running FROM queues WHERE ($1::text[] IS NULL OR name = ANY($1)) ORDER BY name;

-- The per-handler queries read an attempt's handler and queue from its run by the primary key, one
-- lookup per attempt of the window (OFFSET 0 keeps the lookup a nested loop): the window's bounds are
-- parameters, and a generic plan that guesses a third of the attempts hash-joins all of `runs` instead
-- (0.5 s at 1,000,000 runs for the 1,700 attempts of an hour).

-- name: declare_queues
-- params: p1 text[]
-- returns: name text, epoch int8
-- Create the named queues that do not exist yet; returns the ones this call created (their
-- creator may stamp them: a queue with no history has nothing Redis could have lost).
INSERT INTO queues (name) SELECT DISTINCT unnest($1::text[]) ORDER BY 1
ON CONFLICT (name) DO NOTHING RETURNING name, epoch;

-- name: queue_row
-- params: name text
-- returns: name text, epoch int8, paused bool, created_at timestamptz
SELECT name, epoch, paused, created_at FROM queues WHERE name = $1;

-- name: queue_epoch
-- params: name text
-- returns: epoch int8, paused bool
SELECT epoch, paused FROM queues WHERE name = $1;
