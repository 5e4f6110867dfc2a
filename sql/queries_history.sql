-- Named queries: History: attempts and events, written by the recorder and read as one timeline.
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: run_events
-- params: run_id int8
-- returns: id int8, type text, from_status text, to_status text, version int8, attempt int4, token int8,
-- returns: worker_id text, actor text, reason text, error_class text, error_message text, trace_id text,
-- returns: at timestamptz, recorded_at timestamptz
-- A run's timeline: its event rows and its attempts' claim and finish columns, as one list of
-- event-shaped rows (the view `history`, 020_attempt_history.sql). Within one millisecond, the
-- order of the stream entries (a claim and the finish of a no-op job share their ts).
SELECT id, type, from_status, to_status, version, attempt, token, worker_id, actor, reason,
       error_class, error_message, trace_id, at, recorded_at
FROM history WHERE run_id = $1 ORDER BY at, stream_id NULLS FIRST, id;

-- name: run_attempts
-- params: run_id int8
-- returns: attempt int4, token int8, worker_id text, started_at timestamptz, finished_at timestamptz,
-- returns: outcome text, error_class text, error_message text
SELECT attempt, token, worker_id, started_at, finished_at, outcome, error_class, error_message
FROM attempts WHERE run_id = $1 ORDER BY attempt;

