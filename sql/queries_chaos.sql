-- Named queries of failover-exact executions (the rebuild's unknown attempts) and of the
-- chaos soak (`fencepost loadtest chaos`: the jobs' ledger, and the history its checks read;
-- the checks themselves are Python, fencepost/dev/chaos_check.py).
-- Loaded by fencepost/core/record.py.

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
