-- Named queries: The reconciler's maintenance: drift repair, rebuild locks, gauges, the scale hint, retention
-- (monthly partitions of events, attempts and runs_archive; functions in 007_history_partitions.sql).
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: rebuild_mark_unknown
-- params: id int8[], seen_attempt int4[], seen_version int8[], token int8, queue text
-- returns: id int8, attempt int4, version int8
-- Runs an untrusted or lost Redis dataset may have claimed (PENDING, RETRY_WAIT or PAUSED in
-- PostgreSQL, after lost leases were interrupted): one attempt with outcome 'unknown' each,
-- numbered above both PostgreSQL's attempt and the dataset's ($2, 0 when it had no hash), so
-- the next claim takes a number no execution used. The version moves above both too ($3): an
-- unrecorded stream entry of the old dataset never moves the projection back. One event each.
-- The row's token is the new epoch's floor ($4 * 2^40): above any token the lost execution
-- could hold, below every token issued after the rebuild (the floor a downstream fence may take).
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::integer[], $3::bigint[]) AS u(id, seen_attempt, seen_version)
), r AS (
    UPDATE runs SET attempt = GREATEST(runs.attempt, u.seen_attempt) + 1,
                    version = GREATEST(runs.version, u.seen_version) + 1, updated_at = now()
    FROM u WHERE runs.id = u.id AND runs.queue = $5 AND runs.status IN ('PENDING', 'RETRY_WAIT', 'PAUSED')
    RETURNING runs.id, runs.status, runs.attempt, runs.version
), a AS (
    INSERT INTO attempts (run_id, attempt, token, worker_id, started_at, finished_at, outcome, error_class,
                          error_message)
    SELECT id, attempt, $4::bigint * 1099511627776, '', now(), now(), 'unknown', 'RedisLost',
           'redis_lost: the Redis dataset that may have run this attempt was lost (rebuilt at epoch ' || $4::integer || ')'
    FROM r
), e AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, attempt, actor, reason, at, data)
    SELECT id, $5, 'attempt_unknown', status, status, version, attempt, 'reconciler', 'redis_lost', now(),
           jsonb_build_object('epoch', $4::integer)
    FROM r
)
SELECT id, attempt, version FROM r;

-- name: drift_active_ids
-- params: queue text, min_id int8, limit int8
-- returns: id int8
-- One keyset page of the runs Redis must hold (the incremental walk, a page per tick).
SELECT id FROM runs
WHERE queue = $1 AND id > $2 AND status IN ('PENDING', 'RETRY_WAIT', 'RUNNING', 'STOPPING', 'PAUSED', 'BLOCKED')
ORDER BY id LIMIT $3;

-- name: drift_recent_ids
-- params: queue text, limit int8
-- returns: id int8
-- The newest active runs of a queue (where a submit that never reached Redis shows up first).
SELECT id FROM runs
WHERE queue = $1 AND status IN ('PENDING', 'RETRY_WAIT', 'RUNNING', 'STOPPING', 'PAUSED', 'BLOCKED')
ORDER BY id DESC LIMIT $2;

-- name: drift_runs
-- params: id int8[], p2 float8
-- returns: id int8, queue text, handler text, status text, priority int2, payload bytea, run_at timestamptz,
-- returns: attempt int4, max_retries int4, timeout_s float8, fire_time timestamptz, trace_id text,
-- returns: version int8, token int8, tenant text, concurrency_key text, concurrency_limit int4,
-- returns: rate_key text, rate_limit text, settled bool
-- The record of runs seen in Redis or PostgreSQL, read after Redis (a row committed before a
-- Redis write is always seen). `settled`: not changed within the grace period, so a submit
-- or command between its PostgreSQL commit and its Redis write is not taken for drift.
SELECT id, queue, handler, status, priority, payload, run_at, attempt, max_retries, timeout_s,
       fire_time, trace_id, version, token, tenant, concurrency_key, concurrency_limit, rate_key, rate_limit,
       updated_at < now() - make_interval(secs => $2::double precision) AS settled
FROM runs WHERE id = ANY($1::bigint[]);

-- name: drift_runs_brief
-- params: id int8[], p2 float8
-- returns: id int8, queue text, status text, version int8, settled bool
-- What drift detection compares (drift_runs without the payload).
SELECT id, queue, status, version, updated_at < now() - make_interval(secs => $2::double precision) AS settled
FROM runs WHERE id = ANY($1::bigint[]);

-- name: drift_interrupt_lost
-- params: id int8[], p2 int8[]
-- returns: id int8, status text, version int8
-- Runs PostgreSQL has as leased whose Redis state is gone: the attempt is closed as
-- interrupted; RUNNING goes back to PENDING (at least once), STOPPING becomes STOPPED
-- (the lease_expired edges of fencepost/core/states.py). Conditional on the leased state.
-- $2: the runs whose queue stream still holds their lease_expired (the reaper's or repair_interrupt's,
-- not yet recorded): closed the same way, but their event row is left to the recorder (once).
WITH r AS (
    UPDATE runs SET status = CASE WHEN status = 'RUNNING' THEN 'PENDING' ELSE 'STOPPED' END,
                    lease_owner = NULL, lease_expires_at = NULL, version = version + 1,
                    finished_at = CASE WHEN status = 'STOPPING' THEN now() END,
                    reason = 'redis_lost', updated_at = now()
    WHERE id = ANY($1::bigint[]) AND status IN ('RUNNING', 'STOPPING')
    RETURNING id, status, attempt, version, token, queue
), a AS (
    UPDATE attempts SET finished_at = now(), outcome = 'interrupted',
                        error_message = 'lease state lost from Redis'
    WHERE (run_id, attempt) IN (SELECT id, attempt FROM r) AND finished_at IS NULL
), e AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, attempt, token, actor, reason, at)
    SELECT id, queue, 'lease_expired', CASE WHEN status = 'PENDING' THEN 'RUNNING' ELSE 'STOPPING' END, status,
           version, attempt, token, 'reconciler', 'redis_lost', now() FROM r
    WHERE id <> ALL($2::bigint[])
)
SELECT id, status, version FROM r;

