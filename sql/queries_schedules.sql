-- Named queries: Schedules and the trigger that fires them (its lease, its fires, in-place edits).
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: schedule_queues
-- params: name text[]
-- returns: name text, queue text
-- The queue each schedule fires into (its own, else its handler's declared queue).
SELECT s.name, COALESCE(s.queue, d.queue, 'default') AS queue
FROM schedules s LEFT JOIN job_definitions d ON d.name = s.handler
WHERE $1::text[] IS NULL OR s.name = ANY($1);

-- name: schedule_list_scoped
-- params: limit int8, scope text[]
-- returns: id int8, name text, handler text, cron text, interval_s float8, timezone text,
-- returns: next_fire_time timestamptz, spread_s float8, offset_ms int4, catchup bool, allow_overlap bool,
-- returns: paused bool, last_fire_time timestamptz, fires int8, skipped int8, queue text
-- schedule_list filtered to the caller's queues ($2; NULL: all).
SELECT s.id, s.name, s.handler, s.cron, s.interval_s, s.timezone, s.next_fire_time, s.spread_s, s.offset_ms,
       s.catchup, s.allow_overlap, s.paused, s.last_fire_time, s.fires, s.skipped, s.queue
FROM schedules s LEFT JOIN job_definitions d ON d.name = s.handler
WHERE $2::text[] IS NULL OR COALESCE(s.queue, d.queue, 'default') = ANY($2)
ORDER BY s.name LIMIT $1;

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

-- name: schedule_page_scoped
-- params: limit int8, scope text[], after_name text
-- returns: id int8, name text, handler text, cron text, interval_s float8, timezone text,
-- returns: next_fire_time timestamptz, spread_s float8, offset_ms int4, catchup bool, allow_overlap bool,
-- returns: paused bool, last_fire_time timestamptz, fires int8, skipped int8, queue text
-- Schedules by name, filtered to the caller's queues ($2; NULL: all) before the limit ($1), after the
-- cursor's name ($3; NULL: from the first). schedule_list_scoped with a cursor.
SELECT s.id, s.name, s.handler, s.cron, s.interval_s, s.timezone, s.next_fire_time, s.spread_s, s.offset_ms,
       s.catchup, s.allow_overlap, s.paused, s.last_fire_time, s.fires, s.skipped, s.queue
FROM schedules s LEFT JOIN job_definitions d ON d.name = s.handler
WHERE ($2::text[] IS NULL OR COALESCE(s.queue, d.queue, 'default') = ANY($2))
  AND ($3::text IS NULL OR s.name > $3)
ORDER BY s.name LIMIT $1;

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

-- name: schedule_insert
-- params: name text, handler text, payload bytea, args_json jsonb, queue text, priority int2, cron text,
-- params: interval_s float8, timezone text, next_fire_time timestamptz, spread_s float8, catchup bool,
-- params: catchup_window_s float8, allow_overlap bool
-- returns: id int8
-- Returns no row when the name is taken (nothing is written).
INSERT INTO schedules (name, handler, payload, args_json, queue, priority, cron, interval_s, timezone,
                       next_fire_time, due_at, spread_s, catchup, catchup_window_s, allow_overlap)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10, $10, $11, $12, $13, $14)
ON CONFLICT (name) DO NOTHING
RETURNING id;

-- name: schedule_set_offset
-- params: id int8, offset_ms int4
-- returns: nothing
UPDATE schedules SET offset_ms = $2::integer, due_at = next_fire_time + make_interval(secs => $2::integer / 1000.0)
WHERE id = $1;

-- name: schedule_get
-- params: name text
-- returns: id int8, name text, handler text, payload bytea, args_json jsonb, queue text, priority int2,
-- returns: cron text, interval_s float8, timezone text, next_fire_time timestamptz, spread_s float8,
-- returns: offset_ms int4, due_at timestamptz, catchup bool, catchup_window_s float8, allow_overlap bool,
-- returns: paused bool, last_fire_time timestamptz, last_run_id int8, fires int8, skipped int8,
-- returns: created_at timestamptz, updated_at timestamptz, quarantined text, last_status text
SELECT s.*, (SELECT r.status FROM runs r WHERE r.id = s.last_run_id) AS last_status
FROM schedules s WHERE name = $1;

-- name: schedule_list
-- params: limit int8
-- returns: id int8, name text, handler text, cron text, interval_s float8, timezone text,
-- returns: next_fire_time timestamptz, spread_s float8, offset_ms int4, catchup bool, allow_overlap bool,
-- returns: paused bool, last_fire_time timestamptz, fires int8, skipped int8
SELECT id, name, handler, cron, interval_s, timezone, next_fire_time, spread_s, offset_ms, catchup,
       allow_overlap, paused, last_fire_time, fires, skipped
FROM schedules ORDER BY name LIMIT $1;

