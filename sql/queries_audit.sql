-- Named queries of the control plane (issue 14): scoped idempotency keys, the audit log,
-- bulk selections fixed when counted, and the API's scope-filtered listings.

-- name: insert_runs_keyed
-- params: handler text[], queue text[], priority int2[], payload bytea[], run_at timestamptz[],
-- params: max_retries int4[], timeout_s float8[], idempotency_key text[], trace_id text[], status text[],
-- params: workflow_id uuid[], schedule_id int8[], fire_time timestamptz[], outbox bool[], tenant text[],
-- params: concurrency_key text[], concurrency_limit int4[], rate_key text[], rate_limit text[], actor text,
-- params: request_sha256 text[], scope text[]
-- returns: ord int8, id int8, created bool, queue text, epoch int8, notified int8
-- insert_runs for a batch in which some runs carry an idempotency key: each key is claimed
-- in idempotency_keys (unique per scope) first, and a keyed run is inserted only if its claim
-- won. $21 request fingerprints and $22 scopes line up with the runs (NULL when unkeyed).
-- Returns insert_runs' rows; the caller looks up the keys it did not win (idempotency_lookup).
WITH input AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('runs', 'id'))::regclass) AS id, t.*
    FROM unnest($1::text[], $2::text[], $3::smallint[], $4::bytea[], $5::timestamptz[],
                $6::integer[], $7::double precision[], $8::text[], $9::text[], $10::text[],
                $11::uuid[], $12::bigint[], $13::timestamptz[], $14::boolean[], $15::text[], $16::text[],
                $17::integer[], $18::text[], $19::text[], $21::text[], $22::text[])
        WITH ORDINALITY AS t(handler, queue, priority, payload, run_at, max_retries, timeout_s,
                             idempotency_key, trace_id, status, workflow_id, schedule_id, fire_time, outbox,
                             tenant, concurrency_key, concurrency_limit, rate_key, rate_limit, request_sha256,
                             scope, ord)
), claimed AS (
    INSERT INTO idempotency_keys (scope, key, request_sha256, run_id)
    SELECT scope, idempotency_key, request_sha256, id FROM input
    WHERE idempotency_key IS NOT NULL ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING run_id
), new_queues AS (
    INSERT INTO queues (name) SELECT DISTINCT queue FROM input
    ON CONFLICT (name) DO NOTHING RETURNING name, epoch
), ins AS (
    INSERT INTO runs (id, handler, queue, priority, payload, run_at, max_retries, timeout_s,
                      idempotency_key, trace_id, status, workflow_id, schedule_id, fire_time, outbox,
                      tenant, concurrency_key, concurrency_limit, rate_key, rate_limit, submitted_by)
    SELECT id, handler, queue, priority, payload, run_at, max_retries, timeout_s,
           idempotency_key, trace_id, status, workflow_id, schedule_id, fire_time, outbox,
           COALESCE(tenant, ''), concurrency_key, concurrency_limit, rate_key, rate_limit,
           CASE WHEN status = 'PENDING' THEN $20::text END
    FROM input WHERE idempotency_key IS NULL OR id IN (SELECT run_id FROM claimed)
    ORDER BY ord
    RETURNING id, status, trace_id, queue
), ev AS (  -- a run submitted PENDING is its own submitted record (021); others keep the event row (its queue: 047)
    INSERT INTO events (run_id, queue, type, to_status, version, actor, trace_id, at)
    SELECT id, queue, 'submitted', status, 0, $20, trace_id, now() FROM ins WHERE status <> 'PENDING' OR $20 IS NULL
), notify AS (
    SELECT pg_notify('fencepost_outbox', q.queue)
    FROM (SELECT DISTINCT queue FROM input WHERE outbox AND id IN (SELECT id FROM ins)) q
)
SELECT input.ord, input.id, (ins.id IS NOT NULL) AS created, NULL::text AS queue, NULL::bigint AS epoch,
       (SELECT count(*) FROM notify) AS notified
FROM input LEFT JOIN ins ON ins.id = input.id
UNION ALL
SELECT NULL, NULL, NULL, name, epoch, NULL FROM new_queues;

-- name: idempotency_lookup
-- params: scope text[], key text[]
-- returns: scope text, key text, request_sha256 text, run_id int8
-- The stored claims of ($1 scope, $2 key) pairs: the run each names and its request fingerprint.
SELECT k.scope, k.key, k.request_sha256, k.run_id
FROM idempotency_keys k JOIN unnest($1::text[], $2::text[]) AS w(scope, key) ON (k.scope, k.key) = (w.scope, w.key);

