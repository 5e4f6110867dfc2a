-- Named queries: Handlers: registered definitions and per-handler figures.
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: upsert_definitions
-- params: name text[], model text[], queue text[], priority int2[], timeout_s float8[], max_retries int4[],
-- params: version int4[], resumable bool[], owner text[], options jsonb[]
-- returns: nothing
INSERT INTO job_definitions (name, model, queue, priority, timeout_s, max_retries, version, resumable, owner, options, updated_at)
SELECT * , now() FROM unnest($1::text[], $2::text[], $3::text[], $4::smallint[], $5::double precision[],
                             $6::integer[], $7::integer[], $8::boolean[], $9::text[], $10::jsonb[])
ON CONFLICT (name) DO UPDATE SET model = excluded.model, queue = excluded.queue, priority = excluded.priority,
    timeout_s = excluded.timeout_s, max_retries = excluded.max_retries, version = excluded.version,
    resumable = excluded.resumable, owner = excluded.owner, options = excluded.options, updated_at = now();

-- name: definitions
-- params: none
-- returns: name text, model text, queue text, priority int2, timeout_s float8, max_retries int4,
-- returns: version int4, resumable bool, owner text, options jsonb
SELECT name, model, queue, priority, timeout_s, max_retries, version, resumable, owner, options FROM job_definitions;

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
