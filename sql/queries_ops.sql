-- Named queries of the dashboard's operations routes (scheduler/api/routes_ops.py, issue 24).
-- Every listing filters by the token's scope ($scope: NULL = every queue) before it limits.

-- name: ops_list_finished
-- params: p1 text, queue text, handler text, queue_2 text[], cursor_finished_at timestamptz, cursor_id int8,
-- params: limit int8
-- returns: id int8, handler text, queue text, status text, attempt int4, priority int2, version int8,
-- returns: run_at timestamptz, created_at timestamptz, started_at timestamptz, finished_at timestamptz,
-- returns: last_error_class text, last_error text, reason text, workflow_id uuid, schedule_id int8
-- The dead letter ($1 'dead': FAILED / TIMED_OUT, not under review) or the review queue ($1 'review'),
-- newest finish first, paged by the keyset ($5 finished_at, $6 id) of the last row of the page before.
-- $2 queue, $3 handler, $4 queues in scope, $7 limit.
SELECT id, handler, queue, status, attempt, priority, version, run_at, created_at, started_at, finished_at,
       last_error_class, last_error, reason, workflow_id, schedule_id
FROM runs
WHERE status IN ('FAILED', 'TIMED_OUT')
  AND CASE WHEN $1::text = 'review' THEN status = 'FAILED' AND reason = 'review'
           ELSE reason IS DISTINCT FROM 'review' END
  AND ($2::text IS NULL OR queue = $2) AND ($3::text IS NULL OR handler = $3)
  AND ($4::text[] IS NULL OR queue = ANY($4))
  AND ($5::timestamptz IS NULL OR (finished_at, id) < ($5, $6::bigint))
ORDER BY finished_at DESC, id DESC
LIMIT $7;

-- name: ops_list_retries
-- params: queue text, handler text, queue_2 text[], cursor_run_at timestamptz, cursor_id int8, limit int8
-- returns: id int8, handler text, queue text, status text, attempt int4, priority int2, version int8,
-- returns: run_at timestamptz, created_at timestamptz, started_at timestamptz, finished_at timestamptz,
-- returns: last_error_class text, last_error text, reason text, workflow_id uuid, schedule_id int8
-- Retries waiting (RETRY_WAIT), soonest first, paged by the keyset ($4 run_at, $5 id). $1 queue,
-- $2 handler, $3 queues in scope, $6 limit. Its own statement (not one with the scheduled list's, by a
-- parameter): the state is written out, so the partial index of RETRY_WAIT runs (036) is used instead of
-- walking the due PENDING runs of the waiting index first (294 ms at 1,000,000 due runs).
SELECT id, handler, queue, status, attempt, priority, version, run_at, created_at, started_at, finished_at,
       last_error_class, last_error, reason, workflow_id, schedule_id
FROM runs
WHERE status = 'RETRY_WAIT'
  AND ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR handler = $2)
  AND ($3::text[] IS NULL OR queue = ANY($3))
  AND ($4::timestamptz IS NULL OR (run_at, id) > ($4, $5::bigint))
ORDER BY run_at, id
LIMIT $6;

-- name: ops_list_scheduled
-- params: queue text, handler text, queue_2 text[], cursor_run_at timestamptz, cursor_id int8, limit int8
-- returns: id int8, handler text, queue text, status text, attempt int4, priority int2, version int8,
-- returns: run_at timestamptz, created_at timestamptz, started_at timestamptz, finished_at timestamptz,
-- returns: last_error_class text, last_error text, reason text, workflow_id uuid, schedule_id int8
-- Scheduled runs (PENDING with a run_at in the future), soonest first, paged by the keyset ($4 run_at,
-- $5 id); the waiting index (035) from now on. $1 queue, $2 handler, $3 queues in scope, $6 limit.
SELECT id, handler, queue, status, attempt, priority, version, run_at, created_at, started_at, finished_at,
       last_error_class, last_error, reason, workflow_id, schedule_id