-- name: apply_attempts
-- params: run_id int8[], attempt int4[], token int8[], worker_id text[], started_at timestamptz[],
-- params: finished_at timestamptz[], outcome text[], error_class text[], error_message text[],
-- params: claim_version int8[], claim_stream_id int8[], finish_type text[], finish_from text[],
-- params: finish_to text[], finish_version int8[], finish_stream_id int8[], reason text[], queue text[]
-- returns: nothing
-- One row per attempt, one statement per batch, each attempt's row found by its whole key
-- (run_id, attempt, started_at): every closing transition the recorder writes this way carries its
-- attempt's start (finish_runs.lua's `started`, or the claim in the same batch), so the insert goes
-- to the one monthly partition of that start and its conflict check reads that partition's key only,
-- whatever the size of the history. A claim and its finish in one batch are one insert; a finish
-- after its claim's batch is one update of that row (ON CONFLICT), a claim after its finish's batch
-- (another recorder's) fills the claim columns. Rows go in (run_id, attempt) order so recorder
-- replicas take the key locks in one order (no deadlock). A row that brings nothing the attempt does
-- not have (a batch recorded already) changes nothing: the statement's count tells the recorder.
-- Closes whose start is not known, and the rows of a late batch, go to apply_attempts_by_run.
-- $1-$9 run, attempt, token, worker, started, finished, outcome, error class, error message;
-- $10-$16 claim version, claim stream id, finish type / from / to / version / stream id; $17 reason;
-- $18 the queue (the stream's the entry came from, 047: a queue's history reads its own rows).
INSERT INTO attempts AS a (run_id, attempt, token, worker_id, started_at, finished_at, outcome, error_class,
                           error_message, claim_version, claim_stream_id, finish_type, finish_from, finish_to,
                           finish_version, finish_stream_id, reason, queue)
SELECT * FROM unnest($1::bigint[], $2::integer[], $3::bigint[], $4::text[], $5::timestamptz[],
                     $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::bigint[], $11::bigint[],
                     $12::text[], $13::text[], $14::text[], $15::bigint[], $16::bigint[], $17::text[], $18::text[])
    AS u(run_id, attempt, token, worker_id, started_at, finished_at, outcome, error_class, error_message,
         claim_version, claim_stream_id, finish_type, finish_from, finish_to, finish_version, finish_stream_id,
         reason, queue)
ORDER BY 1, 2
ON CONFLICT (run_id, attempt, started_at) DO UPDATE SET
    finished_at = COALESCE(excluded.finished_at, a.finished_at),
    outcome = COALESCE(excluded.outcome, a.outcome),
    error_class = COALESCE(excluded.error_class, a.error_class),
    error_message = COALESCE(excluded.error_message, a.error_message),
    claim_version = COALESCE(a.claim_version, excluded.claim_version),
    claim_stream_id = COALESCE(a.claim_stream_id, excluded.claim_stream_id),
    finish_type = COALESCE(excluded.finish_type, a.finish_type),
    finish_from = COALESCE(excluded.finish_from, a.finish_from),
    finish_to = COALESCE(excluded.finish_to, a.finish_to),
    finish_version = COALESCE(excluded.finish_version, a.finish_version),
    finish_stream_id = COALESCE(excluded.finish_stream_id, a.finish_stream_id),
    reason = COALESCE(excluded.reason, a.reason),
    queue = COALESCE(a.queue, excluded.queue),
    recorded_at = now()
WHERE (a.claim_stream_id IS NULL AND excluded.claim_stream_id IS NOT NULL)
   OR (a.finished_at IS NULL AND excluded.finished_at IS NOT NULL);

-- name: apply_attempts_by_run
-- params: run_id int8[], attempt int4[], token int8[], worker_id text[], started_at timestamptz[],
-- params: finished_at timestamptz[], outcome text[], error_class text[], error_message text[],
-- params: claim_version int8[], claim_stream_id int8[], finish_type text[], finish_from text[],
-- params: finish_to text[], finish_version int8[], finish_stream_id int8[], reason text[], queue text[]
-- returns: nothing
-- apply_attempts for the rows whose attempt row cannot be found by its whole key: closes that do not
-- carry their attempt's start (a lease expiry, a release at shutdown, a run whose Redis hash was
-- rebuilt without it, an older version's entry; $5 NULL), and every row of a batch that came late
-- (apply_runs found a newer version of one of its runs: another recorder's batch, a replay), whose
-- claim may find its attempt inserted by a close recorded before it. Found by (run_id, attempt), so
-- this reads the key of every partition; the recorder sends it only such rows. A close that finds no
-- row inserts the attempt started at the close; its claim, late by then, moves the start back.
-- Parameters as apply_attempts.
WITH input AS (
    SELECT * FROM unnest($1::bigint[], $2::integer[], $3::bigint[], $4::text[], $5::timestamptz[],
                         $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::bigint[], $11::bigint[],
                         $12::text[], $13::text[], $14::text[], $15::bigint[], $16::bigint[], $17::text[],
                         $18::text[])
        AS u(run_id, attempt, token, worker_id, started_at, finished_at, outcome, error_class, error_message,
             claim_version, claim_stream_id, finish_type, finish_from, finish_to, finish_version, finish_stream_id,
             reason, queue)
    ORDER BY 1, 2
), found AS (
    SELECT a.run_id, a.attempt FROM attempts a JOIN input i ON a.run_id = i.run_id AND a.attempt = i.attempt
), upd AS (
    UPDATE attempts a SET
        started_at = LEAST(a.started_at, i.started_at),
        finished_at = COALESCE(i.finished_at, a.finished_at),
        outcome = COALESCE(i.outcome, a.outcome),
        error_class = COALESCE(i.error_class, a.error_class),
        error_message = COALESCE(i.error_message, a.error_message),
        claim_version = COALESCE(a.claim_version, i.claim_version),
        claim_stream_id = COALESCE(a.claim_stream_id, i.claim_stream_id),
        finish_type = COALESCE(i.finish_type, a.finish_type),
        finish_from = COALESCE(i.finish_from, a.finish_from),
        finish_to = COALESCE(i.finish_to, a.finish_to),
        finish_version = COALESCE(i.finish_version, a.finish_version),
        finish_stream_id = COALESCE(i.finish_stream_id, a.finish_stream_id),
        reason = COALESCE(i.reason, a.reason),
        queue = COALESCE(a.queue, i.queue),
        recorded_at = now()
    FROM input i WHERE a.run_id = i.run_id AND a.attempt = i.attempt
      AND ((a.claim_stream_id IS NULL AND i.claim_stream_id IS NOT NULL)   -- what the row does not have yet
           OR (a.finished_at IS NULL AND i.finished_at IS NOT NULL) OR i.started_at < a.started_at)
)
INSERT INTO attempts AS a (run_id, attempt, token, worker_id, started_at, finished_at, outcome, error_class,
                           error_message, claim_version, claim_stream_id, finish_type, finish_from, finish_to,
                           finish_version, finish_stream_id, reason, queue)
SELECT run_id, attempt, token, worker_id, COALESCE(started_at, finished_at), finished_at, outcome, error_class,
       error_message, claim_version, claim_stream_id, finish_type, finish_from, finish_to, finish_version,
       finish_stream_id, reason, queue
FROM input i WHERE NOT EXISTS (SELECT 1 FROM found f WHERE f.run_id = i.run_id AND f.attempt = i.attempt)
ON CONFLICT (run_id, attempt, started_at) DO NOTHING;

-- name: recorded_attempt_entries
-- params: run_id int8[]
-- returns: run_id int8, attempt int4, claim_stream_id int8, finish_stream_id int8
-- For a replayed batch (entries that may be committed already): the stream ids of the claims and
-- finishes the attempts of runs $1 hold, so the recorder counts only the entries it writes now.
SELECT run_id, attempt, claim_stream_id, finish_stream_id FROM attempts WHERE run_id = ANY($1::bigint[]);

-- name: insert_events_json
-- params: p1 jsonb
-- returns: stream text, stream_id int8
-- The recorder's events, as one jsonb array of arrays (decoded once by PostgreSQL instead
-- of 15 typed arrays encoded element by element in Python). Positions: run, type, from,
-- to, version, attempt, token, worker, reason, error class, error, ts (ms), stream,
-- stream id, actor, queue (the stream's, 047). `at` is derived from the entry's ts only, so a redelivered entry hits
-- the (stream, stream_id, at) key (events are partitioned by `at`) and is skipped.
INSERT INTO events (run_id, type, from_status, to_status, version, attempt, token, worker_id,
                    reason, error_class, error_message, at, stream, stream_id, actor, queue)
SELECT (e->>0)::bigint, e->>1, e->>2, e->>3, (e->>4)::bigint, (e->>5)::integer, (e->>6)::bigint, e->>7,
       e->>8, e->>9, e->>10, to_timestamp((e->>11)::bigint / 1000.0), e->>12, (e->>13)::bigint, e->>14, e->>15
FROM jsonb_array_elements($1::jsonb) AS e
ON CONFLICT (stream, stream_id, at) WHERE stream_id IS NOT NULL DO NOTHING
RETURNING stream, stream_id;

-- name: run_events_page
-- params: run_id int8, limit int8, after_at timestamptz, after_stream_id int8, after_id int8
-- returns: id int8, type text, from_status text, to_status text, version int8, attempt int4, token int8,
-- returns: worker_id text, actor text, reason text, error_class text, error_message text, trace_id text,
-- returns: at timestamptz, recorded_at timestamptz, stream_id int8
-- A run's timeline as run_events (above) orders it (at, then stream entries in order, then id), a
-- page at a time: $2 limit, $3-$5 the cursor's (at, COALESCE(stream_id, -1), id), only rows after it
-- (NULL: from the start). run_events with stream_id, which the cursor needs.
SELECT id, type, from_status, to_status, version, attempt, token, worker_id, actor, reason,
       error_class, error_message, trace_id, at, recorded_at, stream_id
FROM history
WHERE run_id = $1
  AND ($3::timestamptz IS NULL OR (at, COALESCE(stream_id, -1), id) > ($3, $4::bigint, $5::bigint))
ORDER BY at, COALESCE(stream_id, -1), id LIMIT $2;

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
-- token's (047: attempts and event rows carry their queue), one range from the cursor down per queue. Each
-- half read queue by queue stops at a threshold: one probe per queue finds its newest row after the cursor,
-- and the limit-th newest of those is a time the half's page cannot go below (that many rows are at or after
-- it), so only the queues whose newest row is there are read, down to it: a page reads one index entry per
-- queue and about a page of rows whatever the number of queues (issue 24). Read up to a page per queue, the
-- unfiltered page read queues x limit rows of each half: at 500 queues of 400 claims and finishes each
-- (fp_mq), 61,260 buffers and 88-194 ms median, now 10,752 and 38-41 ms (the probes are most of it).
-- (Before 047 a row's queue was its run's: the halves walked the window's rows of every queue, 0.3-1.1 s
-- at 1,000,000 runs with 20,000 operator commands in the hour; a queue with no rows read the whole window.)
-- The attempts and submits halves are read first; when they fill a page, the event rows older than its
-- oldest cannot be on it, so the events half stops there.
WITH claim_tops AS MATERIALIZED (
    -- each queue's newest claim on the page's side of the cursor (the queue, a scoped token's queues, or every
    -- queue): one probe of attempts_queue_claim_page per queue
    SELECT q.queue, t.at FROM unnest(CASE WHEN $3::text IS NOT NULL THEN ARRAY[$3::text] WHEN $5::text[] IS NOT NULL
                            THEN $5::text[] ELSE ARRAY(SELECT name FROM queues) END) q(queue)
    CROSS JOIN LATERAL (
        SELECT a.started_at AS at FROM attempts a
        WHERE ($5::text[] IS NULL OR q.queue = ANY($5))
          AND (a.queue, a.started_at) >= (q.queue, $1::timestamptz)
          AND (a.queue, a.started_at) <= (q.queue, COALESCE($6::timestamptz, 'infinity'))
          AND a.claim_version IS NOT NULL AND ($2::text IS NULL OR $2 = 'claimed')
          AND ($6::timestamptz IS NULL OR (a.started_at, a.claim_stream_id, -a.claim_stream_id, a.run_id)
                                          < ($6, $7::bigint, $8::bigint, $9::bigint))
        ORDER BY a.queue DESC, a.started_at DESC LIMIT 1) t
), finish_tops AS MATERIALIZED (
    -- and its newest finish (attempts_queue_finish_page)
    SELECT q.queue, t.at FROM unnest(CASE WHEN $3::text IS NOT NULL THEN ARRAY[$3::text] WHEN $5::text[] IS NOT NULL
                            THEN $5::text[] ELSE ARRAY(SELECT name FROM queues) END) q(queue)
    CROSS JOIN LATERAL (
        SELECT a.finished_at AS at FROM attempts a
        WHERE ($5::text[] IS NULL OR q.queue = ANY($5))
          AND (a.queue, a.finished_at) >= (q.queue, $1::timestamptz)
          AND (a.queue, a.finished_at) <= (q.queue, COALESCE($6::timestamptz, 'infinity'))
          AND a.finish_type IS NOT NULL AND ($2::text IS NULL OR a.finish_type = $2)
          AND ($6::timestamptz IS NULL OR (a.finished_at, a.finish_stream_id, -a.finish_stream_id, a.run_id)
                                          < ($6, $7::bigint, $8::bigint, $9::bigint))
        ORDER BY a.queue DESC, a.finished_at DESC LIMIT 1) t
), submit_tops AS MATERIALIZED (
    -- a queue's or a scoped token's queues' newest submit (runs_queue_created_page) and event row
    -- (events_queue_at) after the cursor, as above (nothing for every queue: those halves read in time order)
    SELECT q.queue, t.at FROM unnest(CASE WHEN $3::text IS NOT NULL THEN ARRAY[$3::text] ELSE $5::text[] END) q(queue)
    CROSS JOIN LATERAL (
        SELECT r.created_at AS at FROM runs r
        WHERE r.queue = q.queue AND ($5::text[] IS NULL OR q.queue = ANY($5))
          AND r.submitted_by IS NOT NULL AND r.created_at >= $1 AND ($2::text IS NULL OR $2 = 'submitted')
          AND ($6::timestamptz IS NULL OR (r.created_at <= $6 AND (r.created_at, -1::bigint, -r.id, r.id)
                                                               < ($6, $7::bigint, $8::bigint, $9::bigint)))
        ORDER BY r.created_at DESC LIMIT 1) t
), event_tops AS MATERIALIZED (
    SELECT q.queue, t.at FROM unnest(CASE WHEN $3::text IS NOT NULL THEN ARRAY[$3::text] ELSE $5::text[] END) q(queue)
    CROSS JOIN LATERAL (
        SELECT e.at FROM events e
        WHERE ($5::text[] IS NULL OR q.queue = ANY($5))
          AND (e.queue, e.at) >= (q.queue, $1::timestamptz)
          AND (e.queue, e.at) <= (q.queue, COALESCE($6::timestamptz, 'infinity'))
          AND ($2::text IS NULL OR e.type = $2)
          AND ($6::timestamptz IS NULL OR (e.at, COALESCE(e.stream_id, -1), e.id, COALESCE(e.run_id, 0))
                                          < ($6, $7::bigint, $8::bigint, $9::bigint))
        ORDER BY e.queue DESC, e.at DESC LIMIT 1) t
), other AS MATERIALIZED (SELECT * FROM (
    -- the attempts' claims and finishes queue by queue (attempts_queue_claim_page / _finish_page, 047), above
    -- a threshold: the limit-th newest of the queues' newest rows (since when fewer queues have one). Those
    -- newest rows are a limit of the half's rows at or after it, so the half's page lies at or after it too,
    -- and only the queues whose newest row is there are read: each one range from (queue, the cursor's time)
    -- down to (queue, the threshold), each limited, merged and limited, and only then joined to their runs.
    -- A range is two row comparisons, not queue = q: with an equality the queue is a constant to the planner,
    -- which then preferred a time-ordered index filtered on the queue (as 046 found for the audit log). 047
    -- replaced 037's time-ordered indexes with these (one index entry per claim and per finish, not two).
    (SELECT -a.claim_stream_id AS id, a.run_id, a.queue, 'claimed' AS type, 'PENDING' AS from_status,
            'RUNNING' AS to_status, a.attempt, a.worker_id, NULL::text AS actor, NULL::text AS reason,
            NULL::text AS error_class, a.started_at AS at, r.handler, r.workflow_id, r.trace_id,
            a.claim_stream_id AS stream_id
     FROM (SELECT s.* FROM (SELECT GREATEST($1::timestamptz, (SELECT at FROM claim_tops ORDER BY at DESC
                                                              OFFSET GREATEST($4::bigint - 1, 0) LIMIT 1)) AS at) f
           JOIN claim_tops t ON t.at >= f.at
           CROSS JOIN LATERAL (
              SELECT a.run_id, a.queue, a.attempt, a.worker_id, a.started_at, a.claim_stream_id
              FROM attempts a
              WHERE (a.queue, a.started_at) >= (t.queue, f.at)
                AND (a.queue, a.started_at) <= (t.queue, COALESCE($6::timestamptz, 'infinity'))
                AND a.claim_version IS NOT NULL
                AND ($6::timestamptz IS NULL OR (a.started_at, a.claim_stream_id, -a.claim_stream_id, a.run_id)
                                                < ($6, $7::bigint, $8::bigint, $9::bigint))
              ORDER BY a.queue DESC, a.started_at DESC, a.claim_stream_id DESC, a.run_id DESC LIMIT $4) s
           ORDER BY s.started_at DESC, s.claim_stream_id DESC, s.run_id DESC LIMIT $4) a
     LEFT JOIN runs r ON r.id = a.run_id)
    UNION ALL
    (SELECT -a.finish_stream_id, a.run_id, a.queue, a.finish_type, a.finish_from, a.finish_to, a.attempt, a.worker_id,
            NULL::text, a.reason, a.error_class, a.finished_at, r.handler, r.workflow_id, r.trace_id, a.finish_stream_id
     FROM (SELECT s.* FROM (SELECT GREATEST($1::timestamptz, (SELECT at FROM finish_tops ORDER BY at DESC
                                                              OFFSET GREATEST($4::bigint - 1, 0) LIMIT 1)) AS at) f
           JOIN finish_tops t ON t.at >= f.at
           CROSS JOIN LATERAL (
              SELECT a.run_id, a.queue, a.finish_type, a.finish_from, a.finish_to, a.attempt, a.worker_id, a.reason,
                     a.error_class, a.finished_at, a.finish_stream_id
              FROM attempts a
              WHERE (a.queue, a.finished_at) >= (t.queue, f.at)
                AND (a.queue, a.finished_at) <= (t.queue, COALESCE($6::timestamptz, 'infinity'))
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
    (SELECT s.* FROM (SELECT GREATEST($1::timestamptz, (SELECT at FROM submit_tops ORDER BY at DESC
                                                        OFFSET GREATEST($4::bigint - 1, 0) LIMIT 1)) AS at) f
     JOIN submit_tops t ON t.at >= f.at
     CROSS JOIN LATERAL (
        SELECT -r.id, r.id, r.queue, 'submitted', NULL::text, 'PENDING', NULL::integer, NULL::text, r.submitted_by,
               NULL::text, NULL::text, r.created_at, r.handler, r.workflow_id, r.trace_id, NULL::bigint
        FROM runs r
        WHERE r.queue = t.queue
          AND r.submitted_by IS NOT NULL AND r.created_at >= f.at AND ($2::text IS NULL OR $2 = 'submitted')
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
    (SELECT ev.* FROM (SELECT GREATEST($1::timestamptz, fl.at, (SELECT at FROM event_tops ORDER BY at DESC
                                                                 OFFSET GREATEST($4::bigint - 1, 0) LIMIT 1)) AS at
                       FROM floor fl) f
     JOIN event_tops t ON t.at >= f.at
     CROSS JOIN LATERAL (
        SELECT e.id, e.run_id, e.queue, e.type, e.from_status, e.to_status, e.attempt, e.worker_id,
               e.actor, e.reason, e.error_class, e.at, r.handler, r.workflow_id, r.trace_id, e.stream_id
        FROM events e LEFT JOIN runs r ON r.id = e.run_id
        WHERE (e.queue, e.at) >= (t.queue, f.at)
          AND (e.queue, e.at) <= (t.queue, COALESCE($6::timestamptz, 'infinity'))
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

-- name: drift_events
-- params: id int8[], f text[], t text[], v int8[], k text[], d jsonb[]
-- returns: nothing
-- One 'drift_repaired' event per repaired drift (reason = the kind of drift), with its run's queue (047).
INSERT INTO events (run_id, queue, type, from_status, to_status, version, actor, reason, data, at)
SELECT id, (SELECT r.queue FROM runs r WHERE r.id = x.id), 'drift_repaired', f, t, v, 'reconciler', k, d, now()
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::jsonb[]) AS x(id, f, t, v, k, d);

-- name: stuck_detected_events
-- params: id int8[], queue text[], status text[], reason text[]
-- returns: nothing
-- One 'stuck_detected' event per run that crossed its SLA (one statement per pass).
INSERT INTO events (run_id, queue, type, to_status, actor, reason, at)
SELECT id, queue, 'stuck_detected', status, 'reconciler', reason, now()
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) AS s(id, queue, status, reason);

-- name: lock_transitions
-- params: run_id int8[]
-- returns: locked int8
-- Recorder replicas serialise on the runs whose event rows they are about to check and write
-- (recorded_transitions, then insert_events_json): a transaction-scoped advisory lock per run, the
-- first statement of the batch's transaction, taken in run order so two replicas cannot deadlock.
-- Without it two replicas could each be handed one copy of a repeated transition and both find
-- nothing recorded. Key: (the recorder's class 1179796292 'FENR', the run id's low 31 bits).
SELECT count(pg_advisory_xact_lock(1179796292, (r & 2147483647)::integer)) AS locked
FROM (SELECT DISTINCT r FROM unnest($1::bigint[]) AS r ORDER BY r) AS runs;

-- name: recorded_transitions
-- params: run_id int8[], type text[], version int8[]
-- returns: run_id int8, type text, version int8
-- Of the recorder's event rows $1-$3 (run, type, version), those PostgreSQL holds already, from
-- any stream entry or written directly: a Redis that lost a write (a lagging replica promoted)
-- repeats the transition at the same version under a new stream id, which the (stream, stream_id,
-- at) key does not catch. Only the partitions from the oldest run's creation on are read (pruned at
-- execution from the initplan's value; a day's margin for the Redis server's clock, which stamps
-- `at`), so the cost follows the runs in the batch, not the history's length. Runs no longer in
-- `runs` (archived) bound nothing: the last day only.
SELECT e.run_id, e.type, e.version
FROM events e
JOIN unnest($1::bigint[], $2::text[], $3::bigint[]) AS u(run_id, type, version)
  ON e.run_id = u.run_id AND e.type = u.type AND e.version = u.version
WHERE e.at >= (SELECT COALESCE(min(created_at), now()) - interval '1 day'
               FROM runs WHERE id = ANY($1::bigint[]));

-- name: flag_compensation
-- params: run_id int8[]
-- returns: nothing
-- Cancelled runs with irreversible side effects, flagged in the recorder's transaction; their
-- compensation runs are submitted through the one submit path (fencepost/core/submit.py).
UPDATE runs SET needs_compensation = true WHERE id = ANY($1::bigint[]);

-- name: events_recorded_since
-- params: p1 timestamptz, p2 float8, limit int8
-- returns: id int8, run_id int8, queue text, type text, from_status text, to_status text, version int8,
-- returns: attempt int4, worker_id text, actor text, reason text, error_class text, at timestamptz,
-- returns: recorded_at timestamptz, handler text, trace_id text
-- The newest $3 events recorded after $1 (NULL: now) minus $2 seconds of look-back (a recorder's
-- transaction that began before the last look but committed after it), newest first, with the run's
-- queue and handler as api_events_scoped gives them. From `history` (020): the event rows and the
-- attempts' claims and finishes; BRIN events_recorded_at (016) and attempts_recorded_at (020). An
-- attempt row written again (its finish in a later batch) shows its claim again with the new time:
-- a subscriber's look-back window drops the repeat when it is within it.
SELECT e.id, e.run_id, COALESCE(r.queue, e.queue) AS queue, e.type, e.from_status, e.to_status, e.version,
       e.attempt, e.worker_id, e.actor, e.reason, e.error_class, e.at, e.recorded_at, r.handler, r.trace_id
FROM history e LEFT JOIN runs r ON r.id = e.run_id
WHERE e.recorded_at > COALESCE($1::timestamptz, now()) - make_interval(secs => $2::double precision)
ORDER BY e.recorded_at DESC, e.id DESC LIMIT $3;
