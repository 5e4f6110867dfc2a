-- Named queries of the reconciler (drift repair, rebuild, gauges, scale hint). Loaded by
-- fencepost/core/record.py.

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

-- name: drift_events
-- params: id int8[], f text[], t text[], v int8[], k text[], d jsonb[]
-- returns: nothing
-- One 'drift_repaired' event per repaired drift (reason = the kind of drift), with its run's queue (047).
INSERT INTO events (run_id, queue, type, from_status, to_status, version, actor, reason, data, at)
SELECT id, (SELECT r.queue FROM runs r WHERE r.id = x.id), 'drift_repaired', f, t, v, 'reconciler', k, d, now()
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::jsonb[]) AS x(id, f, t, v, k, d);

-- name: rebuild_try_lock
-- params: p1 text
-- returns: locked bool
-- One rebuild of a queue at a time across reconciler replicas (session lock, same connection).
SELECT pg_try_advisory_lock(hashtext('fencepost_rebuild:' || $1::text)) AS locked;

-- name: rebuild_unlock
-- params: p1 text
-- returns: unlocked bool
SELECT pg_advisory_unlock(hashtext('fencepost_rebuild:' || $1::text)) AS unlocked;

-- name: queue_epoch
-- params: name text
-- returns: epoch int8, paused bool
SELECT epoch, paused FROM queues WHERE name = $1;

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

-- name: stuck_detected_events
-- params: id int8[], queue text[], status text[], reason text[]
-- returns: nothing
-- One 'stuck_detected' event per run that crossed its SLA (one statement per pass).
INSERT INTO events (run_id, queue, type, to_status, actor, reason, at)
SELECT id, queue, 'stuck_detected', status, 'reconciler', reason, now()
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) AS s(id, queue, status, reason);

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
