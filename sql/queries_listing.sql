-- Named queries of the API's listings that filter by the caller's scope before they limit and
-- page with keyset cursors (issue 24 item 3): the dead letter and the review queue.

-- name: api_dead_letter_page
-- params: queue text, scope text[], limit int8, after_finished_at timestamptz, after_id int8, review bool
-- returns: id int8, handler text, queue text, status text, attempt int4, priority int2, version int8,
-- returns: run_at timestamptz, created_at timestamptz, started_at timestamptz, finished_at timestamptz,
-- returns: last_error_class text, last_error text, reason text, workflow_id uuid, schedule_id int8
-- Dead-lettered runs (FAILED / TIMED_OUT, not in review), newest finished first. $1 queue (NULL: any),
-- $2 queues in scope (NULL: all), $3 limit, $4/$5 the cursor: only rows after (finished_at, id)
-- in this order (NULL: from the start), $6 review (true: the review queue instead).
SELECT id, handler, queue, status, attempt, priority, version, run_at, created_at, started_at, finished_at,
       last_error_class, last_error, reason, workflow_id, schedule_id
FROM runs
WHERE status IN ('FAILED', 'TIMED_OUT')
  AND (CASE WHEN $6::boolean THEN status = 'FAILED' AND reason = 'review' ELSE reason IS DISTINCT FROM 'review' END)
  AND ($1::text IS NULL OR queue = $1)
  AND ($2::text[] IS NULL OR queue = ANY($2))
  AND ($4::timestamptz IS NULL OR (finished_at, id) < ($4, $5::bigint))
ORDER BY finished_at DESC, id DESC
LIMIT $3;

-- The runs list by keyset cursor (issue 24): the filters of dashboard_runs (queries_dashboard.sql; same
-- $1-$17 except $17, which is the argument search's lowest id here, and no offset), then only rows after
-- the cursor in the page's order. $15 sort, $16 'asc' / 'desc', $18 a cursor is given, then its key. Two statements, so that each prepared plan serves sorts of
-- one kind: a custom plan folds the CASEs to one row comparison and one ORDER BY, which an index serves
-- for id and created_at (runs_pkey, runs_created_page, runs_queue_created_page); a plan cached generic
-- after sorts no index serves would make those slow too if they shared it.

-- name: api_runs_page_indexed
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: limit int8, scope text[], submitted_by text, max_id int8, id int8, tenant text, concurrency_key text,
-- params: idempotency_key text, arg text, sort text, sort_order text, arg_min_id int8, has_cursor bool,
-- params: after_created_at timestamptz, after_id int8
-- returns: id int8, handler text, queue text, status text, priority int2, attempt int4, run_at timestamptz,
-- returns: created_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: last_error text, reason text, version int8, workflow_id uuid, schedule_id int8
-- Sorts an index serves: id, created_at (never NULL); $19 the cursor's created_at, $20 its id.
SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
       r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
FROM runs r
WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
  AND ($3::text IS NULL OR r.handler = $3)
  AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
  AND ($7::text[] IS NULL OR r.queue = ANY($7))
  AND ($8::text IS NULL OR r.submitted_by = $8 OR r.submitted_by LIKE $8 || '@%'
       OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                  AND (e.actor = $8 OR e.actor LIKE $8 || '@%')))
  AND ($9::bigint IS NULL OR r.id < $9)
  AND ($10::bigint IS NULL OR r.id = $10)
  AND ($11::text IS NULL OR r.tenant = $11)
  AND ($12::text IS NULL OR r.concurrency_key = $12)
  AND ($13::text IS NULL OR r.idempotency_key = $13)
  AND ($14::text IS NULL OR (r.id > $17 AND position(convert_to($14, 'UTF8') IN r.payload) > 0))
  AND (NOT $18::boolean OR CASE
        WHEN $15 = 'id' AND $16 = 'asc' THEN r.id > $20::bigint
        WHEN $15 = 'id' THEN r.id < $20::bigint
        WHEN $16 = 'asc' THEN (r.created_at, r.id) > ($19::timestamptz, $20::bigint)
        ELSE (r.created_at, r.id) < ($19::timestamptz, $20::bigint) END)