FROM runs
WHERE status = 'PENDING' AND run_at > now()
  AND ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR handler = $2)
  AND ($3::text[] IS NULL OR queue = ANY($3))
  AND ($4::timestamptz IS NULL OR (run_at, id) > ($4, $5::bigint))
ORDER BY run_at, id
LIMIT $6;

-- name: ops_runs_by_id
-- params: id int8[], queue text[]
-- returns: id int8, handler text, queue text, status text, version int8, reason text
-- The runs among $1 that are in scope ($2), with their versions and reasons (a selection ticked on a page).
SELECT id, handler, queue, status, version, reason FROM runs WHERE id = ANY($1::bigint[]) AND ($2::text[] IS NULL OR queue = ANY($2))
ORDER BY id;

-- name: ops_archive_run
-- params: id int8, version int8
-- returns: id int8
-- Delete a finished run from the lists: it moves to runs_archive with its checkpoint gone (as retention
-- moves it), only while it is still at version $2 in a terminal state and not part of a workflow.
-- Its events and attempts stay: GET /v1/runs/{id} and its timeline still show it. NULL when it moved.
WITH picked AS (
    SELECT id FROM runs WHERE id = $1 AND version = $2
      AND status IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED') AND workflow_id IS NULL
    FOR UPDATE
), ckpt AS (
    DELETE FROM checkpoints c USING picked p WHERE c.run_id = p.id
), moved AS (
    DELETE FROM runs r USING picked p WHERE r.id = p.id RETURNING r.*
)
INSERT INTO runs_archive SELECT * FROM moved RETURNING id;

-- name: ops_run_events_after
-- params: run_id int8, cursor_recorded_at timestamptz, p3 float8, cursor_id int8, limit int8
-- returns: id int8, type text, from_status text, to_status text, version int8, attempt int4, token int8,
-- returns: worker_id text, actor text, reason text, error_class text, error_message text, trace_id text,
-- returns: at timestamptz, recorded_at timestamptz
-- A run's timeline (the view `history`: its event rows and its attempts' claim and finish columns, as
-- run_events reads it) recorded since the page's last look: $2 the latest recorded_at the page has seen
-- (NULL: from the start), looked back $3 seconds (a batch that began earlier can commit later; the page
-- skips the ids it has), or, with $4, the rows after ($2, $4) in (recorded_at, id) order (the next page
-- of a long answer). At most $5, in the order recorded.
SELECT id, type, from_status, to_status, version, attempt, token, worker_id, actor, reason,
       error_class, error_message, trace_id, at, recorded_at
FROM history
WHERE run_id = $1
  AND ($2::timestamptz IS NULL
       OR ($4::bigint IS NULL AND recorded_at >= $2 - make_interval(secs => $3::double precision))
       OR ($4::bigint IS NOT NULL AND (recorded_at, id) > ($2, $4)))
ORDER BY recorded_at, id LIMIT $5;

-- name: ops_queue_rows
-- params: name text[]
-- returns: name text, paused bool, max_running int4
-- The queues in scope ($1) with the queue-wide concurrency limit.
SELECT name, paused, max_running FROM queues WHERE ($1::text[] IS NULL OR name = ANY($1)) ORDER BY name;

-- The per-handler queries read an attempt's handler and queue from its run by the primary key, one
-- lookup per attempt of the window (OFFSET 0 keeps the lookup a nested loop): the window's bounds are
-- parameters, and a generic plan that guesses a third of the attempts hash-joins all of `runs` instead
-- (0.5 s at 1,000,000 runs for the 1,700 attempts of an hour).

