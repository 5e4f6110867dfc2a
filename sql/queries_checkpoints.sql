-- Named queries: Checkpoints and progress a handler saves while it runs.
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: progress_upsert
-- params: run_id int8[], attempt int4[], done float8[], total float8[], message text[]
-- returns: nothing
-- The latest progress of running attempts, coalesced by the worker (one statement per flush).
-- An older attempt never overwrites a newer one's progress.
INSERT INTO run_progress AS p (run_id, attempt, done, total, message, updated_at)
SELECT * , now() FROM unnest($1::bigint[], $2::integer[], $3::float8[], $4::float8[], $5::text[])
ON CONFLICT (run_id) DO UPDATE SET attempt = EXCLUDED.attempt, done = EXCLUDED.done, total = EXCLUDED.total,
                                   message = EXCLUDED.message, updated_at = EXCLUDED.updated_at
WHERE p.attempt <= EXCLUDED.attempt;

-- name: progress_get
-- params: run_id int8[]
-- returns: run_id int8, attempt int4, done float8, total float8, message text, updated_at timestamptz
SELECT run_id, attempt, done, total, message, updated_at FROM run_progress WHERE run_id = ANY($1::bigint[]);

-- name: progress_prune
-- params: limit int8
-- returns: nothing
-- Progress of runs that left `runs` (archived by retention): dropped, at most $1 per pass.
DELETE FROM run_progress p
WHERE p.run_id IN (SELECT q.run_id FROM run_progress q
                   WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = q.run_id) LIMIT $1);

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

-- name: get_checkpoint
-- params: run_id int8
-- returns: run_id int8, gen int4, token int8, attempt int4, version int4, schema_version int4, state bytea,
-- returns: processed int8, updated_at timestamptz
SELECT run_id, gen, token, attempt, version, schema_version, state, processed, updated_at
FROM checkpoints WHERE run_id = $1;
