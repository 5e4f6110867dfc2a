-- Named queries of history maintenance (reconciler/retention.py): monthly partitions of
-- events, attempts and runs_archive (functions in 007_history_partitions.sql), the move of
-- finished runs out of the hot table, and retention by partition drop.

-- name: retention_try_lock
-- params: none
-- returns: locked bool
-- One maintainer at a time across reconciler replicas and the CLI (same key as
-- fencepost_ensure_partitions takes); released at the end of the transaction.
SELECT pg_try_advisory_xact_lock(1179668052) AS locked;

-- name: retention_lock
-- params: none
-- returns: pg_advisory_xact_lock void
-- The same lock, waited for (the CLI: another maintainer finishes first).
SELECT pg_advisory_xact_lock(1179668052);

-- name: retention_lock_timeout
-- params: none
-- returns: set_config text
-- DETACH needs an exclusive lock on the parent: give up rather than queue every history
-- write behind a long query that holds it.
SELECT set_config('lock_timeout', '10s', true);

-- name: ensure_partitions
-- params: p1 date, p2 int4
-- returns: created text
-- $1 first month, $2 months after it; returns the partitions it created.
SELECT fencepost_ensure_partitions($1::date, $2::integer) AS created;

-- name: archive_runs
-- params: max_finished_at timestamptz, limit int8
-- returns: nothing
-- Moves up to $2 terminal runs finished before $1 from runs to runs_archive, oldest first,
-- with their checkpoints (the FK forbids the run going first; a finished run's checkpoint
-- can no longer be resumed from: commands refuse an archived run). Workflow runs stay:
-- workflow_nodes/edges reference them and a workflow retry may still re-run them. Rows a
-- concurrent command holds are skipped; FOR UPDATE re-checks a row that changed meanwhile
-- (a retried run is no longer terminal).
WITH picked AS (
    SELECT id FROM runs
    WHERE finished_at < $1 AND status IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'STOPPED')
      AND workflow_id IS NULL
    ORDER BY finished_at LIMIT $2
    FOR UPDATE SKIP LOCKED
), ckpt AS (
    DELETE FROM checkpoints c USING picked p WHERE c.run_id = p.id
), moved AS (
    DELETE FROM runs r USING picked p WHERE r.id = p.id RETURNING r.*
)
INSERT INTO runs_archive SELECT * FROM moved;

-- name: history_partitions
-- params: none
-- returns: parent text, name text, lower_bound timestamptz, upper_bound timestamptz
-- The monthly partitions of the history tables with their bounds (DEFAULT excluded).
SELECT parent, name, bounds[1]::timestamptz AS lower_bound, bounds[2]::timestamptz AS upper_bound
FROM (
    SELECT i.inhparent::regclass::text AS parent, c.relname::text AS name,
           regexp_match(pg_get_expr(c.relpartbound, c.oid), '^FOR VALUES FROM \(''([^'']+)''\) TO \(''([^'']+)''\)$')
               AS bounds
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent IN ('events'::regclass, 'attempts'::regclass, 'runs_archive'::regclass) AND c.relkind = 'r'
) p
WHERE bounds IS NOT NULL
ORDER BY upper_bound, parent;

-- name: partition_rows
-- params: p1 text, p2 bool
-- returns: n int8
-- $1 partition, $2 lock it against writes until the transaction ends (see 007); NULL when
-- the partition does not exist (any more).
SELECT fencepost_partition_rows(to_regclass($1::text), $2::boolean) AS n;

-- name: drop_partition
-- params: p1 text, p2 text[]
-- returns: kept int8
-- $2 the finished states: the rows of runs in any other state are kept (018); returns how many.
SELECT fencepost_drop_partition($1::text::regclass, $2::text[]) AS kept;

-- name: rollup_prune
-- params: max_minute timestamptz, limit int8
-- returns: nothing
-- The dashboard's per-minute rollup (013_queue_minutes) older than $1, at most $2 rows, oldest first
-- (the primary key starts with minute: an index range scan, never the whole table).
WITH old AS (
    SELECT minute, queue FROM queue_minutes WHERE minute < $1 ORDER BY minute LIMIT $2
)
DELETE FROM queue_minutes q USING old WHERE (q.minute, q.queue) = (old.minute, old.queue);