-- name: schedule_pause
-- params: name text, paused bool
-- returns: id int8
UPDATE schedules SET paused = $2, updated_at = now() WHERE name = $1 RETURNING id;

-- name: schedule_delete
-- params: name text
-- returns: id int8
DELETE FROM schedules WHERE name = $1 RETURNING id;

-- name: schedule_runs
-- params: schedule_id int8, limit int8
-- returns: id int8, queue text, status text, fire_time timestamptz, run_at timestamptz,
-- returns: started_at timestamptz, finished_at timestamptz, attempt int4
SELECT id, queue, status, fire_time, run_at, started_at, finished_at, attempt
FROM runs WHERE schedule_id = $1 ORDER BY fire_time DESC LIMIT $2;

-- name: trigger_due
-- params: max_due_at timestamptz, limit int8
-- returns: id int8, handler text, payload bytea, queue text, priority int2, max_retries int4,
-- returns: timeout_s float8, cron text, interval_s float8, timezone text, next_fire_time timestamptz,
-- returns: offset_ms int4, catchup bool, catchup_window_s float8, allow_overlap bool, last_run_id int8,
-- returns: busy bool
-- The fires due by $1 (the trigger's clock + lookahead), oldest first, locked so a second
-- leader skips them instead of waiting. Reads work proportional to $2, never to the number
-- of schedules (partial index schedules_due). Handler defaults come from its declaration.
SELECT s.id, s.handler, s.payload, COALESCE(s.queue, d.queue) AS queue,
       COALESCE(s.priority, d.priority) AS priority, d.max_retries, d.timeout_s,
       s.cron, s.interval_s, s.timezone, s.next_fire_time, s.offset_ms, s.catchup, s.catchup_window_s,
       s.allow_overlap, s.last_run_id,
       (s.last_run_id IS NOT NULL AND NOT s.allow_overlap AND EXISTS (
           SELECT 1 FROM runs r WHERE r.id = s.last_run_id
           AND r.status IN ('PENDING', 'RETRY_WAIT', 'RUNNING', 'STOPPING', 'PAUSED', 'BLOCKED'))) AS busy
FROM schedules s LEFT JOIN job_definitions d ON d.name = s.handler
WHERE NOT s.paused AND s.due_at <= $1
ORDER BY s.due_at
LIMIT $2
FOR UPDATE OF s SKIP LOCKED;

-- name: trigger_advance
-- params: id int8[], seen_next timestamptz[], next_fire_time timestamptz[], last_fire_time timestamptz[],
-- params: last_run_id int8[], fired int4[], skipped int4[]
-- returns: nothing
-- After the fires of a batch: next fire, last fire, counters. Guarded by the next_fire_time
-- the trigger read, so a slow leader never moves a schedule backwards.
UPDATE schedules s SET
    next_fire_time = u.next_fire_time,
    due_at = u.next_fire_time + make_interval(secs => s.offset_ms / 1000.0),
    last_fire_time = COALESCE(u.last_fire_time, s.last_fire_time),
    last_run_id = COALESCE(u.last_run_id, s.last_run_id),
    fires = s.fires + u.fired,
    skipped = s.skipped + u.skipped,
    updated_at = now()
FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::bigint[],
            $6::integer[], $7::integer[])
     AS u(id, seen_next, next_fire_time, last_fire_time, last_run_id, fired, skipped)
WHERE s.id = u.id AND s.next_fire_time = u.seen_next;

-- name: trigger_skip_events
-- params: q text[], t text[], r text[], d jsonb[]
-- returns: nothing
-- A fire not made because the previous run of its schedule is still active (or coalesced).
INSERT INTO events (run_id, queue, type, actor, reason, data, at)
SELECT NULL, q, t, 'trigger', r, d, now()
FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[]) AS x(q, t, r, d);

-- name: lease_acquire
-- params: p1 text, p2 text, max_expires_at timestamptz, p4 float8
-- returns: token int8
-- Take or renew the lease: succeeds when free, expired, or already ours. The token grows
-- on every change of holder. $3: the time it is (NULL: PostgreSQL's now(), the trigger's clock;
-- a test's clock otherwise).
INSERT INTO trigger_leases AS l (name, holder, token, expires_at)
VALUES ($1, $2, 1, COALESCE($3::timestamptz, now()) + make_interval(secs => $4::double precision))
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    token = CASE WHEN l.holder = excluded.holder THEN l.token ELSE l.token + 1 END,
    expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at < COALESCE($3::timestamptz, now())
RETURNING token;

-- name: db_now
-- params: none
-- returns: now timestamptz
-- PostgreSQL's clock (the transaction's time), where a host's must not decide (docs/clock.md): the
-- trigger's fire times, and a submit's run_at when Redis's clock cannot be read.
SELECT now();

-- name: lease_release
-- params: name text, holder text
-- returns: nothing
DELETE FROM trigger_leases WHERE name = $1 AND holder = $2;