ORDER BY
  CASE WHEN $16 = 'asc' AND $15 = 'created_at' THEN r.created_at END ASC,
  CASE WHEN $16 = 'desc' AND $15 = 'created_at' THEN r.created_at END DESC,
  CASE WHEN $16 = 'asc' THEN r.id END ASC,
  r.id DESC
LIMIT $6;

-- name: api_runs_page_finished
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: limit int8, scope text[], submitted_by text, max_id int8, id int8, tenant text, concurrency_key text,
-- params: idempotency_key text, arg text, sort_order text, arg_min_id int8, has_cursor bool,
-- params: after_finished_at timestamptz, after_id int8
-- returns: id int8, handler text, queue text, status text, priority int2, attempt int4, run_at timestamptz,
-- returns: created_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: last_error text, reason text, version int8, workflow_id uuid, schedule_id int8
-- The sort by finish time, NULL (unfinished) last in both orders, ties by id in the same direction: the
-- finished runs and the unfinished ones as two ranges of runs_finished_page (038), each limited, then
-- merged. As api_runs_page_indexed but $15 'asc' / 'desc', $16 the argument search's lowest id, $17 a cursor
-- is given, $18 its finished_at (NULL: the cursor is in the unfinished tail), $19 its id.
SELECT * FROM (
    (SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
           r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
    FROM runs r
    WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
      AND ($3::text IS NULL OR r.handler = $3)
      AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
      AND ($7::text[] IS NULL OR r.queue = ANY($7))
      AND ($8::text IS NULL OR r.submitted_by = $8 OR r.submitted_by LIKE $8 || '@%'
           OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                      AND (e.actor = $8 OR e.actor LIKE $8 || '@%')))
      AND ($9::bigint IS NULL OR r.id < $9)
      AND ($10::bigint IS NULL OR r.id = $10)
      AND ($11::text IS NULL OR r.tenant = $11)
      AND ($12::text IS NULL OR r.concurrency_key = $12)
      AND ($13::text IS NULL OR r.idempotency_key = $13)
      AND ($14::text IS NULL OR (r.id > $16 AND position(convert_to($14, 'UTF8') IN r.payload) > 0))
      AND r.finished_at IS NOT NULL
      AND (NOT $17::boolean OR ($18::timestamptz IS NOT NULL AND CASE WHEN $15 = 'asc'
           THEN (r.finished_at, r.id) > ($18, $19::bigint) ELSE (r.finished_at, r.id) < ($18, $19::bigint) END))
    ORDER BY CASE WHEN $15 = 'asc' THEN r.finished_at END ASC, CASE WHEN $15 = 'desc' THEN r.finished_at END DESC,
             CASE WHEN $15 = 'asc' THEN r.id END ASC, r.id DESC
    LIMIT $6)
    UNION ALL
    (SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
           r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
    FROM runs r
    WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
      AND ($3::text IS NULL OR r.handler = $3)
      AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
      AND ($7::text[] IS NULL OR r.queue = ANY($7))
      AND ($8::text IS NULL OR r.submitted_by = $8 OR r.submitted_by LIKE $8 || '@%'
           OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                      AND (e.actor = $8 OR e.actor LIKE $8 || '@%')))
      AND ($9::bigint IS NULL OR r.id < $9)
      AND ($10::bigint IS NULL OR r.id = $10)
      AND ($11::text IS NULL OR r.tenant = $11)
      AND ($12::text IS NULL OR r.concurrency_key = $12)
      AND ($13::text IS NULL OR r.idempotency_key = $13)
      AND ($14::text IS NULL OR (r.id > $16 AND position(convert_to($14, 'UTF8') IN r.payload) > 0))
      AND r.finished_at IS NULL
      AND (NOT $17::boolean OR $18::timestamptz IS NOT NULL OR CASE WHEN $15 = 'asc' THEN r.id > $19::bigint
           ELSE r.id < $19::bigint END)
    -- by finished_at too (all NULL): the order of runs_finished_page's NULL range, read in either direction
    ORDER BY CASE WHEN $15 = 'asc' THEN r.finished_at END ASC, CASE WHEN $15 = 'desc' THEN r.finished_at END DESC,
             CASE WHEN $15 = 'asc' THEN r.id END ASC, r.id DESC
    LIMIT $6)
) p
ORDER BY finished_at IS NULL, CASE WHEN $15 = 'asc' THEN finished_at END ASC,
         CASE WHEN $15 = 'desc' THEN finished_at END DESC, CASE WHEN $15 = 'asc' THEN id END ASC, id DESC
