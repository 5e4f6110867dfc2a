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
    INSERT INTO events (run_id, queue, type, attempt, token, actor, data, at)  -- the run's queue (047)
    SELECT $1, (SELECT queue FROM runs WHERE id = $1), 'checkpointed', $3, $2, 'worker',
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
