-- Named queries: The dev harnesses: the chaos soak's ledger and the history its checks read, the load test.
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: chaos_create_ledger
-- unchecked: several statements, run by execute (fencepost.dev.sqlheaders runs it before the check)
-- The soak's ledger, in a database the soak does not fault: every execution's start, steps
-- (each after its checkpoint, with the version Fencepost returned), end or stop, with the
-- execution's (run, attempt, token), its worker and the worker's pid, on one clock (this
-- database's clock_timestamp()). Created on demand; a soak's rows are deleted at its end.
CREATE TABLE IF NOT EXISTS fencepost_chaos_ledger (
    soak text NOT NULL, run_id bigint NOT NULL, attempt integer NOT NULL, token bigint NOT NULL,
    worker_id text NOT NULL, pid integer NOT NULL, model text NOT NULL, kind text NOT NULL,
    cp_version integer, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX IF NOT EXISTS fencepost_chaos_ledger_run ON fencepost_chaos_ledger (soak, run_id);
CREATE INDEX IF NOT EXISTS fencepost_chaos_ledger_at ON fencepost_chaos_ledger (soak, at);

-- name: chaos_ledger_write
-- params: soak text, run_id int8, attempt int4, token int8, worker_id text, pid int4, model text, kind text,
-- params: cp_version int4
-- returns: nothing
INSERT INTO fencepost_chaos_ledger (soak, run_id, attempt, token, worker_id, pid, model, kind, cp_version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: chaos_ledger_rows
-- params: soak text, run_id int8[]
-- returns: run_id int8, attempt int4, token int8, worker_id text, pid int4, model text, kind text,
-- returns: cp_version int4, at_ms int8
-- The soak's rows, optionally only those of some runs ($2 NULL: all), times in ms on the ledger's clock.
SELECT run_id, attempt, token, worker_id, pid, model, kind, cp_version,
       (extract(epoch FROM at) * 1000)::bigint AS at_ms
FROM fencepost_chaos_ledger WHERE soak = $1 AND ($2::bigint[] IS NULL OR run_id = ANY($2::bigint[]));

-- name: chaos_ledger_open
-- params: soak text, pid int4[], p3 int8
-- returns: run_id int8, attempt int4, token int8
-- Executions of the workers with these pids ($2) that started and had not ended at $3 (ms):
-- what a fault of those workers leaves behind.
SELECT DISTINCT s.run_id, s.attempt, s.token FROM fencepost_chaos_ledger s
WHERE s.soak = $1 AND s.kind = 'start' AND s.pid = ANY($2::integer[]) AND s.at <= to_timestamp($3::bigint / 1000.0)
  AND NOT EXISTS (SELECT 1 FROM fencepost_chaos_ledger e WHERE e.soak = $1 AND e.run_id = s.run_id
                  AND e.token = s.token AND e.kind IN ('end', 'raised', 'stopped', 'refused')
                  AND e.at <= to_timestamp($3::bigint / 1000.0));

-- name: chaos_ledger_settled
-- params: soak text, run_id int8[], token int8[]
-- returns: n int8, at_ms int8
-- Of these runs ($2) and the executions a fault caught ($3 tokens, one per run): those settled,
-- i.e. a newer execution started or the caught one ended. With the ledger's time (ms) of the
-- last one settled.
SELECT count(*) AS n, (extract(epoch FROM max(t.at)) * 1000)::bigint AS at_ms FROM (
    SELECT u.run_id, min(l.at) AS at FROM unnest($2::bigint[], $3::bigint[]) AS u(run_id, token)
    JOIN fencepost_chaos_ledger l ON l.soak = $1 AND l.run_id = u.run_id
     AND ((l.token > u.token AND l.kind = 'start') OR (l.token = u.token AND l.kind IN ('end', 'raised', 'stopped', 'refused')))
    GROUP BY u.run_id) t;

-- name: chaos_ledger_now
-- params: none
-- returns: int8 int8
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint;

-- name: chaos_forget
-- params: soak text
-- returns: nothing
DELETE FROM fencepost_chaos_ledger WHERE soak = $1;

-- name: chaos_run_status
-- params: id int8[]
-- returns: id int8, status text
SELECT id, status FROM runs WHERE id = ANY($1::bigint[]);

-- name: chaos_history_runs
-- params: queue text[]
-- returns: id int8, status text, run_at_ms int8, schedule_id int8, fire_ms int8
-- The soak's queues' runs as the checks read them (times in ms): its queue and, on Redis Cluster,
-- the other shard's queue its probes used (their executions are in the ledger too).
SELECT id, status, (extract(epoch FROM run_at) * 1000)::bigint AS run_at_ms, schedule_id,
       (extract(epoch FROM fire_time) * 1000)::bigint AS fire_ms
FROM runs WHERE queue = ANY($1::text[]);

-- name: chaos_history_attempts
-- params: queue text[]
-- returns: run_id int8, attempt int4, token int8, outcome text, error_class text, error_message text,
-- returns: worker_id text, started_ms int8, finished_ms int8
SELECT a.run_id, a.attempt, a.token, a.outcome, a.error_class, left(a.error_message, 300) AS error_message, a.worker_id,
       (extract(epoch FROM a.started_at) * 1000)::bigint AS started_ms,
       (extract(epoch FROM a.finished_at) * 1000)::bigint AS finished_ms
FROM attempts a WHERE a.run_id IN (SELECT id FROM runs WHERE queue = ANY($1::text[]));

-- name: chaos_history_events
-- params: queue text[]
-- returns: id int8, run_id int8, type text, version int8, attempt int4, token int8, to_status text,
-- returns: stream_id int8
SELECT e.id, e.run_id, e.type, e.version, e.attempt, e.token, e.to_status, e.stream_id
FROM history e WHERE e.run_id IN (SELECT id FROM runs WHERE queue = ANY($1::text[]));  -- events + attempts' claims / finishes (020)

-- name: chaos_fires_since
-- params: schedule_id int8[], p2 int8, p3 int8
-- returns: n int8
-- Runs of these schedules whose fire time is at least $2 (ms): how far the trigger caught up.
SELECT count(*) AS n FROM runs WHERE schedule_id = ANY($1::bigint[]) AND fire_time >= to_timestamp($2::bigint / 1000.0)
  AND fire_time <= to_timestamp($3::bigint / 1000.0);

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

-- name: loadtest_schedule_ids
-- params: p1 int4
-- returns: nextval int8
SELECT nextval(pg_get_serial_sequence('schedules', 'id')) FROM generate_series(1, $1);

-- name: loadtest_insert_schedules
-- params: i int8[], name text, payload bytea, cron text, next_fire_time timestamptz, spread_s float8,
-- params: o int4[]
-- returns: nothing
-- Bulk schedules for `fencepost loadtest spike` ($1 ids, $7 offsets computed by spread_offset_ms).
INSERT INTO schedules (id, name, handler, payload, queue, cron, timezone, next_fire_time, spread_s, offset_ms, due_at)
SELECT i, $2::text || '-' || i, 'loadtest.noop', $3::bytea, $2::text, $4::text, 'UTC', $5::timestamptz,
       $6::double precision, o, $5::timestamptz + make_interval(secs => o / 1000.0)
FROM unnest($1::bigint[], $7::integer[]) AS t(i, o);

-- name: loadtest_delete_schedules
-- params: queue text
-- returns: nothing
DELETE FROM schedules WHERE queue = $1;

-- name: loadtest_status_counts
-- params: queue text
-- returns: status text, n int8
SELECT status, count(*) AS n FROM runs WHERE queue = $1 GROUP BY status;

-- name: loadtest_relation_size
-- params: p1 text[]
-- returns: sum int8
SELECT sum(pg_total_relation_size(t::regclass))::bigint FROM unnest($1::text[]) AS t;

-- name: loadtest_report
-- params: queue text
-- returns: runs int8, c0 timestamptz, c1 timestamptz, ok int8, last_done timestamptz, lag float8[],
-- returns: lag_max numeric, lag_due float8[], lag_due_max numeric
-- Start lag is measured from the logical fire time (schedules) or the submit time (bursts),
-- and from run_at (when the run was due: the fire time plus the schedule's spread offset).
SELECT count(*) AS runs, min(created_at) AS c0, max(created_at) AS c1,
       count(*) FILTER (WHERE status = 'SUCCEEDED') AS ok,
       max(finished_at) AS last_done,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
           (ORDER BY extract(epoch FROM started_at - COALESCE(fire_time, run_at))) AS lag,
       max(extract(epoch FROM started_at - COALESCE(fire_time, run_at))) AS lag_max,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
           (ORDER BY extract(epoch FROM started_at - run_at)) AS lag_due,
       max(extract(epoch FROM started_at - run_at)) AS lag_due_max
FROM runs WHERE queue = $1;