LIMIT $6;

-- name: api_runs_page_by_queue
-- params: queues text[], statuses text[], handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: limit int8, submitted_by text, max_id int8, id int8, tenant text, concurrency_key text,
-- params: idempotency_key text, arg text, arg_min_id int8, sort text, sort_order text, has_cursor bool,
-- params: after_status text, after_id int8, offset int8
-- returns: id int8, handler text, queue text, status text, priority int2, attempt int4, run_at timestamptz,
-- returns: created_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: last_error text, reason text, version int8, workflow_id uuid, schedule_id int8
-- The runs list within a set of queues (a queue filter, or a scoped token's queues), sorted by id or by
-- status then id (issue 24): one range of runs_queue_status (queue, status, id) per queue and state, each
-- read in id order and limited, then merged. At most queues x states x limit index entries, whatever the
-- queues hold: the plain filter read every run of the queue and sorted them (30,000 of `payments`, 25 ms), or
-- walked the primary key past every newer run of other queues (100,000 for queue+status, 22 ms).
-- $1 the queues, $2 the states (a status filter: one), $3-$5 handler and creation time, $6 limit,
-- $7 submitter prefix, $8 below this id, $9 id, $10-$12 tenant, concurrency and idempotency key, $13 argument
-- substring above id $14, $15 'id' or 'status', $16 'asc' / 'desc', $17 a cursor is given, then its
-- status ($18, status sort) and id ($19), or $20 rows to skip (the dashboard's offset pages: each range
-- then reads up to limit + offset ids). Each range gets its id bounds here, so they are index conditions;
-- the ranges read ids (index-only where no other filter needs the row), the page's rows are read by id.
SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
       r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
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
    SELECT r.id, r.status  -- the index's own columns: an index-only scan when no other filter needs the row
    FROM runs r
    -- status = b.status AND lo < id < hi, written as bounds on (status, id): the scan starts at one and stops
    -- at the other (an equality on status beside them made it start at the queue's first run of that state
    -- and filter; a bound on id alone, or ORDER BY id, made the primary key look cheaper)
    WHERE r.queue = q.queue AND (r.status, r.id) > (b.status, b.lo) AND (r.status, r.id) < (b.status, b.hi)
      AND ($3::text IS NULL OR r.handler = $3)
      AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
      AND ($7::text IS NULL OR r.submitted_by = $7 OR r.submitted_by LIKE $7 || '@%'
           OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                      AND (e.actor = $7 OR e.actor LIKE $7 || '@%')))
      AND ($8::bigint IS NULL OR r.id < $8)
      AND ($9::bigint IS NULL OR r.id = $9)
      AND ($10::text IS NULL OR r.tenant = $10)
      AND ($11::text IS NULL OR r.concurrency_key = $11)
      AND ($12::text IS NULL OR r.idempotency_key = $12)
      AND ($13::text IS NULL OR (r.id > $14 AND position(convert_to($13, 'UTF8') IN r.payload) > 0))
    -- (status, id): one state's ids in order, which runs_queue_status gives and the primary key does not
    ORDER BY CASE WHEN $16 = 'asc' THEN r.status END ASC, CASE WHEN $16 = 'asc' THEN r.id END ASC,
             r.status DESC, r.id DESC
    LIMIT $6::bigint + $20::bigint
) p
ORDER BY CASE WHEN $16 = 'asc' AND $15 = 'status' THEN p.status END ASC,
         CASE WHEN $16 = 'desc' AND $15 = 'status' THEN p.status END DESC,
         CASE WHEN $16 = 'asc' THEN p.id END ASC, p.id DESC
LIMIT $6 OFFSET $20
) k JOIN runs r ON r.id = k.id  -- the page's rows only
ORDER BY CASE WHEN $16 = 'asc' AND $15 = 'status' THEN k.status END ASC,
         CASE WHEN $16 = 'desc' AND $15 = 'status' THEN k.status END DESC,
         CASE WHEN $16 = 'asc' THEN k.id END ASC, k.id DESC;

