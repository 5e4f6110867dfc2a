-- Named queries of the loops' per-item isolation (issue 13): quarantined runs and schedules,
-- and the epoch a rebuild spends only when it stamps.

-- name: quarantine_runs
-- Runs PostgreSQL holds that Redis cannot (values an older version accepted): cancelled with
-- reason 'quarantined' and the error, so no loop retries them forever. Waiting runs only (the
-- cancelled edges of fencepost/core/states.py); $3 names the loop that found them.
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::text[]) AS u(id, error)
), old AS (
    SELECT r.id, r.status, u.error FROM runs r JOIN u ON u.id = r.id
    WHERE r.status IN ('PENDING', 'RETRY_WAIT', 'PAUSED', 'BLOCKED') FOR UPDATE OF r
), r AS (
    UPDATE runs r SET status = 'CANCELLED', reason = 'quarantined', last_error = old.error,
                      last_error_class = 'Quarantined', finished_at = now(), version = r.version + 1,
                      updated_at = now()
    FROM old WHERE r.id = old.id
    RETURNING r.id, r.queue, old.status AS before, r.version, r.attempt, old.error
), e AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, attempt, actor, reason,
                        error_class, error_message, data, at)
    SELECT id, queue, 'cancelled', before, 'CANCELLED', version, attempt, 'reconciler', 'quarantined',
           'Quarantined', error, jsonb_build_object('loop', $3::text), now() FROM r
)
SELECT id, queue FROM r;

-- name: quarantine_schedule
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
-- The epoch a rebuild stamps: a new one when the current one may have been stamped, else the
-- current one again (an earlier rebuild bumped it and failed before stamping: no token exists
-- under it). The cap (epoch < 8192, tokens are doubles in Lua) raises check_violation.
UPDATE queues SET epoch = CASE WHEN epoch_stamped THEN epoch + 1 ELSE epoch END, epoch_stamped = false
WHERE name = $1 RETURNING epoch;

-- name: epoch_stamping
-- Written just before the stamp reaches Redis: from here tokens may exist under this epoch.
UPDATE queues SET epoch_stamped = true WHERE name = $1 AND epoch = $2;
