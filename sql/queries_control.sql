-- Named queries for operator commands and checkpoints.

-- name: write_checkpoint
-- params: run_id int8, token int8, attempt int4, p4 int4, p5 int4, p6 bytea, p7 int8
-- returns: version int4
-- $1 run, $2 token, $3 attempt, $4 gen, $5 schema version, $6 state, $7 processed.
-- Returns the new checkpoint version, or no row when the writer is fenced off.
WITH w AS (
    INSERT INTO checkpoints AS c (run_id, gen, token, attempt, version, schema_version, state, processed)
    VALUES ($1, $4, $2, $3, 1, $5, $6, $7)
    ON CONFLICT (run_id) DO UPDATE SET
        gen = excluded.gen, token = excluded.token, attempt = excluded.attempt,
        version = CASE WHEN c.gen = excluded.gen THEN c.version + 1 ELSE 1 END,
        schema_version = excluded.schema_version, state = excluded.state,
        processed = excluded.processed, updated_at = now()
    WHERE excluded.token >= c.token AND excluded.token >= c.fence_token AND excluded.gen >= c.gen
    RETURNING version
), e AS (
    INSERT INTO events (run_id, type, attempt, token, actor, data, at)
    SELECT $1, 'checkpointed', $3, $2, 'worker',
           jsonb_build_object('version', version, 'processed', $7::bigint, 'gen', $4::integer), now()
    FROM w
)
SELECT version FROM w;

-- name: fence_checkpoint
-- params: p1 int8, p2 int4, p3 int8, p4 int4
-- returns: gen int4, state bytea, schema_version int4, version int4, processed int8, updated_at timestamptz
-- A new attempt (retry, resume, re-run after a crash) fences off older attempts and reads
-- the checkpoint in one statement: $1 run, $2 gen, $3 token, $4 attempt.
INSERT INTO checkpoints AS c (run_id, gen, token, fence_token, attempt)
VALUES ($1, $2, 0, $3, $4)
ON CONFLICT (run_id) DO UPDATE SET fence_token = greatest(c.fence_token, excluded.fence_token)
RETURNING gen, state, schema_version, version, processed, updated_at;

-- name: get_hot_run
-- params: id int8
-- returns: id int8, handler text, queue text, status text, priority int2, payload bytea, run_at timestamptz,
-- returns: attempt int4, max_retries int4, timeout_s float8, idempotency_key text, lease_owner text,
-- returns: lease_expires_at timestamptz, token int8, version int8, gen int4, created_at timestamptz,
-- returns: updated_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error text,
-- returns: last_error_class text, reason text, result bytea, workflow_id uuid, schedule_id int8,
-- returns: fire_time timestamptz, trace_id text, pause_requested bool, stop_requested bool,
-- returns: cancel_requested bool, forced bool, needs_compensation bool, outbox bool, tenant text,
-- returns: concurrency_key text, concurrency_limit int4, rate_key text, rate_limit text, submitted_by text
-- A run that commands may act on: only the hot table. An archived run is history; putting
-- it back in Redis would run it with no row left to record into.
SELECT * FROM runs WHERE id = $1;

-- name: get_checkpoint
-- params: run_id int8
-- returns: run_id int8, gen int4, token int8, attempt int4, version int4, schema_version int4, state bytea,
-- returns: processed int8, updated_at timestamptz
SELECT run_id, gen, token, attempt, version, schema_version, state, processed, updated_at
FROM checkpoints WHERE run_id = $1;

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

-- name: review_queue
-- params: queue text, limit int8
-- returns: id int8, handler text, queue text, attempt int4, finished_at timestamptz, last_error_class text,
-- returns: last_error text
SELECT id, handler, queue, attempt, finished_at, last_error_class, last_error
FROM runs WHERE status = 'FAILED' AND reason = 'review' AND ($1::text IS NULL OR queue = $1)
ORDER BY finished_at DESC LIMIT $2;

