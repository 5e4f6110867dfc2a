-- Queues as their own thing: declared by workers and registered handlers before any run exists,
-- listed and checked by the CLI.

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

-- name: workflow_ids_by_prefix
-- params: text text
-- returns: id uuid
-- The workflows whose id starts with $1 (a shortened id as `workflow ls` prints it); at most 2,
-- enough to tell "unique" from "ambiguous".
SELECT id FROM workflows WHERE id::text LIKE $1 || '%' ORDER BY id LIMIT 2;

-- name: loadtest_cleanup
-- params: queue text
-- returns: runs int8
-- Remove a load test's synthetic queue from the record: its runs (hot and archived), their
-- attempts and checkpoints, and the queue itself, so they never show up in `fencepost ls`. Their
-- events stay: history is append-only (a trigger refuses DELETE) and expires with retention.
-- One statement: the foreign keys are checked at its end, when every referencing row is gone.
WITH gone AS (
    SELECT id FROM runs WHERE queue = $1 UNION ALL SELECT id FROM runs_archive WHERE queue = $1
), ck AS (
    DELETE FROM checkpoints WHERE run_id IN (SELECT id FROM gone)
), at AS (
    DELETE FROM attempts WHERE run_id IN (SELECT id FROM gone)
), ar AS (
    DELETE FROM runs_archive WHERE queue = $1
), r AS (
    DELETE FROM runs WHERE queue = $1 RETURNING id
), q AS (
    DELETE FROM queues WHERE name = $1
)
SELECT count(*) AS runs FROM r;
