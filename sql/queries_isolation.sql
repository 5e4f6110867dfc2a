-- Named queries of the loops' per-item isolation (issue 13): quarantined runs and schedules,
-- and the epoch a rebuild spends only when it stamps.

-- name: quarantine_runs
-- params: id int8[], error text[], p3 text
-- returns: id int8, queue text
-- Runs PostgreSQL holds that Redis cannot (values an older version accepted): cancelled with
-- reason 'quarantined' and the error, so no loop retries them forever. Waiting runs only (the
-- cancelled edges of fencepost/core/states.py); $3 names the loop that found them. Values outside
-- 010's bounds are put back inside them (017_quarantine_any_row.sql: the row must pass its NOT
-- VALID constraints to be updated at all); the event's data keeps what was stored ('stored').
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::text[]) AS u(id, error)
), old AS (
    SELECT r.id, r.status, u.error, r.timeout_s, r.max_retries FROM runs r JOIN u ON u.id = r.id
    WHERE r.status IN ('PENDING', 'RETRY_WAIT', 'PAUSED', 'BLOCKED') FOR UPDATE OF r
), r AS (
    UPDATE runs r SET status = 'CANCELLED', reason = 'quarantined', last_error = old.error,
                      last_error_class = 'Quarantined', finished_at = now(), version = r.version + 1,
                      updated_at = now(),
                      timeout_s = CASE WHEN r.timeout_s <= 2592000 THEN r.timeout_s ELSE 2592000 END,
                      max_retries = LEAST(r.max_retries, 10000)
    FROM old WHERE r.id = old.id
    RETURNING r.id, r.queue, old.status AS before, r.version, r.attempt, old.error,
              old.timeout_s AS stored_timeout_s, old.max_retries AS stored_max_retries
), e AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, attempt, actor, reason,
                        error_class, error_message, data, at)
    SELECT id, queue, 'cancelled', before, 'CANCELLED', version, attempt, 'reconciler', 'quarantined',
           'Quarantined', error,
           jsonb_build_object('loop', $3::text, 'stored', jsonb_build_object(
               'timeout_s', stored_timeout_s::text, 'max_retries', stored_max_retries)), now() FROM r
)
SELECT id, queue FROM r;

-- name: quarantine_run_values
-- params: id int8[], p2 text
-- returns: id int8, queue text, timeout_s text, max_retries int4
-- Runs among $1 whose stored values are outside 010's bounds (rows an older version wrote), in
-- any state: the values put back inside the bounds so the row can be updated again (its history
-- recorded, a lost lease interrupted, a command applied), with a 'quarantined' event keeping what
-- was stored; $2 names the loop. The run itself goes on (Redis holds its own copy).
WITH old AS (
    SELECT id, queue, status, version, attempt, timeout_s, max_retries FROM runs
    WHERE id = ANY($1::bigint[]) AND NOT fencepost_run_bounded(timeout_s, max_retries)
    FOR UPDATE
), r AS (
    UPDATE runs r SET timeout_s = CASE WHEN r.timeout_s <= 2592000 THEN r.timeout_s ELSE 2592000 END,
                      max_retries = LEAST(r.max_retries, 10000)
    FROM old WHERE r.id = old.id
    RETURNING r.id, r.queue, old.status, old.version, old.attempt, old.timeout_s, old.max_retries
), e AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, attempt, actor, reason,
                        error_class, error_message, data, at)
    SELECT id, queue, 'quarantined', status, status, version, attempt, 'reconciler', 'quarantined',
           'Quarantined', 'stored values outside the bounds (timeout_s ' || timeout_s::text || ', max_retries '
           || max_retries || ') put back inside them',
           jsonb_build_object('loop', $2::text, 'stored', jsonb_build_object(
               'timeout_s', timeout_s::text, 'max_retries', max_retries)), now() FROM r
)
SELECT id, queue, timeout_s::text AS timeout_s, max_retries FROM r;

-- name: unbounded_runs
-- params: id int8[]
-- returns: id int8, status text, timeout_s float8, max_retries int4
-- Of the runs $1, those whose stored values lie outside 010's bounds (rows written before them):
-- nearly always none, so a loop screens a page of runs with one index lookup each and no payload.
SELECT id, status, timeout_s, max_retries FROM runs
WHERE id = ANY($1::bigint[]) AND NOT fencepost_run_bounded(timeout_s, max_retries);

-- name: cancel_unheld_run
-- params: id int8, actor text, p3 text, last_error text, p5 text, version int8
-- returns: id int8, version int8
-- An operator's cancel of a waiting run Redis cannot hold (so no Lua script can apply it): done in
-- PostgreSQL alone, compare-and-set on the version read ($6), values put back inside 010's bounds
-- as quarantine_runs does, with the operator's event (actor $2, reason $3, the error $4, $5 the
-- address or '').
WITH old AS (
    SELECT id, status, timeout_s, max_retries FROM runs
    WHERE id = $1 AND status IN ('PENDING', 'RETRY_WAIT', 'PAUSED', 'BLOCKED') AND version = $6 FOR UPDATE
), r AS (
    UPDATE runs r SET status = 'CANCELLED', last_error = $4, last_error_class = 'Quarantined',
                      finished_at = now(), version = r.version + 1, updated_at = now(),
                      timeout_s = CASE WHEN r.timeout_s <= 2592000 THEN r.timeout_s ELSE 2592000 END,
                      max_retries = LEAST(r.max_retries, 10000)
    FROM old WHERE r.id = old.id
    RETURNING r.id, r.queue, old.status AS before, r.version, r.attempt, old.timeout_s, old.max_retries
), e AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, attempt, actor, reason,
                        error_class, error_message, data, at)
    SELECT id, queue, 'cancelled', before, 'CANCELLED', version, attempt, $2::text, NULLIF($3::text, ''),
           'Quarantined', $4, jsonb_build_object('address', NULLIF($5::text, ''), 'stored', jsonb_build_object(
               'timeout_s', timeout_s::text, 'max_retries', max_retries)), now() FROM r
)
SELECT id, version FROM r;

-- name: quarantine_schedule
-- params: id int8, quarantined text, every_queue text
-- returns: name text
-- A schedule the trigger cannot fire: paused with the reason, and an event (run_id NULL).
WITH s AS (
    UPDATE schedules SET paused = true, quarantined = $2, updated_at = now()
    WHERE id = $1 RETURNING id, name, queue
)
INSERT INTO events (run_id, queue, type, actor, reason, error_message, data, at)
SELECT NULL, COALESCE(s.queue, $3), 'schedule_quarantined', 'trigger', 'quarantined', $2,
       jsonb_build_object('schedule_id', s.id, 'schedule', s.name), now() FROM s
RETURNING data->>'schedule' AS name;

-- name: rebuild_epoch
-- params: name text
-- returns: epoch int8
-- The epoch a rebuild stamps: a new one when the current one may have been stamped, else the
-- current one again (an earlier rebuild bumped it and failed before stamping: no token exists
-- under it). The cap (epoch < 8192, tokens are doubles in Lua) raises check_violation.
UPDATE queues SET epoch = CASE WHEN epoch_stamped THEN epoch + 1 ELSE epoch END, epoch_stamped = false
WHERE name = $1 RETURNING epoch;

-- name: epoch_stamping
-- params: name text, epoch int8
-- returns: nothing
-- Written just before the stamp reaches Redis: from here tokens may exist under this epoch.
UPDATE queues SET epoch_stamped = true WHERE name = $1 AND epoch = $2;