-- name: events_since
-- params: since timestamptz, type text, queue text, limit int8, scope_queues text[], after_at timestamptz,
-- params: after_stream_id int8, after_id int8
-- returns: id int8, run_id int8, queue text, type text, from_status text, to_status text, attempt int4,
-- returns: worker_id text, actor text, reason text, error_class text, at timestamptz, handler text,
-- returns: workflow_id uuid, trace_id text, stream_id int8
-- The fleet's history (the rows of the view `history`, 020 and 021: event rows, attempts' claims and
-- finishes, submits recorded in their run's row) with the run's queue (events of runs carry no queue of
-- their own): `fencepost events --since 10m --type lease_expired` and GET /v1/events. Newest first; on
-- equal times the stream entries newest first, then the rest by id (run_events' order, reversed: a claim
-- and its finish in one millisecond list the finish first). $1 since, $2 type, $3 queue, $4 limit,
-- $5 queues in scope (NULL: all), $6-$8 the cursor: only rows after (at, COALESCE(stream_id, -1), id)
-- in this order (NULL: from the newest). Each half is filtered by scope and cursor and limited on its
-- own before they are merged: the events half reads events_at in order (033) instead of sorting every
-- event of the window, the submits half runs_created_page (032).
SELECT * FROM (
    (SELECT e.id, e.run_id, COALESCE(r.queue, e.queue) AS queue, e.type, e.from_status, e.to_status, e.attempt,
            e.worker_id, e.actor, e.reason, e.error_class, e.at, r.handler, r.workflow_id, r.trace_id, e.stream_id
     FROM events e LEFT JOIN runs r ON r.id = e.run_id
     WHERE e.at >= $1 AND ($2::text IS NULL OR e.type = $2) AND ($3::text IS NULL OR COALESCE(r.queue, e.queue) = $3)
       AND ($5::text[] IS NULL OR COALESCE(r.queue, e.queue) = ANY($5))
       AND ($6::timestamptz IS NULL OR (e.at <= $6 AND (e.at, COALESCE(e.stream_id, -1), e.id) < ($6, $7::bigint, $8::bigint)))
     ORDER BY e.at DESC, COALESCE(e.stream_id, -1) DESC, e.id DESC LIMIT $4)
    UNION ALL
    (SELECT -a.claim_stream_id, a.run_id, r.queue, 'claimed', 'PENDING', 'RUNNING', a.attempt, a.worker_id,
            NULL::text, NULL::text, NULL::text, a.started_at, r.handler, r.workflow_id, r.trace_id, a.claim_stream_id
     FROM attempts a LEFT JOIN runs r ON r.id = a.run_id
     WHERE a.claim_version IS NOT NULL AND a.started_at >= $1 AND ($2::text IS NULL OR $2 = 'claimed')
       AND ($3::text IS NULL OR r.queue = $3) AND ($5::text[] IS NULL OR r.queue = ANY($5))
       AND ($6::timestamptz IS NULL OR (a.started_at <= $6 AND (a.started_at, a.claim_stream_id) < ($6, $7::bigint)))
     ORDER BY a.started_at DESC, a.claim_stream_id DESC LIMIT $4)
    UNION ALL
    (SELECT -a.finish_stream_id, a.run_id, r.queue, a.finish_type, a.finish_from, a.finish_to, a.attempt, a.worker_id,
            NULL::text, a.reason, a.error_class, a.finished_at, r.handler, r.workflow_id, r.trace_id, a.finish_stream_id
     FROM attempts a LEFT JOIN runs r ON r.id = a.run_id
     WHERE a.finish_type IS NOT NULL AND a.finished_at >= $1 AND ($2::text IS NULL OR a.finish_type = $2)
       AND ($3::text IS NULL OR r.queue = $3) AND ($5::text[] IS NULL OR r.queue = ANY($5))
       AND ($6::timestamptz IS NULL OR (a.finished_at <= $6 AND (a.finished_at, a.finish_stream_id) < ($6, $7::bigint)))
     ORDER BY a.finished_at DESC, a.finish_stream_id DESC LIMIT $4)
    UNION ALL
    (SELECT -r.id, r.id, r.queue, 'submitted', NULL::text, 'PENDING', NULL::integer, NULL::text, r.submitted_by,
            NULL::text, NULL::text, r.created_at, r.handler, r.workflow_id, r.trace_id, NULL::bigint
     FROM runs r
     WHERE r.submitted_by IS NOT NULL AND r.created_at >= $1 AND ($2::text IS NULL OR $2 = 'submitted')
       AND ($3::text IS NULL OR r.queue = $3) AND ($5::text[] IS NULL OR r.queue = ANY($5))
       AND ($6::timestamptz IS NULL OR (r.created_at <= $6 AND (r.created_at, -1::bigint, -r.id) < ($6, $7::bigint, $8::bigint)))
     ORDER BY r.created_at DESC, r.id ASC LIMIT $4)
    UNION ALL
    (SELECT -r.id, r.id, r.queue, 'submitted', NULL::text, 'PENDING', NULL::integer, NULL::text, r.submitted_by,
            NULL::text, NULL::text, r.created_at, r.handler, r.workflow_id, r.trace_id, NULL::bigint
     FROM runs_archive r
     WHERE r.submitted_by IS NOT NULL AND r.created_at >= $1 AND ($2::text IS NULL OR $2 = 'submitted')
       AND ($3::text IS NULL OR r.queue = $3) AND ($5::text[] IS NULL OR r.queue = ANY($5))
       AND ($6::timestamptz IS NULL OR (r.created_at <= $6 AND (r.created_at, -1::bigint, -r.id) < ($6, $7::bigint, $8::bigint)))
     ORDER BY r.created_at DESC, r.id ASC LIMIT $4)
) h
ORDER BY at DESC, COALESCE(stream_id, -1) DESC, id DESC LIMIT $4;

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