-- name: api_runs_page_other
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: limit int8, scope text[], submitted_by text, max_id int8, id int8, tenant text, concurrency_key text,
-- params: idempotency_key text, arg text, sort text, sort_order text, arg_min_id int8, has_cursor bool,
-- params: after_int int8, after_text text, after_id int8
-- returns: id int8, handler text, queue text, status text, priority int2, attempt int4, run_at timestamptz,
-- returns: created_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: last_error text, reason text, version int8, workflow_id uuid, schedule_id int8
-- Sorts no index serves (a top-N sort of the matches): attempt, handler, status (with a queue filter,
-- runs_queue_status serves status); ties by id in the same direction. $19 the cursor's integer, $20 its
-- text, $21 its id.
SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
       r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
FROM runs r
WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
  AND ($3::text IS NULL OR r.handler = $3)
  AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
  AND ($7::text[] IS NULL OR r.queue = ANY($7))
  AND ($8::text IS NULL OR r.submitted_by = $8 OR r.submitted_by LIKE $8 || '@%'
       OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                  AND (e.actor = $8 OR e.actor LIKE $8 || '@%')))
  AND ($9::bigint IS NULL OR r.id < $9)
  AND ($10::bigint IS NULL OR r.id = $10)
  AND ($11::text IS NULL OR r.tenant = $11)
  AND ($12::text IS NULL OR r.concurrency_key = $12)
  AND ($13::text IS NULL OR r.idempotency_key = $13)
  AND ($14::text IS NULL OR (r.id > $17 AND position(convert_to($14, 'UTF8') IN r.payload) > 0))
  AND (NOT $18::boolean OR CASE
        WHEN $15 = 'attempt' AND $16 = 'asc' THEN (r.attempt, r.id) > ($19::bigint, $21::bigint)
        WHEN $15 = 'attempt' THEN (r.attempt, r.id) < ($19::bigint, $21::bigint)
        WHEN $16 = 'asc' THEN (CASE $15 WHEN 'handler' THEN r.handler ELSE r.status END, r.id) > ($20::text, $21::bigint)
        ELSE (CASE $15 WHEN 'handler' THEN r.handler ELSE r.status END, r.id) < ($20::text, $21::bigint) END)
ORDER BY
  CASE WHEN $16 = 'asc' THEN CASE $15 WHEN 'handler' THEN r.handler WHEN 'status' THEN r.status END END ASC,
  CASE WHEN $16 = 'desc' THEN CASE $15 WHEN 'handler' THEN r.handler WHEN 'status' THEN r.status END END DESC,
  CASE WHEN $16 = 'asc' AND $15 = 'attempt' THEN r.attempt END ASC,
  CASE WHEN $16 = 'desc' AND $15 = 'attempt' THEN r.attempt END DESC,
  CASE WHEN $16 = 'asc' THEN r.id END ASC,
  r.id DESC
LIMIT $6;

-- name: run_events_page
-- params: run_id int8, limit int8, after_at timestamptz, after_stream_id int8, after_id int8
-- returns: id int8, type text, from_status text, to_status text, version int8, attempt int4, token int8,
-- returns: worker_id text, actor text, reason text, error_class text, error_message text, trace_id text,
-- returns: at timestamptz, recorded_at timestamptz, stream_id int8
-- A run's timeline as run_events (queries.sql) orders it (at, then stream entries in order, then id), a
-- page at a time: $2 limit, $3-$5 the cursor's (at, COALESCE(stream_id, -1), id), only rows after it
-- (NULL: from the start). run_events with stream_id, which the cursor needs.
SELECT id, type, from_status, to_status, version, attempt, token, worker_id, actor, reason,
       error_class, error_message, trace_id, at, recorded_at, stream_id
FROM history
WHERE run_id = $1
  AND ($3::timestamptz IS NULL OR (at, COALESCE(stream_id, -1), id) > ($3, $4::bigint, $5::bigint))
ORDER BY at, COALESCE(stream_id, -1), id LIMIT $2;

