-- Named queries of failover-exact executions (the rebuild's unknown attempts) and of the
-- chaos soak (`fencepost loadtest chaos`: its fenced ledger and its end-of-soak checks).
-- Loaded by fencepost/core/record.py.

-- name: rebuild_mark_unknown
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
-- The soak's downstream system: every side effect a job performed, with the execution's
-- (attempt, token), and the fence it keeps (the highest token seen per run). Created on
-- demand by `fencepost loadtest chaos`; rows are per soak and deleted at its end.
CREATE TABLE IF NOT EXISTS fencepost_chaos_effects (
    soak text NOT NULL, run_id bigint NOT NULL, attempt integer NOT NULL, token bigint NOT NULL,
    worker_id text NOT NULL, accepted boolean NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX IF NOT EXISTS fencepost_chaos_effects_run ON fencepost_chaos_effects (soak, run_id);
CREATE TABLE IF NOT EXISTS fencepost_chaos_fence (
    soak text NOT NULL, run_id bigint NOT NULL, token bigint NOT NULL, PRIMARY KEY (soak, run_id));

-- name: chaos_effect
-- One side effect through the fence: accepted when its token is at least the highest the
-- fence has seen for the run (a retried write of one execution is accepted again); a lower
-- token (an execution superseded by a newer claim) is refused and recorded as refused.
WITH f AS (
    INSERT INTO fencepost_chaos_fence AS x (soak, run_id, token) VALUES ($1, $2, $4)
    ON CONFLICT (soak, run_id) DO UPDATE SET token = excluded.token WHERE x.token <= excluded.token
    RETURNING token
)
INSERT INTO fencepost_chaos_effects (soak, run_id, attempt, token, worker_id, accepted)
SELECT $1, $2, $3, $4, $5, EXISTS (SELECT 1 FROM f)
RETURNING accepted;

-- name: chaos_terminate_backends
-- The fault "PostgreSQL backend termination": every other client connection to this database.
SELECT count(*) AS n FROM (
    SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend') t;

-- name: chaos_run_status
SELECT id, status FROM runs WHERE id = ANY($1::bigint[]);

-- name: chaos_checks
-- The soak's invariants, over the executions the ledger saw (distinct run, attempt, token):
--   untraced        an execution with no attempt row of its number carrying its token (an
--                   'unknown' row of that number, written after a Redis loss, traces it)
--   reused          an attempt number two executions of one run used
--   beyond          runs with more executions than attempt rows
--   stale_accepted  an accepted effect whose token is below one accepted earlier for the run
--   token_order     attempts of one run whose tokens do not grow with the attempt number
--   incomplete      runs of the queue SUCCEEDED without a succeeded event, or with an attempt
--                   (other than 'unknown') without its claimed event
WITH ex AS (
    SELECT DISTINCT run_id, attempt, token FROM fencepost_chaos_effects WHERE soak = $1
), traced AS (
    SELECT ex.run_id, ex.attempt, ex.token, a.outcome, a.token AS a_token FROM ex
    LEFT JOIN attempts a ON a.run_id = ex.run_id AND a.attempt = ex.attempt
)
SELECT
    (SELECT count(*) FROM ex) AS executions,
    (SELECT count(DISTINCT run_id) FROM ex) AS runs_with_effects,
    (SELECT count(*) FROM (SELECT run_id FROM ex GROUP BY run_id HAVING count(*) > 1) d) AS runs_repeated,
    (SELECT count(*) FROM traced WHERE outcome IS DISTINCT FROM 'unknown' AND a_token IS DISTINCT FROM token) AS untraced,
    (SELECT count(*) FROM (SELECT 1 FROM ex GROUP BY run_id, attempt HAVING count(*) > 1) d) AS reused,
    (SELECT count(*) FROM (SELECT run_id, count(*) AS n FROM ex GROUP BY run_id) d
      WHERE d.n > (SELECT count(*) FROM attempts a WHERE a.run_id = d.run_id)) AS beyond,
    (SELECT count(*) FROM fencepost_chaos_effects e WHERE e.soak = $1 AND e.accepted AND EXISTS (
        SELECT 1 FROM fencepost_chaos_effects f WHERE f.soak = $1 AND f.run_id = e.run_id AND f.accepted
          AND f.token > e.token AND f.at < e.at)) AS stale_accepted,
    (SELECT count(*) FROM fencepost_chaos_effects WHERE soak = $1 AND NOT accepted) AS refused,
    (SELECT count(*) FROM attempts a JOIN attempts b ON a.run_id = b.run_id AND a.attempt < b.attempt
      WHERE a.run_id IN (SELECT run_id FROM ex) AND a.token > 0 AND b.token > 0 AND a.token >= b.token) AS token_order,
    (SELECT count(*) FROM attempts a WHERE a.run_id IN (SELECT run_id FROM ex) AND a.outcome = 'unknown') AS unknown_attempts,
    (SELECT count(*) FROM runs r WHERE r.queue = $2 AND r.status = 'SUCCEEDED' AND (
        NOT EXISTS (SELECT 1 FROM events e WHERE e.run_id = r.id AND e.to_status = 'SUCCEEDED')
        OR EXISTS (SELECT 1 FROM attempts a WHERE a.run_id = r.id AND a.outcome IS DISTINCT FROM 'unknown'
                   AND NOT EXISTS (SELECT 1 FROM events e WHERE e.run_id = r.id AND e.type = 'claimed'
                                   AND e.attempt = a.attempt)))) AS incomplete;

-- name: chaos_forget
DELETE FROM fencepost_chaos_effects WHERE soak = $1;

-- name: chaos_forget_fence
DELETE FROM fencepost_chaos_fence WHERE soak = $1;
