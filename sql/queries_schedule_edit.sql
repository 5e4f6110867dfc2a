-- Named queries for editing a schedule in place and firing it now (issue 16).

-- name: schedule_lock
-- params: name text
-- returns: id int8, name text, handler text, payload bytea, args_json jsonb, queue text, priority int2,
-- returns: cron text, interval_s float8, timezone text, next_fire_time timestamptz, spread_s float8,
-- returns: offset_ms int4, due_at timestamptz, catchup bool, catchup_window_s float8, allow_overlap bool,
-- returns: paused bool, last_fire_time timestamptz, last_run_id int8, fires int8, skipped int8,
-- returns: created_at timestamptz, updated_at timestamptz, quarantined text, fires_into text,
-- returns: fire_priority int2, def_max_retries int4, def_timeout_s float8, busy bool, last_status text
-- The stored schedule with its handler's declared defaults, locked for an edit or a manual
-- fire (the trigger skips it meanwhile: trigger_due uses SKIP LOCKED).
SELECT s.*, COALESCE(s.queue, d.queue) AS fires_into, COALESCE(s.priority, d.priority) AS fire_priority,
       d.max_retries AS def_max_retries, d.timeout_s AS def_timeout_s,
       (s.last_run_id IS NOT NULL AND NOT s.allow_overlap AND EXISTS (
           SELECT 1 FROM runs r WHERE r.id = s.last_run_id
           AND r.status IN ('PENDING', 'RETRY_WAIT', 'RUNNING', 'STOPPING', 'PAUSED', 'BLOCKED'))) AS busy,
       (SELECT r.status FROM runs r WHERE r.id = s.last_run_id) AS last_status
FROM schedules s LEFT JOIN job_definitions d ON d.name = s.handler
WHERE s.name = $1
FOR UPDATE OF s;

-- name: schedule_update
-- params: id int8, handler text, payload bytea, args_json jsonb, queue text, priority int2, cron text,
-- params: interval_s float8, timezone text, next_fire_time timestamptz, spread_s float8, offset_ms int4,
-- params: catchup bool, catchup_window_s float8, allow_overlap bool
-- returns: id int8
-- Every editable column at once (the caller merged the change into the stored values and
-- validated the result). An edit fixes a quarantined schedule: the quarantine (and the pause
-- it imposed) is lifted.
UPDATE schedules SET handler = $2, payload = $3, args_json = $4::jsonb, queue = $5, priority = $6, cron = $7,
                     interval_s = $8, timezone = $9, next_fire_time = $10::timestamptz,
                     due_at = $10::timestamptz + make_interval(secs => $12::integer / 1000.0),
                     spread_s = $11, offset_ms = $12, catchup = $13, catchup_window_s = $14, allow_overlap = $15,
                     paused = CASE WHEN quarantined IS NOT NULL THEN false ELSE paused END,
                     quarantined = NULL, updated_at = now()
WHERE id = $1
RETURNING id;

-- name: schedule_fired_now
-- params: id int8, last_run_id int8, last_fire_time timestamptz
-- returns: nothing
-- A manual fire: the run counts as the schedule's latest (overlap checks see it); the next
-- scheduled fire time does not move.
UPDATE schedules SET last_run_id = $2, last_fire_time = $3, fires = fires + 1, updated_at = now() WHERE id = $1;