-- name: schedule_page_scoped
-- params: limit int8, scope text[], after_name text
-- returns: id int8, name text, handler text, cron text, interval_s float8, timezone text,
-- returns: next_fire_time timestamptz, spread_s float8, offset_ms int4, catchup bool, allow_overlap bool,
-- returns: paused bool, last_fire_time timestamptz, fires int8, skipped int8, queue text
-- Schedules by name, filtered to the caller's queues ($2; NULL: all) before the limit ($1), after the
-- cursor's name ($3; NULL: from the first). schedule_list_scoped with a cursor.
SELECT s.id, s.name, s.handler, s.cron, s.interval_s, s.timezone, s.next_fire_time, s.spread_s, s.offset_ms,
       s.catchup, s.allow_overlap, s.paused, s.last_fire_time, s.fires, s.skipped, s.queue
FROM schedules s LEFT JOIN job_definitions d ON d.name = s.handler
WHERE ($2::text[] IS NULL OR COALESCE(s.queue, d.queue, 'default') = ANY($2))
  AND ($3::text IS NULL OR s.name > $3)
ORDER BY s.name LIMIT $1;

-- name: fleet_events_page
-- params: since timestamptz, type text, queue text, limit int8, scope text[], after_at timestamptz,
-- params: after_stream_id int8, after_id int8, after_run_id int8
-- returns: id int8, run_id int8, queue text, type text, from_status text, to_status text, attempt int4,
-- returns: worker_id text, actor text, reason text, error_class text, at timestamptz, handler text,
-- returns: workflow_id uuid, trace_id text, stream_id int8
-- The fleet's history (the view `history`: event rows, attempts' claims and finishes, submits recorded in
-- their run's row) with each row's queue, newest first: GET /v1/events and `fencepost events`. $1 since,
-- $2 type, $3 queue, $4 limit, $5 queues in scope (NULL: all), $6-$9 the cursor: only rows after
-- (at, COALESCE(stream_id, -1), id, COALESCE(run_id, 0)) in this order (NULL: from the newest). The run id
-- is the last part because an attempt's claim or finish has minus its stream id for id and two queues'
-- streams hand out the same ids: two such rows at one time were one key, and a page ending on one skipped
-- the other (issue 24). Each half is filtered, cut at the cursor and limited on its own, then merged.
-- The attempts' claims and finishes are read queue by queue (every queue's, or the filter's), the submits and
-- the event rows on their time-ordered indexes for every queue and queue by queue for a queue or a scoped
-- token's (047: attempts and event rows carry their queue), one range from the cursor down per queue, so a
-- page reads at most queues x limit rows of each half whatever the other queues hold. (Before 047 a row's queue was its run's: the halves walked the window's rows of every queue, 0.3-1.1 s
-- at 1,000,000 runs with 20,000 operator commands in the hour; a queue with no rows read the whole window.)
-- The attempts and submits halves are read first; when they fill a page, the event rows older than its
-- oldest cannot be on it, so the events half stops there.
WITH other AS MATERIALIZED (SELECT * FROM (
    -- the attempts' claims and finishes queue by queue (attempts_queue_claim_page / _finish_page, 047): the
    -- queue, a scoped token's queues, or every queue, each one range from (queue, the cursor's time) down to
    -- (queue, since), each limited, merged and limited, and only then joined to their runs. The range is two row
    -- comparisons, not queue = q: with an equality the queue is a constant to the planner, which then preferred
    -- a time-ordered index filtered on the queue (as 046 found for the audit log). 047 replaced 037's
    -- time-ordered indexes with these (one index entry per claim and per finish, not two): every queue's page
    -- reads at most queues x limit index entries.
    (SELECT -a.claim_stream_id AS id, a.run_id, a.queue, 'claimed' AS type, 'PENDING' AS from_status,
            'RUNNING' AS to_status, a.attempt, a.worker_id, NULL::text AS actor, NULL::text AS reason,
            NULL::text AS error_class, a.started_at AS at, r.handler, r.workflow_id, r.trace_id,
            a.claim_stream_id AS stream_id
     FROM (SELECT s.* FROM unnest(CASE WHEN $3::text IS NOT NULL THEN ARRAY[$3::text] WHEN $5::text[] IS NOT NULL
                                       THEN $5::text[] ELSE ARRAY(SELECT name FROM queues) END) q(queue)
           CROSS JOIN LATERAL (
              SELECT a.run_id, a.queue, a.attempt, a.worker_id, a.started_at, a.claim_stream_id
              FROM attempts a
              WHERE ($5::text[] IS NULL OR q.queue = ANY($5))
                AND (a.queue, a.started_at) >= (q.queue, $1::timestamptz)
                AND (a.queue, a.started_at) <= (q.queue, COALESCE($6::timestamptz, 'infinity'))
                AND a.claim_version IS NOT NULL AND ($2::text IS NULL OR $2 = 'claimed')
                AND ($6::timestamptz IS NULL OR (a.started_at, a.claim_stream_id, -a.claim_stream_id, a.run_id)
                                                < ($6, $7::bigint, $8::bigint, $9::bigint))
              ORDER BY a.queue DESC, a.started_at DESC, a.claim_stream_id DESC, a.run_id DESC LIMIT $4) s
           ORDER BY s.started_at DESC, s.claim_stream_id DESC, s.run_id DESC LIMIT $4) a
     LEFT JOIN runs r ON r.id = a.run_id)
    UNION ALL
    (SELECT -a.finish_stream_id, a.run_id, a.queue, a.finish_type, a.finish_from, a.finish_to, a.attempt, a.worker_id,
            NULL::text, a.reason, a.error_class, a.finished_at, r.handler, r.workflow_id, r.trace_id, a.finish_stream_id
     FROM (SELECT s.* FROM unnest(CASE WHEN $3::text IS NOT NULL THEN ARRAY[$3::text] WHEN $5::text[] IS NOT NULL
                                       THEN $5::text[] ELSE ARRAY(SELECT name FROM queues) END) q(queue)
           CROSS JOIN LATERAL (
              SELECT a.run_id, a.queue, a.finish_type, a.finish_from, a.finish_to, a.attempt, a.worker_id, a.reason,
                     a.error_class, a.finished_at, a.finish_stream_id
              FROM attempts a
              WHERE ($5::text[] IS NULL OR q.queue = ANY($5))
                AND (a.queue, a.finished_at) >= (q.queue, $1::timestamptz)
                AND (a.queue, a.finished_at) <= (q.queue, COALESCE($6::timestamptz, 'infinity'))
                AND a.finish_type IS NOT NULL AND ($2::text IS NULL OR a.finish_type = $2)
                AND ($6::timestamptz IS NULL OR (a.finished_at, a.finish_stream_id, -a.finish_stream_id, a.run_id)
                                                < ($6, $7::bigint, $8::bigint, $9::bigint))
              ORDER BY a.queue DESC, a.finished_at DESC, a.finish_stream_id DESC, a.run_id DESC LIMIT $4) s
           ORDER BY s.finished_at DESC, s.finish_stream_id DESC, s.run_id DESC LIMIT $4) a
     LEFT JOIN runs r ON r.id = a.run_id)
    UNION ALL
    -- and the attempts that carry no queue (an older recorder during an upgrade), through their run
    -- (attempts_queue_unknown_claim / _finish: about empty)
    (SELECT -a.claim_stream_id, a.run_id, r.queue, 'claimed', 'PENDING', 'RUNNING', a.attempt, a.worker_id,
            NULL::text, NULL::text, NULL::text, a.started_at, r.handler, r.workflow_id, r.trace_id, a.claim_stream_id
     FROM attempts a LEFT JOIN runs r ON r.id = a.run_id
     WHERE a.queue IS NULL AND ($3::text IS NULL OR r.queue = $3) AND ($5::text[] IS NULL OR r.queue = ANY($5))
       AND a.claim_version IS NOT NULL AND a.started_at >= $1 AND ($2::text IS NULL OR $2 = 'claimed')
       AND ($6::timestamptz IS NULL OR (a.started_at <= $6 AND (a.started_at, a.claim_stream_id, -a.claim_stream_id, a.run_id)
                                                             < ($6, $7::bigint, $8::bigint, $9::bigint)))
     ORDER BY a.started_at DESC, a.claim_stream_id DESC, a.run_id DESC LIMIT $4)
    UNION ALL
    (SELECT -a.finish_stream_id, a.run_id, r.queue, a.finish_type, a.finish_from, a.finish_to, a.attempt, a.worker_id,
            NULL::text, a.reason, a.error_class, a.finished_at, r.handler, r.workflow_id, r.trace_id, a.finish_stream_id
     FROM attempts a LEFT JOIN runs r ON r.id = a.run_id
     WHERE a.queue IS NULL AND ($3::text IS NULL OR r.queue = $3) AND ($5::text[] IS NULL OR r.queue = ANY($5))
       AND a.finish_type IS NOT NULL AND a.finished_at >= $1 AND ($2::text IS NULL OR a.finish_type = $2)
       AND ($6::timestamptz IS NULL OR (a.finished_at <= $6 AND (a.finished_at, a.finish_stream_id, -a.finish_stream_id, a.run_id)
                                                              < ($6, $7::bigint, $8::bigint, $9::bigint)))
     ORDER BY a.finished_at DESC, a.finish_stream_id DESC, a.run_id DESC LIMIT $4)
    UNION ALL
    (SELECT -r.id, r.id, r.queue, 'submitted', NULL::text, 'PENDING', NULL::integer, NULL::text, r.submitted_by,
            NULL::text, NULL::text, r.created_at, r.handler, r.workflow_id, r.trace_id, NULL::bigint
     FROM runs r
     WHERE $3::text IS NULL AND $5::text[] IS NULL  -- every queue: runs_created_page
       AND r.submitted_by IS NOT NULL AND r.created_at >= $1 AND ($2::text IS NULL OR $2 = 'submitted')
       AND ($6::timestamptz IS NULL OR (r.created_at <= $6 AND (r.created_at, -1::bigint, -r.id, r.id)
                                                            < ($6, $7::bigint, $8::bigint, $9::bigint)))
     ORDER BY r.created_at DESC, r.id ASC LIMIT $4)
    UNION ALL
    -- a queue, or a scoped token's queues: runs_queue_created_page queue by queue (queue = ANY(scope) in
    -- one scan cannot come in time order: it walked runs_created_page through every queue's runs)
    (SELECT s.* FROM unnest(CASE WHEN $3::text IS NOT NULL THEN ARRAY[$3::text] ELSE $5::text[] END) q(queue)
     CROSS JOIN LATERAL (
        SELECT -r.id, r.id, r.queue, 'submitted', NULL::text, 'PENDING', NULL::integer, NULL::text, r.submitted_by,
               NULL::text, NULL::text, r.created_at, r.handler, r.workflow_id, r.trace_id, NULL::bigint
        FROM runs r
        WHERE r.queue = q.queue AND ($5::text[] IS NULL OR r.queue = ANY($5))
          AND r.submitted_by IS NOT NULL AND r.created_at >= $1 AND ($2::text IS NULL OR $2 = 'submitted')
          AND ($6::timestamptz IS NULL OR (r.created_at <= $6 AND (r.created_at, -1::bigint, -r.id, r.id)
                                                               < ($6, $7::bigint, $8::bigint, $9::bigint)))
        ORDER BY r.created_at DESC, r.id ASC LIMIT $4) s)
    UNION ALL
    (SELECT -r.id, r.id, r.queue, 'submitted', NULL::text, 'PENDING', NULL::integer, NULL::text, r.submitted_by,
            NULL::text, NULL::text, r.created_at, r.handler, r.workflow_id, r.trace_id, NULL::bigint
     FROM runs_archive r
     WHERE r.submitted_by IS NOT NULL AND r.created_at >= $1 AND ($2::text IS NULL OR $2 = 'submitted')
       AND ($3::text IS NULL OR r.queue = $3) AND ($5::text[] IS NULL OR r.queue = ANY($5))
       AND ($6::timestamptz IS NULL OR (r.created_at <= $6 AND (r.created_at, -1::bigint, -r.id, r.id)
                                                            < ($6, $7::bigint, $8::bigint, $9::bigint)))
     ORDER BY r.created_at DESC, r.id ASC LIMIT $4)
) o ORDER BY at DESC, COALESCE(stream_id, -1) DESC, id DESC, run_id DESC LIMIT $4
), floor AS (
    SELECT CASE WHEN count(*) >= $4 THEN min(at) END AS at FROM other
)
SELECT * FROM (
    SELECT * FROM other
    UNION ALL
    -- the floor as a lateral reference, not a subquery: a parallel plan for these few rows (its workers
    -- started for each page) cost 20-40 ms of a 50 ms page on a loaded machine
    (SELECT ev.* FROM floor f CROSS JOIN LATERAL (
     SELECT e.id, e.run_id, COALESCE(e.queue, r.queue), e.type, e.from_status, e.to_status, e.attempt, e.worker_id,
            e.actor, e.reason, e.error_class, e.at, r.handler, r.workflow_id, r.trace_id, e.stream_id
     FROM events e LEFT JOIN runs r ON r.id = e.run_id
     WHERE $3::text IS NULL AND $5::text[] IS NULL  -- every queue: events_at
       AND e.at >= $1 AND e.at >= COALESCE(f.at, $1) AND ($2::text IS NULL OR e.type = $2)
       AND ($6::timestamptz IS NULL OR (e.at <= $6 AND (e.at, COALESCE(e.stream_id, -1), e.id, COALESCE(e.run_id, 0))
                                                     < ($6, $7::bigint, $8::bigint, $9::bigint)))
     ORDER BY e.at DESC, COALESCE(e.stream_id, -1) DESC, e.id DESC LIMIT $4) ev)
    UNION ALL
    -- a queue, or a scoped token's queues: events_queue_at (047) queue by queue, one range from (queue, the
    -- cursor's time) down to (queue, the floor or since), as the attempts' ranges above
    (SELECT ev.* FROM floor f
     CROSS JOIN unnest(CASE WHEN $3::text IS NOT NULL THEN ARRAY[$3::text] ELSE $5::text[] END) q(queue)
     CROSS JOIN LATERAL (
        SELECT e.id, e.run_id, e.queue, e.type, e.from_status, e.to_status, e.attempt, e.worker_id,
               e.actor, e.reason, e.error_class, e.at, r.handler, r.workflow_id, r.trace_id, e.stream_id
        FROM events e LEFT JOIN runs r ON r.id = e.run_id
        WHERE ($5::text[] IS NULL OR q.queue = ANY($5))
          AND (e.queue, e.at) >= (q.queue, GREATEST($1::timestamptz, f.at))
          AND (e.queue, e.at) <= (q.queue, COALESCE($6::timestamptz, 'infinity'))
          AND ($2::text IS NULL OR e.type = $2)
          AND ($6::timestamptz IS NULL OR (e.at, COALESCE(e.stream_id, -1), e.id, COALESCE(e.run_id, 0))
                                          < ($6, $7::bigint, $8::bigint, $9::bigint))
        ORDER BY e.queue DESC, e.at DESC, COALESCE(e.stream_id, -1) DESC, e.id DESC LIMIT $4) ev)
    UNION ALL
    -- and the event rows that carry no queue, through their run (events_queue_unknown: about empty)
    (SELECT ev.* FROM floor f CROSS JOIN LATERAL (
        SELECT e.id, e.run_id, r.queue, e.type, e.from_status, e.to_status, e.attempt, e.worker_id,
               e.actor, e.reason, e.error_class, e.at, r.handler, r.workflow_id, r.trace_id, e.stream_id
        FROM events e JOIN runs r ON r.id = e.run_id
        WHERE ($3::text IS NOT NULL OR $5::text[] IS NOT NULL) AND e.queue IS NULL AND e.run_id IS NOT NULL
          AND ($3::text IS NULL OR r.queue = $3) AND ($5::text[] IS NULL OR r.queue = ANY($5))
          AND e.at >= $1 AND e.at >= COALESCE(f.at, $1) AND ($2::text IS NULL OR e.type = $2)
          AND ($6::timestamptz IS NULL OR (e.at <= $6 AND (e.at, COALESCE(e.stream_id, -1), e.id, COALESCE(e.run_id, 0))
                                                        < ($6, $7::bigint, $8::bigint, $9::bigint)))
        ORDER BY e.at DESC, COALESCE(e.stream_id, -1) DESC, e.id DESC LIMIT $4) ev)
) h
ORDER BY at DESC, COALESCE(stream_id, -1) DESC, id DESC, COALESCE(run_id, 0) DESC LIMIT $4;