-- name: ops_handler_rollup
-- params: p1 timestamptz, max_started_at timestamptz, min_bucket timestamptz
-- returns: bucket timestamptz
-- Roll up the closed 15-minute buckets (handler_buckets, 039) from $1 to $2 (exclusive; the caller's
-- now - 30 minutes, aligned) that are not rolled up yet: one row per bucket, queue and handler of the
-- attempts started in it. A bucket with an attempt still running waits, unless it began before $3
-- (now - 6 hours). Returns the buckets closed now.
WITH todo AS (
    SELECT b FROM generate_series($1::timestamptz, $2::timestamptz - interval '15 minutes', interval '15 minutes') b
    WHERE NOT EXISTS (SELECT 1 FROM handler_buckets_done d WHERE d.bucket = b)
), att AS (
    SELECT date_bin('15 minutes', x.started_at, timestamptz '1970-01-01 00:00:00+00') AS bucket, x.*
    FROM (SELECT r.queue, r.handler, a.started_at, a.outcome, a.finished_at,
           width_bucket((extract(epoch FROM a.finished_at - a.started_at) * 1000)::float8,
                        '{10,25,50,100,250,500,1000,2500,5000,10000,30000,60000,300000,900000,3600000}'::float8[]) AS h
    FROM attempts a CROSS JOIN LATERAL (SELECT queue, handler FROM runs WHERE id = a.run_id OFFSET 0) r
          WHERE a.started_at >= (SELECT min(b) FROM todo) AND a.started_at < $2) x
), waiting AS (
    SELECT DISTINCT bucket FROM att WHERE finished_at IS NULL AND bucket >= $3
), closing AS (
    SELECT b FROM todo WHERE b NOT IN (SELECT bucket FROM waiting)
), rolled AS (
    INSERT INTO handler_buckets (bucket, queue, handler, started, succeeded, failed, run_hist)
    SELECT bucket, queue, handler, count(*), count(*) FILTER (WHERE outcome = 'succeeded'),
           count(*) FILTER (WHERE outcome IN ('error', 'fatal', 'timeout', 'crash', 'policy', 'review')),
           ARRAY[count(*) FILTER (WHERE h = 0), count(*) FILTER (WHERE h = 1), count(*) FILTER (WHERE h = 2), count(*) FILTER (WHERE h = 3),
           count(*) FILTER (WHERE h = 4), count(*) FILTER (WHERE h = 5), count(*) FILTER (WHERE h = 6), count(*) FILTER (WHERE h = 7),
           count(*) FILTER (WHERE h = 8), count(*) FILTER (WHERE h = 9), count(*) FILTER (WHERE h = 10), count(*) FILTER (WHERE h = 11),
           count(*) FILTER (WHERE h = 12), count(*) FILTER (WHERE h = 13), count(*) FILTER (WHERE h = 14), count(*) FILTER (WHERE h = 15)]
    FROM att WHERE bucket IN (SELECT b FROM closing)
    GROUP BY 1, 2, 3
    ON CONFLICT DO NOTHING
    RETURNING bucket
)
INSERT INTO handler_buckets_done (bucket) SELECT b FROM closing ON CONFLICT DO NOTHING RETURNING bucket;

-- name: ops_handler_live_from
-- params: p1 timestamptz, p2 timestamptz
-- returns: live_from timestamptz
-- Where the rolled-up part of a window starting at $1 ends: its first bucket not rolled up (at most $2,
-- the aligned end of what may be rolled up). Attempts from there on are read from `attempts`.
SELECT coalesce(min(b), $2::timestamptz) AS live_from
FROM generate_series($1::timestamptz, $2::timestamptz - interval '15 minutes', interval '15 minutes') b
WHERE NOT EXISTS (SELECT 1 FROM handler_buckets_done d WHERE d.bucket = b);

