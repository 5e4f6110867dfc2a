-- Named queries: Workflows (DAGs): submit, release, cancel, retry, show.
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: api_list_workflows
-- params: limit int8
-- returns: id uuid, name text, created_at timestamptz, nodes int8
SELECT w.id, w.name, w.created_at,
       (SELECT count(*) FROM workflow_nodes n WHERE n.workflow_id = w.id AND n.current) AS nodes
FROM workflows w ORDER BY w.created_at DESC LIMIT $1;

-- name: api_list_workflows_scoped
-- params: limit int8, scope text[], after_created_at timestamptz, after_id uuid
-- returns: id uuid, name text, created_at timestamptz, nodes int8
-- Recent workflows; with $2 (a token's queues), only those whose every node is in scope; newest first,
-- after the cursor's ($3 created_at, $4 id; NULL: from the newest).
SELECT w.id, w.name, w.created_at,
       (SELECT count(*) FROM workflow_nodes n WHERE n.workflow_id = w.id AND n.current) AS nodes
FROM workflows w
WHERE ($2::text[] IS NULL OR NOT EXISTS (
    SELECT 1 FROM workflow_nodes n JOIN runs r ON r.id = n.run_id
    WHERE n.workflow_id = w.id AND NOT (r.queue = ANY($2))))
  AND ($3::timestamptz IS NULL OR (w.created_at, w.id) < ($3, $4::uuid))
ORDER BY w.created_at DESC, w.id DESC LIMIT $1;

-- name: wf_upstream_results
-- params: run_id int8
-- returns: name text, run_id int8, status text, result bytea
-- A workflow run's direct upstreams by node name, with status and result.
SELECT n.name, u.id AS run_id, u.status, u.result
FROM workflow_edges e JOIN workflow_nodes n ON n.run_id = e.depends_on JOIN runs u ON u.id = e.depends_on
WHERE e.run_id = $1
ORDER BY n.name;

-- name: workflow_ids_by_prefix
-- params: text text
-- returns: id uuid
-- The workflows whose id starts with $1 (a shortened id as `workflow ls` prints it); at most 2,
-- enough to tell "unique" from "ambiguous".
SELECT id FROM workflows WHERE id::text LIKE $1 || '%' ORDER BY id LIMIT 2;

-- name: wf_insert
-- params: id uuid, name text, run_id int8[], name text[], run_id_2 int8[], depends_on int8[]
-- returns: nothing
-- One workflow row, its node names and edges ($3 names by run, $4/$5 edges).
WITH w AS (
    INSERT INTO workflows (id, name) VALUES ($1, $2)
), n AS (
    INSERT INTO workflow_nodes (run_id, workflow_id, name)
    SELECT run_id, $1, name FROM unnest($3::bigint[], $4::text[]) AS t(run_id, name)
)
INSERT INTO workflow_edges (run_id, depends_on)
SELECT * FROM unnest($5::bigint[], $6::bigint[]);

-- name: wf_lock_dependents
-- params: depends_on int8[]
-- returns: id int8
-- The BLOCKED direct dependents of runs that just settled, locked in id order. The lock
-- serializes two transactions that settle two upstreams of one join: the second sees the
-- first's commit in its next statement, so a dependent is never left blocked.
SELECT r.id FROM runs r
WHERE r.id IN (SELECT e.run_id FROM workflow_edges e WHERE e.depends_on = ANY($1::bigint[]))
  AND r.status = 'BLOCKED'
ORDER BY r.id
FOR UPDATE OF r;

-- name: wf_release
-- params: id int8[], actor text
-- returns: id int8, queue text, notified int8
-- Of the given BLOCKED runs, those whose every upstream SUCCEEDED become PENDING, with
-- outbox=true so the relay moves them to Redis after commit. One 'released' event each.
WITH ready AS (
    SELECT c.id FROM unnest($1::bigint[]) AS c(id)
    WHERE NOT EXISTS (SELECT 1 FROM workflow_edges e JOIN runs u ON u.id = e.depends_on
                      WHERE e.run_id = c.id AND u.status <> 'SUCCEEDED')
), upd AS (
    UPDATE runs r SET status = 'PENDING', version = r.version + 1, outbox = true, run_at = now(),
                      reason = NULL, updated_at = now()
    FROM ready WHERE r.id = ready.id AND r.status = 'BLOCKED'
    RETURNING r.id, r.queue, r.version, r.trace_id
), ev AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, actor, reason, trace_id, at)
    SELECT id, queue, 'released', 'BLOCKED', 'PENDING', version, $2, 'upstream_succeeded', trace_id, now() FROM upd
), notify AS (
    SELECT pg_notify('fencepost_outbox', q.queue) FROM (SELECT DISTINCT queue FROM upd) q
)
SELECT id, queue, (SELECT count(*) FROM notify) AS notified FROM upd;

-- name: wf_cancel_descendants
-- params: id int8[], actor text
-- returns: id int8
-- Every BLOCKED descendant of runs that failed for good becomes CANCELLED (upstream_failed).
-- Only runs that really are FAILED / TIMED_OUT / CANCELLED count (a replayed batch is a no-op).
WITH RECURSIVE failed AS (
    SELECT id FROM runs WHERE id = ANY($1::bigint[]) AND status IN ('FAILED', 'TIMED_OUT', 'CANCELLED')
), d(id) AS (
    SELECT e.run_id FROM workflow_edges e JOIN failed f ON e.depends_on = f.id
    UNION
    SELECT e.run_id FROM workflow_edges e JOIN d ON e.depends_on = d.id
), upd AS (
    UPDATE runs r SET status = 'CANCELLED', version = r.version + 1, reason = 'upstream_failed',
                      finished_at = now(), outbox = false, updated_at = now()
    FROM d WHERE r.id = d.id AND r.status = 'BLOCKED'
    RETURNING r.id, r.queue, r.version, r.trace_id
), ev AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, actor, reason, trace_id, at)
    SELECT id, queue, 'upstream_failed', 'BLOCKED', 'CANCELLED', version, $2, 'upstream_failed', trace_id, now()
    FROM upd
)
SELECT id FROM upd;

