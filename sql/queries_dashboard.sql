-- Queries of the dashboard's views (issue 17), run through fencepost.core.record.

-- name: dashboard_runs
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: limit int8, queue_2 text[], submitted_by text, max_id int8, id int8, tenant text,
-- params: concurrency_key text, idempotency_key text, p14 text, p15 text, p16 text, offset int8, min_id int8
-- returns: id int8, handler text, queue text, status text, priority int2, attempt int4, run_at timestamptz,
-- returns: created_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: last_error text, reason text, version int8, workflow_id uuid, schedule_id int8
-- The runs list: every filter optional (NULL: any). $1 queue, $2 status, $3 handler, $4 created at or
-- after, $5 created before, $6 limit, $7 queues in scope (NULL: all), $8 submitted by this actor prefix
-- (NULL: anyone), $9 before id (keyset, id order only), $10 id, $11 tenant, $12 concurrency key,
-- $13 idempotency key, $14 argument substring (bytes of a string argument, as msgpack stores it),
-- $15 sort column (id, created_at, finished_at, attempt, handler, status), $16 'asc' / 'desc', $17 offset,
-- $18 the argument search looks only at ids above this (the newest runs: a bounded scan, not the table).
SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
       r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
FROM runs r
WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
  AND ($3::text IS NULL OR r.handler = $3)
  AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
  AND ($7::text[] IS NULL OR r.queue = ANY($7))
  AND ($8::text IS NULL OR r.submitted_by = $8 OR r.submitted_by LIKE $8 || '@%'  -- the run row (021) or
       OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id  -- its event row
                  AND (e.actor = $8 OR e.actor LIKE $8 || '@%')))
  AND ($9::bigint IS NULL OR r.id < $9)
  AND ($10::bigint IS NULL OR r.id = $10)
  AND ($11::text IS NULL OR r.tenant = $11)
  AND ($12::text IS NULL OR r.concurrency_key = $12)
  AND ($13::text IS NULL OR r.idempotency_key = $13)
  AND ($14::text IS NULL OR (r.id > $18 AND position(convert_to($14, 'UTF8') IN r.payload) > 0))
ORDER BY
  -- created_at is never NULL: its default null order lets runs_created_page serve both directions
  CASE WHEN $16 = 'asc' AND $15 = 'created_at' THEN r.created_at END ASC,
  CASE WHEN $16 = 'desc' AND $15 = 'created_at' THEN r.created_at END DESC,
  CASE WHEN $16 = 'asc' AND $15 = 'finished_at' THEN r.finished_at END ASC NULLS LAST,
  CASE WHEN $16 = 'desc' AND $15 = 'finished_at' THEN r.finished_at END DESC NULLS LAST,
  CASE WHEN $16 = 'asc' THEN CASE $15 WHEN 'handler' THEN r.handler WHEN 'status' THEN r.status END END ASC,
  CASE WHEN $16 = 'desc' THEN CASE $15 WHEN 'handler' THEN r.handler WHEN 'status' THEN r.status END END DESC,
  CASE WHEN $16 = 'asc' AND $15 = 'attempt' THEN r.attempt END ASC,
  CASE WHEN $16 = 'desc' AND $15 = 'attempt' THEN r.attempt END DESC,
  CASE WHEN $16 = 'asc' THEN r.id END ASC,
  r.id DESC
LIMIT $6 OFFSET $17;

-- name: dashboard_runs_count
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: queue_2 text[], submitted_by text, max_id int8, id int8, tenant text, concurrency_key text,
-- params: idempotency_key text, p13 text, limit int8, min_id int8
-- returns: n int8
-- How many runs the filters of dashboard_runs match, counted up to a bound (the page says "more than N"
-- rather than scan a huge table for an exact figure). $1 queue, $2 status, $3 handler, $4 since, $5 until,
-- $6 queues in scope, $7 submitter prefix, $8 before id, $9 id, $10 tenant, $11 concurrency key,
-- $12 idempotency key, $13 argument substring, $14 the bound, $15 the argument search's lowest id (exclusive).
SELECT count(*) AS n FROM (
  SELECT 1 FROM runs r
  WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
    AND ($3::text IS NULL OR r.handler = $3)
    AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
    AND ($6::text[] IS NULL OR r.queue = ANY($6))
    AND ($7::text IS NULL OR r.submitted_by = $7 OR r.submitted_by LIKE $7 || '@%'  -- the run row (021) or
         OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id  -- its event row
                    AND (e.actor = $7 OR e.actor LIKE $7 || '@%')))
    AND ($8::bigint IS NULL OR r.id < $8)
    AND ($9::bigint IS NULL OR r.id = $9)
    AND ($10::text IS NULL OR r.tenant = $10)
    AND ($11::text IS NULL OR r.concurrency_key = $11)
    AND ($12::text IS NULL OR r.idempotency_key = $12)
    AND ($13::text IS NULL OR (r.id > $15 AND position(convert_to($13, 'UTF8') IN r.payload) > 0))
  LIMIT $14
) m;

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

-- name: runs_max_id
-- params: none
-- returns: id int8
SELECT COALESCE(max(id), 0) AS id FROM runs;