-- name: drift_record_terminal
-- params: id int8[], status text[], version int8[], attempt int4[], token int8[], result bytea[],
-- params: error_class text[], error_message text[], reason text[]
-- returns: id int8, from_status text
-- Terminal transitions Redis made whose stream entries are gone: the projection takes the
-- Redis state (only if it is newer, by version) and the open attempt is closed.
-- Returns the runs written, with the status PostgreSQL had before.
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::integer[], $5::bigint[], $6::bytea[],
                         $7::text[], $8::text[], $9::text[])
        AS u(id, status, version, attempt, token, result, error_class, error_message, reason)
), old AS (
    SELECT r.id, r.status FROM runs r JOIN u ON u.id = r.id WHERE r.version < u.version FOR UPDATE OF r
), upd AS (
    UPDATE runs r SET status = u.status, version = u.version, attempt = GREATEST(r.attempt, u.attempt),
                      token = COALESCE(u.token, r.token), lease_owner = NULL, lease_expires_at = NULL,
                      finished_at = now(), result = CASE WHEN u.status = 'SUCCEEDED' THEN u.result END,
                      last_error = COALESCE(u.error_message, r.last_error),
                      last_error_class = COALESCE(u.error_class, r.last_error_class),
                      reason = COALESCE(u.reason, r.reason), updated_at = now()
    FROM u WHERE r.id = u.id AND r.id IN (SELECT id FROM old)
    RETURNING r.id, r.status, r.attempt
), att AS (
    UPDATE attempts a SET finished_at = now(),
        outcome = CASE upd.status WHEN 'SUCCEEDED' THEN 'succeeded' WHEN 'CANCELLED' THEN 'cancelled'
                                  WHEN 'TIMED_OUT' THEN 'timeout' ELSE 'error' END
    FROM upd WHERE a.run_id = upd.id AND a.attempt = upd.attempt AND a.finished_at IS NULL
)
SELECT old.id, old.status AS from_status FROM old;

-- name: rebuild_try_lock
-- params: p1 text
-- returns: locked bool
-- One rebuild of a queue at a time across reconciler replicas (session lock, same connection).
SELECT pg_try_advisory_lock(hashtext('fencepost_rebuild:' || $1::text)) AS locked;

-- name: rebuild_unlock
-- params: p1 text
-- returns: unlocked bool
SELECT pg_advisory_unlock(hashtext('fencepost_rebuild:' || $1::text)) AS unlocked;

-- name: gauge_due_bands
-- params: none
-- returns: queue text, band text, n int8
-- Depth by priority band (the starvation signal): Redis scores mix priority with enqueue
-- time, so the bands are counted from the record (PENDING and due).
SELECT queue, CASE WHEN priority >= 200 THEN 'high' WHEN priority >= 100 THEN 'normal' ELSE 'low' END AS band,
       count(*) AS n
FROM runs WHERE status = 'PENDING' AND run_at <= now() GROUP BY 1, 2;

-- name: gauge_dead_and_review
-- params: none
-- returns: queue text, review bool, n int8
SELECT queue, (reason = 'review') AS review, count(*) AS n FROM runs
WHERE status IN ('FAILED', 'TIMED_OUT') GROUP BY 1, 2;

-- name: gauge_stuck_runs
-- params: p1 float8, p2 float8, p3 float8
-- returns: id int8, queue text, status text
-- Runs beyond their SLA: $1 seconds RUNNING (since start), $2 STOPPING, $3 PAUSED (since
-- the last change).
SELECT id, queue, status FROM runs WHERE
    (status = 'RUNNING' AND started_at < now() - make_interval(secs => $1)) OR
    (status = 'STOPPING' AND updated_at < now() - make_interval(secs => $2)) OR
    (status = 'PAUSED' AND updated_at < now() - make_interval(secs => $3))
LIMIT 10000;

-- name: scale_measure
-- params: queue text, p2 float8, outcome text[]
-- returns: created int8, attempts int8, mean_run_s float8, backlog int8
-- The scale hint's figures for queue $1 over the last $2 seconds (fencepost/core/scaling.py):
-- runs created, attempts that ran the handler to an end ($3: those outcomes) and their mean
-- duration, and the backlog due now.
SELECT
  (SELECT count(*) FROM runs
    WHERE queue = $1 AND created_at > now() - make_interval(secs => $2))              AS created,
  (SELECT count(*) FROM attempts a JOIN runs r ON r.id = a.run_id
    WHERE r.queue = $1 AND a.finished_at > now() - make_interval(secs => $2)
      AND a.outcome = ANY($3::text[]))                                                   AS attempts,
  (SELECT avg(extract(epoch FROM a.finished_at - a.started_at)) FROM attempts a JOIN runs r ON r.id = a.run_id
    WHERE r.queue = $1 AND a.finished_at > now() - make_interval(secs => $2)
      AND a.outcome = ANY($3::text[]))::float8                                           AS mean_run_s,
  (SELECT count(*) FROM runs
    WHERE queue = $1 AND status = 'PENDING' AND run_at <= now())                         AS backlog;

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