-- name: wf_blocked_settled
-- params: p1 float8, limit int8
-- returns: id int8, all_ok bool, failed int8[]
-- Sweep: BLOCKED workflow runs (unchanged for $1 seconds) whose upstreams have all
-- settled: all SUCCEEDED (release) or one failed for good (cancel).
SELECT r.id,
       bool_and(u.status = 'SUCCEEDED') AS all_ok,
       array_agg(u.id) FILTER (WHERE u.status IN ('FAILED', 'TIMED_OUT', 'CANCELLED')) AS failed
FROM runs r JOIN workflow_edges e ON e.run_id = r.id JOIN runs u ON u.id = e.depends_on
WHERE r.status = 'BLOCKED' AND r.workflow_id IS NOT NULL AND r.updated_at < now() - make_interval(secs => $1)
GROUP BY r.id
HAVING bool_and(u.status = 'SUCCEEDED') OR bool_or(u.status IN ('FAILED', 'TIMED_OUT', 'CANCELLED'))
LIMIT $2;

-- name: wf_nodes
-- params: workflow_id uuid
-- returns: name text, id int8, status text, reason text, handler text, queue text, attempt int4,
-- returns: version int8, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: depends_on text[]
-- The current node of every name in a workflow, with its run and upstream names.
SELECT n.name, r.id, r.status, r.reason, r.handler, r.queue, r.attempt, r.version, r.started_at, r.finished_at,
       r.last_error_class,
       COALESCE((SELECT array_agg(un.name ORDER BY un.name) FROM workflow_edges e
                 JOIN workflow_nodes un ON un.run_id = e.depends_on
                 WHERE e.run_id = n.run_id), '{}') AS depends_on
FROM workflow_nodes n JOIN runs r ON r.id = n.run_id
WHERE n.workflow_id = $1 AND n.current
ORDER BY n.name;

-- name: wf_get
-- params: id uuid
-- returns: id uuid, name text, created_at timestamptz
SELECT id, name, created_at FROM workflows WHERE id = $1;

-- name: wf_reblock
-- params: id int8[], version int8[], actor text
-- returns: id int8
-- Workflow retry: cancelled dependents go back to BLOCKED (they wait for their upstreams
-- again). Version-guarded: a run that changed since it was read is left alone.
WITH upd AS (
    UPDATE runs r SET status = 'BLOCKED', version = r.version + 1, reason = NULL, finished_at = NULL,
                      outbox = false, updated_at = now()
    FROM unnest($1::bigint[], $2::bigint[]) AS u(id, version)
    WHERE r.id = u.id AND r.version = u.version AND r.status = 'CANCELLED'
    RETURNING r.id, r.queue, r.version, r.trace_id
), ev AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, actor, reason, trace_id, at)
    SELECT id, queue, 'retried', 'CANCELLED', 'BLOCKED', version, $3, 'workflow_retry', trace_id, now() FROM upd
)
SELECT id FROM upd;

-- name: wf_supersede
-- params: run_id int8[], actor text
-- returns: count int8
-- Recompute: the old runs of the recomputed nodes stop standing for their names; old
-- BLOCKED ones are cancelled (superseded) so nothing releases them later.
WITH n AS (
    UPDATE workflow_nodes SET current = false WHERE run_id = ANY($1::bigint[]) AND current RETURNING run_id
), upd AS (
    UPDATE runs r SET status = 'CANCELLED', version = r.version + 1, reason = 'superseded',
                      finished_at = now(), updated_at = now()
    WHERE r.id = ANY($1::bigint[]) AND r.status = 'BLOCKED'
    RETURNING r.id, r.queue, r.version
), ev AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, actor, reason, at)
    SELECT id, queue, 'cancelled', 'BLOCKED', 'CANCELLED', version, $2, 'superseded', now() FROM upd
)
SELECT count(*) FROM n;

-- name: wf_add_nodes
-- params: workflow_id uuid, run_id int8[], name text[], run_id_2 int8[], depends_on int8[]
-- returns: nothing
WITH n AS (
    INSERT INTO workflow_nodes (run_id, workflow_id, name)
    SELECT run_id, $1, name FROM unnest($2::bigint[], $3::text[]) AS t(run_id, name)
)
INSERT INTO workflow_edges (run_id, depends_on)
SELECT * FROM unnest($4::bigint[], $5::bigint[]);

-- name: wf_runs_full
-- params: id int8[]
-- returns: id int8, handler text, queue text, priority int2, payload bytea, max_retries int4,
-- returns: timeout_s float8, trace_id text, tenant text, concurrency_key text, concurrency_limit int4,
-- returns: rate_key text, rate_limit text
SELECT id, handler, queue, priority, payload, max_retries, timeout_s, trace_id, tenant, concurrency_key,
       concurrency_limit, rate_key, rate_limit FROM runs WHERE id = ANY($1::bigint[]);

-- name: wf_lock_blocked
-- params: id int8[]
-- returns: id int8
SELECT id FROM runs WHERE id = ANY($1::bigint[]) AND status = 'BLOCKED' ORDER BY id FOR UPDATE;