-- name: ops_handler_live
-- params: min_started_at timestamptz, p2 interval, queue text[], queue_2 text
-- returns: handler text, t timestamptz, h int4, started int8, succeeded int8, failed int8
-- Per handler, step $2 (aligned to the Unix epoch, as the queue charts are) and run-time bucket h (the
-- 16 buckets of BOUNDS_MS, 0-15; NULL while the attempt runs) over the attempts started at or after $1
-- (the part of the window not rolled up): started, succeeded, failed. $3 queues in scope, $4 queue. The
-- totals and a handler's points are both summed from these rows (one read of the attempts); grouping by
-- h costs three aggregates a row where sixteen FILTERed counts cost nineteen (13 ms of 19 for an hour).
SELECT handler, date_bin($2::interval, started_at, timestamptz '1970-01-01 00:00:00+00') AS t, h, count(*) AS started,
       count(*) FILTER (WHERE outcome = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE outcome IN ('error', 'fatal', 'timeout', 'crash', 'policy', 'review')) AS failed
FROM (SELECT r.queue, r.handler, a.started_at, a.outcome,
             width_bucket((extract(epoch FROM a.finished_at - a.started_at) * 1000)::float8,
                          '{10,25,50,100,250,500,1000,2500,5000,10000,30000,60000,300000,900000,3600000}'::float8[]) AS h
      FROM attempts a CROSS JOIN LATERAL (SELECT queue, handler FROM runs WHERE id = a.run_id OFFSET 0) r
      WHERE a.started_at >= $1 AND ($3::text[] IS NULL OR r.queue = ANY($3)) AND ($4::text IS NULL OR r.queue = $4)) x
GROUP BY 1, 2, 3;

-- name: ops_handler_rolled
-- params: min_bucket timestamptz, p2 interval, queue text[], queue_2 text, max_bucket timestamptz
-- returns: handler text, t timestamptz, started int8, succeeded int8, failed int8, run_hist int8[]
-- The same from handler_buckets, for the buckets from $1 up to $5 (exclusive).
SELECT handler, date_bin($2::interval, bucket, timestamptz '1970-01-01 00:00:00+00') AS t,
       sum(started)::bigint AS started, sum(succeeded)::bigint AS succeeded, sum(failed)::bigint AS failed,
       ARRAY[sum(run_hist[1]), sum(run_hist[2]), sum(run_hist[3]), sum(run_hist[4]),
       sum(run_hist[5]), sum(run_hist[6]), sum(run_hist[7]), sum(run_hist[8]),
       sum(run_hist[9]), sum(run_hist[10]), sum(run_hist[11]), sum(run_hist[12]),
       sum(run_hist[13]), sum(run_hist[14]), sum(run_hist[15]), sum(run_hist[16])]::bigint[] AS run_hist
FROM handler_buckets
WHERE bucket >= $1 AND bucket < $5 AND ($3::text[] IS NULL OR queue = ANY($3)) AND ($4::text IS NULL OR queue = $4)
GROUP BY 1, 2;

-- name: ops_select_runs
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: queue_2 text[], id int8, tenant text, concurrency_key text, idempotency_key text, p11 text,
-- params: limit int8
-- returns: id int8, handler text, queue text, status text, version int8, reason text
-- The runs a bulk action over the runs list's filter counts (the same filters GET /v1/runs takes):
-- $1 queue, $2 status, $3 handler, $4 created at or after, $5 created before, $6 queues in scope,
-- $7 id, $8 tenant, $9 concurrency key, $10 idempotency key, $11 argument substring, $12 at most this
-- many, lowest ids first.
SELECT r.id, r.handler, r.queue, r.status, r.version, r.reason FROM runs r
WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
  AND ($3::text IS NULL OR r.handler = $3)
  AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
  AND ($6::text[] IS NULL OR r.queue = ANY($6))
  AND ($7::bigint IS NULL OR r.id = $7)
  AND ($8::text IS NULL OR r.tenant = $8)
  AND ($9::text IS NULL OR r.concurrency_key = $9)
  AND ($10::text IS NULL OR r.idempotency_key = $10)
  AND ($11::text IS NULL OR position(convert_to($11, 'UTF8') IN r.payload) > 0)
ORDER BY r.id LIMIT $12;