-- name: idempotency_prune
-- params: window_s float8, limit int8
-- returns: nothing
-- Keys older than the window ($1 seconds), a bounded batch at a time ($2).
WITH old AS (
    SELECT scope, key FROM idempotency_keys
    WHERE created_at < now() - make_interval(secs => $1::double precision)
    ORDER BY created_at LIMIT $2
)
DELETE FROM idempotency_keys k USING old WHERE (k.scope, k.key) = (old.scope, old.key);

-- name: audit_insert
-- params: actor text, address text, action text, queue text, target text, reason text, data jsonb
-- returns: id int8, at timestamptz
-- $1 actor, $2 address, $3 action, $4 queue, $5 target, $6 reason, $7 data (json text)
INSERT INTO audit_log (actor, address, action, queue, target, reason, data)
VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), $7::jsonb)
RETURNING id, at;

-- name: audit_list
-- params: actor text, queue text, min_at timestamptz, max_at timestamptz, limit int8, scope text[],
-- params: after_key jsonb
-- returns: source text, id int8, at timestamptz, actor text, address text, action text, queue text,
-- returns: target text, reason text, data text
-- Who did what: configuration changes and queue commands (audit_log) and commands on runs
-- (run events with an operator's actor), newest first. $1 actor (exact, or a prefix ending in ':' / '@'),
-- $2 queue, $3 since, $4 until, $5 limit, $6 queues in scope (NULL: all), $7 the cursor: only rows after
-- the key [at, id, source] (JSON; NULL: from the newest) in the order at, id, source, all descending (a
-- row of the log and an event may share at and id: the source tells them apart, 'run' first).
-- Each side is limited on its own index before they are merged, so the view never reads the events
-- operators did not make. The log is read on audit_log_at_id for every queue, and queue by queue on
-- audit_log_queue_at_id (046) for a queue or a scoped token's queues: one scan of audit_log_at_id read every
-- other queue's entry from the cursor down (issue 24: 38-70 ms deep at 1M). The log's half is read first;
-- when it fills a page, the commands older than its oldest entry cannot be on it, so the commands' half
-- stops there instead of walking every older command. The commands are read on events_operator_at for every
-- queue, and queue by queue on events_operator_queue_at for a queue or a scoped token's queues (047: a command's
-- event row carries its run's queue; before, each command's run was looked up and other queues' commands
-- walked from the cursor down, 55-227 ms deep with 20,000 commands at 1,000,000 runs). A row an older version
-- wrote without its queue and not backfilled (its run gone from both tables) shows its run's queue where known.
WITH cfg AS MATERIALIZED (SELECT * FROM (
    (SELECT 'config' AS source, a.id, a.at, a.actor, a.address, a.action, a.queue, a.target, a.reason,
            a.data::text AS data
     FROM audit_log a
     WHERE $2::text IS NULL AND $6::text[] IS NULL  -- every queue: audit_log_at_id
       AND ($1::text IS NULL OR a.actor = $1 OR (right($1, 1) IN (':', '@') AND starts_with(a.actor, $1)))
       AND ($3::timestamptz IS NULL OR a.at >= $3) AND ($4::timestamptz IS NULL OR a.at < $4)
       AND ($7::jsonb IS NULL OR (a.at <= ($7->>0)::timestamptz
            AND ((a.at, a.id) < (($7->>0)::timestamptz, ($7->>1)::bigint)
                 OR (a.at = ($7->>0)::timestamptz AND a.id = ($7->>1)::bigint AND $7->>2 = 'run'))))
     ORDER BY a.at DESC, a.id DESC LIMIT $5)
    UNION ALL
    -- a queue, or a scoped token's queues: audit_log_queue_at_id queue by queue, one range of the index from
    -- (queue, the cursor or until) down to (queue, since). The range is two row comparisons and nothing else
    -- on at: with queue = q and the cursor's at <= ..., the planner read audit_log_at_id in time order and
    -- filtered on the queue (it costs a queue's entries as scattered and guesses a queue holds half the log),
    -- reading every other queue's entry. The cursor's key [at, id, source] bounds it as (at, id) < (at, id + 1)
    -- when its source is 'run' (the log's entry of that key is still to come), else < (at, id); until as
    -- (until, lowest id), whichever is lower.
    (SELECT s.* FROM (SELECT DISTINCT unnest(CASE WHEN $2::text IS NOT NULL THEN ARRAY[$2::text] ELSE $6::text[] END)) q(queue)
     CROSS JOIN (SELECT ($7->>0)::timestamptz AS at, CASE WHEN $7->>2 = 'run' THEN LEAST(($7->>1)::bigint, 9223372036854775806) + 1
                                                         ELSE ($7->>1)::bigint END AS id) k
     CROSS JOIN LATERAL (
        SELECT 'config' AS source, a.id, a.at, a.actor, a.address, a.action, a.queue, a.target, a.reason,
               a.data::text AS data
        FROM audit_log a
        WHERE ($6::text[] IS NULL OR q.queue = ANY($6))  -- a queue out of scope: none (on q, not a: see above)
          AND (a.queue, a.at, a.id) >= (q.queue, COALESCE($3::timestamptz, '-infinity'), -9223372036854775808)
          AND (a.queue, a.at, a.id) < (q.queue, LEAST(k.at, $4::timestamptz, 'infinity'),
                                       CASE WHEN $4::timestamptz IS NOT NULL AND (k.at IS NULL OR $4::timestamptz <= k.at)
                                            THEN -9223372036854775808 ELSE COALESCE(k.id, 9223372036854775807) END)
          AND ($1::text IS NULL OR a.actor = $1 OR (right($1, 1) IN (':', '@') AND starts_with(a.actor, $1)))
        ORDER BY a.queue DESC, a.at DESC, a.id DESC LIMIT $5) s)
) c ORDER BY at DESC, id DESC LIMIT $5
), floor AS (
    SELECT CASE WHEN count(*) >= $5 THEN min(at) END AS at FROM cfg
)
SELECT * FROM (
    SELECT * FROM cfg
    UNION ALL
    (SELECT ev.* FROM floor f CROSS JOIN LATERAL (  -- every queue: events_operator_at
     SELECT 'run' AS source, e.id, e.at, e.actor, NULL::text, e.type, q.queue, e.run_id::text, e.reason,
            json_build_object('from', e.from_status, 'to', e.to_status, 'version', e.version)::text
     FROM events e
     CROSS JOIN LATERAL (SELECT COALESCE(e.queue, (SELECT r.queue FROM runs r WHERE r.id = e.run_id),
                                         (SELECT ra.queue FROM runs_archive ra WHERE ra.id = e.run_id LIMIT 1)) AS queue) q
     WHERE $2::text IS NULL AND $6::text[] IS NULL
       AND e.run_id IS NOT NULL AND e.actor IS NOT NULL AND e.type <> 'submitted'
       AND e.actor NOT IN ('worker', 'recorder', 'reconciler', 'trigger')
       AND e.at >= COALESCE(f.at, $3, '-infinity')
       AND ($1::text IS NULL OR e.actor = $1 OR (right($1, 1) IN (':', '@') AND starts_with(e.actor, $1)))
       AND ($3::timestamptz IS NULL OR e.at >= $3) AND ($4::timestamptz IS NULL OR e.at < $4)
       AND ($7::jsonb IS NULL OR (e.at <= ($7->>0)::timestamptz
            AND (e.at, e.id) < (($7->>0)::timestamptz, ($7->>1)::bigint)))
     ORDER BY e.at DESC, e.id DESC LIMIT $5) ev)
    UNION ALL
    -- a queue, or a scoped token's queues: events_operator_queue_at (047: a command's row carries its run's
    -- queue) queue by queue, one range from (queue, the cursor or until) down to (queue, the floor or since),
    -- bounded by row comparisons as the log's half is
    (SELECT ev.* FROM floor f
     CROSS JOIN (SELECT DISTINCT unnest(CASE WHEN $2::text IS NOT NULL THEN ARRAY[$2::text] ELSE $6::text[] END)) q(queue)
     CROSS JOIN LATERAL (
        SELECT 'run' AS source, e.id, e.at, e.actor, NULL::text, e.type, e.queue, e.run_id::text, e.reason,
               json_build_object('from', e.from_status, 'to', e.to_status, 'version', e.version)::text
        FROM events e
        WHERE ($6::text[] IS NULL OR q.queue = ANY($6))
          AND e.run_id IS NOT NULL AND e.actor IS NOT NULL AND e.type <> 'submitted'
          AND e.actor NOT IN ('worker', 'recorder', 'reconciler', 'trigger')
          AND (e.queue, e.at, e.id) <= (q.queue, LEAST(($7->>0)::timestamptz, $4::timestamptz, 'infinity'), 9223372036854775807)
          AND (e.queue, e.at, e.id) >= (q.queue, GREATEST(f.at, $3::timestamptz, '-infinity'), -9223372036854775808)
          AND ($1::text IS NULL OR e.actor = $1 OR (right($1, 1) IN (':', '@') AND starts_with(e.actor, $1)))
          AND ($4::timestamptz IS NULL OR e.at < $4)
          AND ($7::jsonb IS NULL OR (e.at, e.id) < (($7->>0)::timestamptz, ($7->>1)::bigint))
        ORDER BY e.queue DESC, e.at DESC, e.id DESC LIMIT $5) ev)
    UNION ALL
    -- and the commands whose row carries no queue, through their run (events_queue_unknown: about empty)
    (SELECT ev.* FROM floor f CROSS JOIN LATERAL (
        SELECT 'run' AS source, e.id, e.at, e.actor, NULL::text, e.type, q.queue, e.run_id::text, e.reason,
               json_build_object('from', e.from_status, 'to', e.to_status, 'version', e.version)::text
        FROM events e
        CROSS JOIN LATERAL (SELECT COALESCE((SELECT r.queue FROM runs r WHERE r.id = e.run_id),
                                            (SELECT ra.queue FROM runs_archive ra WHERE ra.id = e.run_id LIMIT 1)) AS queue) q
        WHERE ($2::text IS NOT NULL OR $6::text[] IS NOT NULL) AND e.queue IS NULL AND e.run_id IS NOT NULL
          AND e.actor IS NOT NULL AND e.type <> 'submitted' AND e.actor NOT IN ('worker', 'recorder', 'reconciler', 'trigger')
          AND e.at >= COALESCE(f.at, $3, '-infinity')
          AND ($1::text IS NULL OR e.actor = $1 OR (right($1, 1) IN (':', '@') AND starts_with(e.actor, $1)))
          AND ($2::text IS NULL OR q.queue = $2) AND ($6::text[] IS NULL OR q.queue = ANY($6))
          AND ($3::timestamptz IS NULL OR e.at >= $3) AND ($4::timestamptz IS NULL OR e.at < $4)
          AND ($7::jsonb IS NULL OR (e.at <= ($7->>0)::timestamptz
               AND (e.at, e.id) < (($7->>0)::timestamptz, ($7->>1)::bigint)))
        ORDER BY e.at DESC, e.id DESC LIMIT $5) ev)
) x
ORDER BY at DESC, id DESC, source DESC LIMIT $5;

-- name: bulk_select
-- params: queue text, status text, handler text, max_id int8, limit int8
-- returns: id int8
-- The runs a bulk command would act on: $1 queue, $2 status, $3 handler, $4 only ids <= this
-- (the bound the count was made with; NULL: none), $5 at most this many, lowest ids first.
SELECT id FROM runs
WHERE queue = $1 AND ($2::text IS NULL OR status = $2) AND ($3::text IS NULL OR handler = $3)
  AND ($4::bigint IS NULL OR id <= $4)
ORDER BY id LIMIT $5;

-- name: bulk_count
-- params: queue text, status text, handler text, max_id int8
-- returns: matched int8, until_id int8
-- How many runs match, and the highest matching id (the snapshot bound a confirm refers to).
SELECT count(*) AS matched, max(id) AS until_id FROM runs
WHERE queue = $1 AND ($2::text IS NULL OR status = $2) AND ($3::text IS NULL OR handler = $3)
  AND ($4::bigint IS NULL OR id <= $4);

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

-- name: api_token_list_scoped
-- params: scope text[]
-- returns: id int8, name text, role text, queues text[], created_by text, created_at timestamptz,
-- returns: revoked_at timestamptz, last_used_at timestamptz, expires_at timestamptz
-- Tokens a caller may see: all (NULL), or those scoped within $1's queues.
SELECT id, name, role, queues, created_by, created_at, revoked_at, last_used_at, expires_at
FROM api_tokens
WHERE $1::text[] IS NULL OR (cardinality(queues) > 0 AND queues <@ $1::text[])
ORDER BY id;

-- name: api_token_get
-- params: id int8
-- returns: id int8, name text, role text, queues text[], created_by text, created_at timestamptz,
-- returns: revoked_at timestamptz, last_used_at timestamptz, expires_at timestamptz
SELECT id, name, role, queues, created_by, created_at, revoked_at, last_used_at, expires_at
FROM api_tokens WHERE id = $1;
