-- Named queries of the HTTP API (scheduler/api/): tokens, run listings with time and
-- owner filters, queue figures for the dashboard.

-- name: api_token_insert
-- $6: expires after this many seconds (NULL: never)
INSERT INTO api_tokens (name, role, queues, secret_sha256, created_by, expires_at)
VALUES ($1, $2, $3::text[], $4, $5, now() + make_interval(secs => $6::double precision))
RETURNING id, name, role, queues, created_by, created_at, revoked_at, last_used_at, expires_at;

-- name: api_token_by_hash
SELECT id, name, role, queues, revoked_at, (expires_at IS NOT NULL AND expires_at <= now()) AS expired
FROM api_tokens WHERE secret_sha256 = $1;

-- name: api_token_list
SELECT id, name, role, queues, created_by, created_at, revoked_at, last_used_at, expires_at
FROM api_tokens ORDER BY id;

-- name: api_token_revoke
UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, now()) WHERE id = $1
RETURNING id, name, role, queues, created_by, created_at, revoked_at, last_used_at, expires_at;

-- name: api_token_touch
UPDATE api_tokens SET last_used_at = now()
WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');

-- name: api_submitted_by
SELECT actor FROM events WHERE run_id = $1 AND type = 'submitted' ORDER BY id LIMIT 1;

-- name: api_queue_figures
-- Per queue over the last $1 seconds: finished runs (throughput) and the mean and max
-- delay between a run being due and its attempt starting (schedule lag).
SELECT q.name AS queue, q.paused,
       (SELECT count(*) FROM runs r WHERE r.queue = q.name AND r.finished_at >= now() - make_interval(secs => $1))
           AS finished,
       (SELECT avg(extract(epoch FROM a.started_at - r.run_at)) FROM attempts a JOIN runs r ON r.id = a.run_id
        WHERE r.queue = q.name AND a.started_at >= now() - make_interval(secs => $1) AND a.started_at >= r.run_at)
           AS lag_s
FROM queues q WHERE ($2::text[] IS NULL OR q.name = ANY($2)) ORDER BY q.name;

-- name: api_list_workflows
SELECT w.id, w.name, w.created_at,
       (SELECT count(*) FROM workflow_nodes n WHERE n.workflow_id = w.id AND n.current) AS nodes
FROM workflows w ORDER BY w.created_at DESC LIMIT $1;
