-- Named queries of the dashboard's operations routes (scheduler/api/routes_ops.py, issue 24).
-- Every listing filters by the token's scope ($scope: NULL = every queue) before it limits.

-- name: ops_list_finished
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
-- The runs among $1 that are in scope ($2), with their versions and reasons (a selection ticked on a page).
SELECT id, handler, queue, status, version, reason FROM runs WHERE id = ANY($1::bigint[]) AND ($2::text[] IS NULL OR queue = ANY($2))
ORDER BY id;

-- name: ops_archive_run
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
-- The queues in scope ($1) with the queue-wide concurrency limit.
SELECT name, paused, max_running FROM queues WHERE ($1::text[] IS NULL OR name = ANY($1)) ORDER BY name;

-- name: ops_handler_totals
-- Per handler over the attempts started at or after $1: started, succeeded, failed, and run-time
-- percentiles (ms) of the finished ones. $2 queues in scope, $3 queue.
SELECT r.handler,
       count(*) AS started,
       count(*) FILTER (WHERE a.outcome = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE a.outcome IN ('error', 'fatal', 'timeout', 'crash', 'policy', 'review')) AS failed,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.finished_at - a.started_at) * 1000)
           FILTER (WHERE a.finished_at IS NOT NULL) AS run_p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM a.finished_at - a.started_at) * 1000)
           FILTER (WHERE a.finished_at IS NOT NULL) AS run_p95_ms
FROM attempts a JOIN runs r ON r.id = a.run_id
WHERE a.started_at >= $1 AND ($2::text[] IS NULL OR r.queue = ANY($2)) AND ($3::text IS NULL OR r.queue = $3)
GROUP BY r.handler ORDER BY started DESC, r.handler LIMIT 200;

-- name: ops_handler_points
-- One handler's ($4) attempts started at or after $1, per step $2 (aligned to the Unix epoch, as the
-- queue charts are): started, succeeded, failed, run-time p50 / p95 (ms). $3 queues in scope, $5 queue.
SELECT date_bin($2::interval, a.started_at, timestamptz '1970-01-01 00:00:00+00') AS t,
       count(*) AS started,
       count(*) FILTER (WHERE a.outcome = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE a.outcome IN ('error', 'fatal', 'timeout', 'crash', 'policy', 'review')) AS failed,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.finished_at - a.started_at) * 1000)
           FILTER (WHERE a.finished_at IS NOT NULL) AS run_p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM a.finished_at - a.started_at) * 1000)
           FILTER (WHERE a.finished_at IS NOT NULL) AS run_p95_ms
FROM attempts a JOIN runs r ON r.id = a.run_id
WHERE a.started_at >= $1 AND r.handler = $4 AND ($3::text[] IS NULL OR r.queue = ANY($3))
  AND ($5::text IS NULL OR r.queue = $5)
GROUP BY 1 ORDER BY 1;

-- name: ops_batches
-- Batches, newest first, whose members (those still in `runs`) are all in scope ($1), among the $4
-- newest created before $2 (paging), at most $3; each with its members counted by state. The scan is
-- bounded ($4): a scoped token whose queues hold few of the batches gets a short page and a cursor
-- (ops_batches_scanned) instead of a read of every batch's members.
SELECT b.id, b.name, b.created_at, b.settled_at, b.on_complete, b.on_success, c.members, c.succeeded, c.failed,
       c.cancelled, c.waiting, c.archived, c.queues
FROM (SELECT * FROM batches WHERE ($2::timestamptz IS NULL OR created_at < $2) ORDER BY created_at DESC LIMIT $4) b
CROSS JOIN LATERAL (
    SELECT count(*) AS members,
           count(*) FILTER (WHERE r.status = 'SUCCEEDED') AS succeeded,
           count(*) FILTER (WHERE r.status IN ('FAILED', 'TIMED_OUT')) AS failed,
           count(*) FILTER (WHERE r.status = 'CANCELLED') AS cancelled,
           count(*) FILTER (WHERE r.status NOT IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED')) AS waiting,
           count(*) FILTER (WHERE r.id IS NULL) AS archived,
           coalesce(array_agg(DISTINCT r.queue) FILTER (WHERE r.queue IS NOT NULL), '{}') AS queues
    FROM batch_members m LEFT JOIN runs r ON r.id = m.run_id WHERE m.batch_id = b.id
) c
WHERE ($1::text[] IS NULL OR (cardinality(c.queues) > 0 AND c.queues <@ $1::text[]))
ORDER BY b.created_at DESC
LIMIT $3;

-- name: ops_batches_scanned
-- How far ops_batches' bounded scan ($2 batches created before $1) reached: the oldest creation time
-- it read and how many it read (fewer than $2: the end).
SELECT min(created_at) AS oldest, count(*) AS n
FROM (SELECT created_at FROM batches WHERE ($1::timestamptz IS NULL OR created_at < $1)
      ORDER BY created_at DESC LIMIT $2) s;

-- name: ops_select_runs
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
