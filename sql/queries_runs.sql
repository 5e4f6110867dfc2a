-- Named queries: Runs: the submit (insert, idempotency), the current-state projection, its listings, selections and
-- the outbox relay.
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: insert_runs
-- params: handler text[], queue text[], priority int2[], payload bytea[], run_at timestamptz[],
-- params: max_retries int4[], timeout_s float8[], idempotency_key text[], trace_id text[], status text[],
-- params: workflow_id uuid[], schedule_id int8[], fire_time timestamptz[], outbox bool[], tenant text[],
-- params: concurrency_key text[], concurrency_limit int4[], rate_key text[], rate_limit text[], actor text
-- returns: ord int8, id int8, created bool, queue text, epoch int8, notified int8
-- One round trip per batch: creates queues on first use, inserts the runs (skipping
-- idempotency keys and schedule fires that exist): a run submitted PENDING is its own submitted
-- record (submitted_by, created_at: 021); any other gets its submitted event row.
-- Returns one row per input (ord, id, created) and one per queue created.
-- $15-$19 (tenant, concurrency key, limit, rate key, rate) may be empty arrays when no run of
-- the batch has them: multi-argument unnest pads a shorter array with NULLs.
WITH input AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('runs', 'id'))::regclass) AS id, t.*
    FROM unnest($1::text[], $2::text[], $3::smallint[], $4::bytea[], $5::timestamptz[],
                $6::integer[], $7::double precision[], $8::text[], $9::text[], $10::text[],
                $11::uuid[], $12::bigint[], $13::timestamptz[], $14::boolean[], $15::text[], $16::text[],
                $17::integer[], $18::text[], $19::text[])
        WITH ORDINALITY AS t(handler, queue, priority, payload, run_at, max_retries, timeout_s,
                             idempotency_key, trace_id, status, workflow_id, schedule_id, fire_time, outbox,
                             tenant, concurrency_key, concurrency_limit, rate_key, rate_limit, ord)
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
    FROM input ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING id, status, trace_id, queue
), ev AS (  -- a run submitted PENDING is its own submitted record (021); others keep the event row (its queue: 047)
    INSERT INTO events (run_id, queue, type, to_status, version, actor, trace_id, at)
    SELECT id, queue, 'submitted', status, 0, $20, trace_id, now() FROM ins WHERE status <> 'PENDING' OR $20 IS NULL
), notify AS (
    SELECT pg_notify('fencepost_outbox', q.queue)
    FROM (SELECT DISTINCT queue FROM input WHERE outbox) q
)
SELECT input.ord, input.id, (ins.id IS NOT NULL) AS created, NULL::text AS queue, NULL::bigint AS epoch,
       (SELECT count(*) FROM notify) AS notified
FROM input LEFT JOIN ins ON ins.id = input.id
UNION ALL
SELECT NULL, NULL, NULL, name, epoch, NULL FROM new_queues;

-- name: insert_runs_fresh
-- params: payload bytea[], trace_id text[], handler text[], queue text[], priority int2[],
-- params: run_at timestamptz[], max_retries int4[], timeout_s float8[], status text[], workflow_id uuid[],
-- params: tenant text[], concurrency_key text[], concurrency_limit int4[], rate_key text[],
-- params: rate_limit text[], every_handler text, every_queue text, every_priority int2,
-- params: every_run_at timestamptz, every_max_retries int4, every_timeout_s float8, every_status text,
-- params: every_workflow_id uuid, every_tenant text, every_concurrency_key text,
-- params: every_concurrency_limit int4, every_rate_key text, every_rate_limit text, actor text
-- returns: ord int8, id int8, queue text, epoch int8
-- insert_runs for a batch the client submits with no idempotency key, schedule fire or outbox
-- row: nothing can conflict (ids come from the sequence), so no ON CONFLICT (its speculative
-- insertion into every unique index), no sort, no join with what was inserted and no notify.
-- The same rows as insert_runs: the runs and their queues on first use (a PENDING run is its own
-- submitted record, 021; any other gets its 'submitted' event row).
-- $1 payloads and $2 traceparents, one per run. Every other column comes as an array ($3-$15)
-- or, when the whole batch shares one value, as an empty array and that value ($16-$28): a bulk
-- submit of one handler sends two arrays, not fourteen. $29 the actor.
-- Returns one row per input (ord, id) and one per queue created (NULL, NULL, queue, epoch).
WITH input AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('runs', 'id'))::regclass) AS id, t.ord,
           COALESCE(t.handler, $16) AS handler, COALESCE(t.queue, $17) AS queue,
           COALESCE(t.priority, $18) AS priority, t.payload, COALESCE(t.run_at, $19) AS run_at,
           COALESCE(t.max_retries, $20) AS max_retries, COALESCE(t.timeout_s, $21) AS timeout_s,
           t.trace_id, COALESCE(t.status, $22) AS status, COALESCE(t.workflow_id, $23) AS workflow_id,
           COALESCE(t.tenant, $24, '') AS tenant, COALESCE(t.concurrency_key, $25) AS concurrency_key,
           COALESCE(t.concurrency_limit, $26) AS concurrency_limit, COALESCE(t.rate_key, $27) AS rate_key,
           COALESCE(t.rate_limit, $28) AS rate_limit
    FROM unnest($1::bytea[], $2::text[], $3::text[], $4::text[], $5::smallint[], $6::timestamptz[],
                $7::integer[], $8::double precision[], $9::text[], $10::uuid[], $11::text[], $12::text[],
                $13::integer[], $14::text[], $15::text[])
        WITH ORDINALITY AS t(payload, trace_id, handler, queue, priority, run_at, max_retries, timeout_s,
                             status, workflow_id, tenant, concurrency_key, concurrency_limit, rate_key,
                             rate_limit, ord)
), new_queues AS (
    INSERT INTO queues (name) SELECT DISTINCT queue FROM input
    ON CONFLICT (name) DO NOTHING RETURNING name, epoch
), ins AS (
    INSERT INTO runs (id, handler, queue, priority, payload, run_at, max_retries, timeout_s, trace_id, status,
                      workflow_id, outbox, tenant, concurrency_key, concurrency_limit, rate_key, rate_limit,
                      submitted_by)
    SELECT id, handler, queue, priority, payload, run_at, max_retries, timeout_s, trace_id, status,
           workflow_id, false, tenant, concurrency_key, concurrency_limit, rate_key, rate_limit,
           CASE WHEN status = 'PENDING' THEN $29::text END
    FROM input
), ev AS (  -- a run submitted PENDING is its own submitted record (021); others keep the event row (its queue: 047)
    INSERT INTO events (run_id, queue, type, to_status, version, actor, trace_id, at)
    SELECT id, queue, 'submitted', status, 0, $29, trace_id, now() FROM input WHERE status <> 'PENDING' OR $29 IS NULL
)
SELECT ord, id, NULL::text AS queue, NULL::bigint AS epoch FROM input
UNION ALL
SELECT NULL, NULL, name, epoch FROM new_queues;

-- name: runs_by_fire
-- params: schedule_id int8[], fire_time timestamptz[]
-- returns: id int8, schedule_id int8, fire_time timestamptz
SELECT id, schedule_id, fire_time FROM runs
WHERE (schedule_id, fire_time) IN (SELECT * FROM unnest($1::bigint[], $2::timestamptz[]));

-- name: get_run
-- params: id int8
-- returns: id int8, handler text, queue text, status text, priority int2, payload bytea, run_at timestamptz,
-- returns: attempt int4, max_retries int4, timeout_s float8, idempotency_key text, lease_owner text,
-- returns: lease_expires_at timestamptz, token int8, version int8, gen int4, created_at timestamptz,
-- returns: updated_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error text,
-- returns: last_error_class text, reason text, result bytea, workflow_id uuid, schedule_id int8,
-- returns: fire_time timestamptz, trace_id text, pause_requested bool, stop_requested bool,
-- returns: cancel_requested bool, forced bool, needs_compensation bool, outbox bool, tenant text,
-- returns: concurrency_key text, concurrency_limit int4, rate_key text, rate_limit text, submitted_by text
-- The hot row, else the archived one (finished runs leave `runs` after FENCEPOST_ARCHIVE_AFTER).
-- LIMIT 1 stops the Append after the first branch that has the run: a hot run never
-- touches the archive. Operator commands read only `runs` (get_hot_run).
(SELECT * FROM runs WHERE id = $1) UNION ALL (SELECT * FROM runs_archive WHERE id = $1) LIMIT 1;

-- name: run_status
-- params: id int8[]
-- returns: id int8, status text, result bytea, last_error text, last_error_class text
SELECT id, status, result, last_error, last_error_class FROM runs WHERE id = ANY($1::bigint[]);

-- name: list_runs
-- params: queue text, status text, handler text, limit int8
-- returns: id int8, handler text, queue text, status text, priority int2, attempt int4, run_at timestamptz,
-- returns: created_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: last_error text, reason text
SELECT id, handler, queue, status, priority, attempt, run_at, created_at, started_at, finished_at, last_error_class, last_error, reason
FROM runs
WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR status = $2) AND ($3::text IS NULL OR handler = $3)
ORDER BY id DESC LIMIT $4;

-- name: dead_letter
-- params: queue text, limit int8
-- returns: id int8, handler text, queue text, status text, attempt int4, finished_at timestamptz,
-- returns: last_error_class text, last_error text, reason text
SELECT id, handler, queue, status, attempt, finished_at, last_error_class, last_error, reason
FROM runs WHERE status IN ('FAILED', 'TIMED_OUT') AND reason IS DISTINCT FROM 'review'
  AND ($1::text IS NULL OR queue = $1)
ORDER BY finished_at DESC LIMIT $2;

-- name: apply_runs
-- params: id int8[], status text[], version int8[], attempt int4[], token int8[], worker_id text[],
-- params: lease timestamptz[], started_at timestamptz[], finished_at timestamptz[], run_at timestamptz[],
-- params: error_message text[], error_class text[], reason text[], result bytea[], at timestamptz[],
-- params: ctl text[], forced bool[], gen int4[]
-- returns: nothing
-- The run projection: one row per run per batch (the recorder folds events first);
-- guarded by version so a replayed or reordered batch never moves a run backwards.
UPDATE runs r SET
    status = u.status,
    version = u.version,
    attempt = COALESCE(u.attempt, r.attempt),
    token = COALESCE(u.token, r.token),
    lease_owner = CASE WHEN u.status IN ('RUNNING', 'STOPPING') THEN COALESCE(u.worker_id, r.lease_owner) END,
    lease_expires_at = CASE WHEN u.status IN ('RUNNING', 'STOPPING') THEN COALESCE(u.lease, r.lease_expires_at) END,
    started_at = COALESCE(u.started_at, r.started_at),
    finished_at = CASE WHEN u.status IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'STOPPED')
                       THEN COALESCE(u.finished_at, r.finished_at, u.at) END,
    run_at = COALESCE(u.run_at, r.run_at),
    last_error = COALESCE(u.error_message, r.last_error),
    last_error_class = COALESCE(u.error_class, r.last_error_class),
    reason = COALESCE(u.reason, r.reason),
    result = CASE WHEN u.status = 'SUCCEEDED' THEN u.result END,
    pause_requested = u.status = 'RUNNING'
        AND COALESCE(u.ctl, CASE WHEN r.pause_requested THEN 'pause' END) IS NOT DISTINCT FROM 'pause',
    stop_requested = u.status = 'STOPPING'
        AND COALESCE(u.ctl, CASE WHEN r.cancel_requested THEN 'cancel' ELSE 'stop' END) IS NOT DISTINCT FROM 'stop',
    cancel_requested = u.status = 'STOPPING'
        AND COALESCE(u.ctl, CASE WHEN r.cancel_requested THEN 'cancel' END) IS NOT DISTINCT FROM 'cancel',
    gen = COALESCE(u.gen, r.gen),
    forced = CASE WHEN u.status IN ('STOPPED', 'CANCELLED') THEN COALESCE(u.forced, false)
                  WHEN u.status = 'PENDING' THEN false ELSE r.forced END,
    updated_at = now()
FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::integer[], $5::bigint[], $6::text[],
            $7::timestamptz[], $8::timestamptz[], $9::timestamptz[], $10::timestamptz[], $11::text[],
            $12::text[], $13::text[], $14::bytea[], $15::timestamptz[], $16::text[], $17::boolean[],
            $18::integer[])
     AS u(id, status, version, attempt, token, worker_id, lease, started_at, finished_at, run_at,
          error_message, error_class, reason, result, at, ctl, forced, gen)
WHERE r.id = u.id AND r.version < u.version;

-- name: outbox_runs
-- params: queue text, limit int8
-- returns: id int8, handler text, status text, priority int2, payload bytea, run_at timestamptz,
-- returns: attempt int4, max_retries int4, timeout_s float8, fire_time timestamptz, trace_id text,
-- returns: version int8, token int8, lease_owner text, gen int4, tenant text, concurrency_key text,
-- returns: concurrency_limit int4, rate_key text, rate_limit text
SELECT id, handler, status, priority, payload, run_at, attempt, max_retries, timeout_s,
       fire_time, trace_id, version, token, lease_owner, gen, tenant, concurrency_key, concurrency_limit,
       rate_key, rate_limit
FROM runs WHERE outbox AND queue = $1 ORDER BY id LIMIT $2;

-- name: outbox_queues
-- params: none
-- returns: queue text
SELECT DISTINCT queue FROM runs WHERE outbox;

-- name: clear_outbox
-- params: id int8[]
-- returns: nothing
UPDATE runs SET outbox = false WHERE id = ANY($1::bigint[]) AND outbox;

-- name: api_submitted_by
-- params: run_id int8
-- returns: actor text
SELECT actor FROM history WHERE run_id = $1 AND type = 'submitted' ORDER BY id LIMIT 1;  -- row or event (021)

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

-- Named queries of a large submit_many (fencepost/client.py): one transaction per call, and the
-- answer to "did it commit?" when the connection is lost during COMMIT (issue 22 item 9).
-- name: batch_txid
-- params: none
-- returns: txid int8
-- The batch's transaction id, taken inside it before any insert.
SELECT txid_current() AS txid;

-- name: batch_txid_status
-- params: p1 int8
-- returns: status text
-- 'committed', 'aborted' or 'in progress' (NULL: too old to say). A transaction in progress when
-- the server crashed reads 'aborted' after the restart.
SELECT txid_status($1::bigint) AS status;

-- name: bulk_candidates
-- params: queue text, status text, handler text, max_id int8, limit int8
-- returns: id int8, status text, version int8
-- The runs a bulk count selects: $1 queue, $2 status, $3 handler, $4 only ids <= this (NULL: none),
-- $5 at most this many, lowest ids first; with their recorded state and version.
SELECT id, status, version FROM runs
WHERE queue = $1 AND ($2::text IS NULL OR status = $2) AND ($3::text IS NULL OR handler = $3)
  AND ($4::bigint IS NULL OR id <= $4)
ORDER BY id LIMIT $5;

-- name: bulk_live_rows
-- params: id int8[]
-- returns: id int8, status text, version int8
-- The recorded state and version of these runs ($1 ids), for those Redis no longer holds.
SELECT id, status, version FROM runs WHERE id = ANY($1::bigint[]);

-- name: get_hot_run
-- params: id int8
-- returns: id int8, handler text, queue text, status text, priority int2, payload bytea, run_at timestamptz,
-- returns: attempt int4, max_retries int4, timeout_s float8, idempotency_key text, lease_owner text,
-- returns: lease_expires_at timestamptz, token int8, version int8, gen int4, created_at timestamptz,
-- returns: updated_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error text,
-- returns: last_error_class text, reason text, result bytea, workflow_id uuid, schedule_id int8,
-- returns: fire_time timestamptz, trace_id text, pause_requested bool, stop_requested bool,
-- returns: cancel_requested bool, forced bool, needs_compensation bool, outbox bool, tenant text,
-- returns: concurrency_key text, concurrency_limit int4, rate_key text, rate_limit text, submitted_by text
-- A run that commands may act on: only the hot table. An archived run is history; putting
-- it back in Redis would run it with no row left to record into.
SELECT * FROM runs WHERE id = $1;

-- name: review_queue
-- params: queue text, limit int8
-- returns: id int8, handler text, queue text, attempt int4, finished_at timestamptz, last_error_class text,
-- returns: last_error text
SELECT id, handler, queue, attempt, finished_at, last_error_class, last_error
FROM runs WHERE status = 'FAILED' AND reason = 'review' AND ($1::text IS NULL OR queue = $1)
ORDER BY finished_at DESC LIMIT $2;

-- name: dashboard_runs
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: limit int8, queue_2 text[], submitted_by text, max_id int8, id int8, tenant text,
-- params: concurrency_key text, idempotency_key text, p14 text, p15 text, p16 text, offset int8, min_id int8
-- returns: id int8, handler text, queue text, status text, priority int2, attempt int4, run_at timestamptz,
-- returns: created_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: last_error text, reason text, version int8, workflow_id uuid, schedule_id int8
-- The runs list: every filter optional (NULL: any). $1 queue, $2 status, $3 handler, $4 created at or
-- after, $5 created before, $6 limit, $7 queues in scope (NULL: all), $8 submitted by this actor prefix
-- (NULL: anyone), $9 before id (keyset, id order only), $10 id, $11 tenant, $12 concurrency key,
-- $13 idempotency key, $14 argument substring (bytes of a string argument, as msgpack stores it),
-- $15 sort column (id, created_at, finished_at, attempt, handler, status), $16 'asc' / 'desc', $17 offset,
-- $18 the argument search looks only at ids above this (the newest runs: a bounded scan, not the table).
SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
       r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
FROM runs r
WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
  AND ($3::text IS NULL OR r.handler = $3)
  AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
  AND ($7::text[] IS NULL OR r.queue = ANY($7))
  AND ($8::text IS NULL OR r.submitted_by = $8 OR r.submitted_by LIKE $8 || '@%'  -- the run row (021) or
       OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id  -- its event row
                  AND (e.actor = $8 OR e.actor LIKE $8 || '@%')))
  AND ($9::bigint IS NULL OR r.id < $9)
  AND ($10::bigint IS NULL OR r.id = $10)
  AND ($11::text IS NULL OR r.tenant = $11)
  AND ($12::text IS NULL OR r.concurrency_key = $12)
  AND ($13::text IS NULL OR r.idempotency_key = $13)
  AND ($14::text IS NULL OR (r.id > $18 AND position(convert_to($14, 'UTF8') IN r.payload) > 0))
ORDER BY
  -- created_at is never NULL: its default null order lets runs_created_page serve both directions
  CASE WHEN $16 = 'asc' AND $15 = 'created_at' THEN r.created_at END ASC,
  CASE WHEN $16 = 'desc' AND $15 = 'created_at' THEN r.created_at END DESC,
  CASE WHEN $16 = 'asc' AND $15 = 'finished_at' THEN r.finished_at END ASC NULLS LAST,
  CASE WHEN $16 = 'desc' AND $15 = 'finished_at' THEN r.finished_at END DESC NULLS LAST,
  CASE WHEN $16 = 'asc' THEN CASE $15 WHEN 'handler' THEN r.handler WHEN 'status' THEN r.status END END ASC,
  CASE WHEN $16 = 'desc' THEN CASE $15 WHEN 'handler' THEN r.handler WHEN 'status' THEN r.status END END DESC,
  CASE WHEN $16 = 'asc' AND $15 = 'attempt' THEN r.attempt END ASC,
  CASE WHEN $16 = 'desc' AND $15 = 'attempt' THEN r.attempt END DESC,
  CASE WHEN $16 = 'asc' THEN r.id END ASC,
  r.id DESC
LIMIT $6 OFFSET $17;

-- name: dashboard_runs_count
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: queue_2 text[], submitted_by text, max_id int8, id int8, tenant text, concurrency_key text,
-- params: idempotency_key text, p13 text, limit int8, min_id int8
-- returns: n int8
-- How many runs the filters of dashboard_runs match, counted up to a bound (the page says "more than N"
-- rather than scan a huge table for an exact figure). $1 queue, $2 status, $3 handler, $4 since, $5 until,
-- $6 queues in scope, $7 submitter prefix, $8 before id, $9 id, $10 tenant, $11 concurrency key,
-- $12 idempotency key, $13 argument substring, $14 the bound, $15 the argument search's lowest id (exclusive).
SELECT count(*) AS n FROM (
  SELECT 1 FROM runs r
  WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
    AND ($3::text IS NULL OR r.handler = $3)
    AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
    AND ($6::text[] IS NULL OR r.queue = ANY($6))
    AND ($7::text IS NULL OR r.submitted_by = $7 OR r.submitted_by LIKE $7 || '@%'  -- the run row (021) or
         OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id  -- its event row
                    AND (e.actor = $7 OR e.actor LIKE $7 || '@%')))
    AND ($8::bigint IS NULL OR r.id < $8)
    AND ($9::bigint IS NULL OR r.id = $9)
    AND ($10::text IS NULL OR r.tenant = $10)
    AND ($11::text IS NULL OR r.concurrency_key = $11)
    AND ($12::text IS NULL OR r.idempotency_key = $12)
    AND ($13::text IS NULL OR (r.id > $15 AND position(convert_to($13, 'UTF8') IN r.payload) > 0))
  LIMIT $14
) m;

-- name: runs_max_id
-- params: none
-- returns: id int8
SELECT COALESCE(max(id), 0) AS id FROM runs;

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

-- Named queries of the API's listings that filter by the caller's scope before they limit and
-- page with keyset cursors (issue 24 item 3): the dead letter and the review queue.
-- name: api_dead_letter_page
-- params: queue text, scope text[], limit int8, after_finished_at timestamptz, after_id int8, review bool
-- returns: id int8, handler text, queue text, status text, attempt int4, priority int2, version int8,
-- returns: run_at timestamptz, created_at timestamptz, started_at timestamptz, finished_at timestamptz,
-- returns: last_error_class text, last_error text, reason text, workflow_id uuid, schedule_id int8
-- Dead-lettered runs (FAILED / TIMED_OUT, not in review), newest finished first. $1 queue (NULL: any),
-- $2 queues in scope (NULL: all), $3 limit, $4/$5 the cursor: only rows after (finished_at, id)
-- in this order (NULL: from the start), $6 review (true: the review queue instead).
SELECT id, handler, queue, status, attempt, priority, version, run_at, created_at, started_at, finished_at,
       last_error_class, last_error, reason, workflow_id, schedule_id
FROM runs
WHERE status IN ('FAILED', 'TIMED_OUT')
  AND (CASE WHEN $6::boolean THEN status = 'FAILED' AND reason = 'review' ELSE reason IS DISTINCT FROM 'review' END)
  AND ($1::text IS NULL OR queue = $1)
  AND ($2::text[] IS NULL OR queue = ANY($2))
  AND ($4::timestamptz IS NULL OR (finished_at, id) < ($4, $5::bigint))
ORDER BY finished_at DESC, id DESC
LIMIT $3;

-- The runs list by keyset cursor (issue 24): the filters of dashboard_runs (above in this file; same
-- $1-$17 except $17, which is the argument search's lowest id here, and no offset), then only rows after
-- the cursor in the page's order. $15 sort, $16 'asc' / 'desc', $18 a cursor is given, then its key. Two statements, so that each prepared plan serves sorts of
-- one kind: a custom plan folds the CASEs to one row comparison and one ORDER BY, which an index serves
-- for id and created_at (runs_pkey, runs_created_page, runs_queue_created_page); a plan cached generic
-- after sorts no index serves would make those slow too if they shared it.

-- name: api_runs_page_indexed
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: limit int8, scope text[], submitted_by text, max_id int8, id int8, tenant text, concurrency_key text,
-- params: idempotency_key text, arg text, sort text, sort_order text, arg_min_id int8, has_cursor bool,
-- params: after_created_at timestamptz, after_id int8
-- returns: id int8, handler text, queue text, status text, priority int2, attempt int4, run_at timestamptz,
-- returns: created_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: last_error text, reason text, version int8, workflow_id uuid, schedule_id int8
-- Sorts an index serves: id, created_at (never NULL); $19 the cursor's created_at, $20 its id.
SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
       r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
FROM runs r
WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
  AND ($3::text IS NULL OR r.handler = $3)
  AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
  AND ($7::text[] IS NULL OR r.queue = ANY($7))
  AND ($8::text IS NULL OR r.submitted_by = $8 OR r.submitted_by LIKE $8 || '@%'
       OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                  AND (e.actor = $8 OR e.actor LIKE $8 || '@%')))
  AND ($9::bigint IS NULL OR r.id < $9)
  AND ($10::bigint IS NULL OR r.id = $10)
  AND ($11::text IS NULL OR r.tenant = $11)
  AND ($12::text IS NULL OR r.concurrency_key = $12)
  AND ($13::text IS NULL OR r.idempotency_key = $13)
  AND ($14::text IS NULL OR (r.id > $17 AND position(convert_to($14, 'UTF8') IN r.payload) > 0))
  AND (NOT $18::boolean OR CASE
        WHEN $15 = 'id' AND $16 = 'asc' THEN r.id > $20::bigint
        WHEN $15 = 'id' THEN r.id < $20::bigint
        WHEN $16 = 'asc' THEN (r.created_at, r.id) > ($19::timestamptz, $20::bigint)
        ELSE (r.created_at, r.id) < ($19::timestamptz, $20::bigint) END)
ORDER BY
  CASE WHEN $16 = 'asc' AND $15 = 'created_at' THEN r.created_at END ASC,
  CASE WHEN $16 = 'desc' AND $15 = 'created_at' THEN r.created_at END DESC,
  CASE WHEN $16 = 'asc' THEN r.id END ASC,
  r.id DESC
LIMIT $6;

-- name: api_runs_page_finished
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: limit int8, scope text[], submitted_by text, max_id int8, id int8, tenant text, concurrency_key text,
-- params: idempotency_key text, arg text, sort_order text, arg_min_id int8, has_cursor bool,
-- params: after_finished_at timestamptz, after_id int8
-- returns: id int8, handler text, queue text, status text, priority int2, attempt int4, run_at timestamptz,
-- returns: created_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: last_error text, reason text, version int8, workflow_id uuid, schedule_id int8
-- The sort by finish time, NULL (unfinished) last in both orders, ties by id in the same direction: the
-- finished runs and the unfinished ones as two ranges of runs_finished_page (038), each limited, then
-- merged. As api_runs_page_indexed but $15 'asc' / 'desc', $16 the argument search's lowest id, $17 a cursor
-- is given, $18 its finished_at (NULL: the cursor is in the unfinished tail), $19 its id.
SELECT * FROM (
    (SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
           r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
    FROM runs r
    WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
      AND ($3::text IS NULL OR r.handler = $3)
      AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
      AND ($7::text[] IS NULL OR r.queue = ANY($7))
      AND ($8::text IS NULL OR r.submitted_by = $8 OR r.submitted_by LIKE $8 || '@%'
           OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                      AND (e.actor = $8 OR e.actor LIKE $8 || '@%')))
      AND ($9::bigint IS NULL OR r.id < $9)
      AND ($10::bigint IS NULL OR r.id = $10)
      AND ($11::text IS NULL OR r.tenant = $11)
      AND ($12::text IS NULL OR r.concurrency_key = $12)
      AND ($13::text IS NULL OR r.idempotency_key = $13)
      AND ($14::text IS NULL OR (r.id > $16 AND position(convert_to($14, 'UTF8') IN r.payload) > 0))
      AND r.finished_at IS NOT NULL
      AND (NOT $17::boolean OR ($18::timestamptz IS NOT NULL AND CASE WHEN $15 = 'asc'
           THEN (r.finished_at, r.id) > ($18, $19::bigint) ELSE (r.finished_at, r.id) < ($18, $19::bigint) END))
    ORDER BY CASE WHEN $15 = 'asc' THEN r.finished_at END ASC, CASE WHEN $15 = 'desc' THEN r.finished_at END DESC,
             CASE WHEN $15 = 'asc' THEN r.id END ASC, r.id DESC
    LIMIT $6)
    UNION ALL
    (SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
           r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
    FROM runs r
    WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
      AND ($3::text IS NULL OR r.handler = $3)
      AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
      AND ($7::text[] IS NULL OR r.queue = ANY($7))
      AND ($8::text IS NULL OR r.submitted_by = $8 OR r.submitted_by LIKE $8 || '@%'
           OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                      AND (e.actor = $8 OR e.actor LIKE $8 || '@%')))
      AND ($9::bigint IS NULL OR r.id < $9)
      AND ($10::bigint IS NULL OR r.id = $10)
      AND ($11::text IS NULL OR r.tenant = $11)
      AND ($12::text IS NULL OR r.concurrency_key = $12)
      AND ($13::text IS NULL OR r.idempotency_key = $13)
      AND ($14::text IS NULL OR (r.id > $16 AND position(convert_to($14, 'UTF8') IN r.payload) > 0))
      AND r.finished_at IS NULL
      AND (NOT $17::boolean OR $18::timestamptz IS NOT NULL OR CASE WHEN $15 = 'asc' THEN r.id > $19::bigint
           ELSE r.id < $19::bigint END)
    -- by finished_at too (all NULL): the order of runs_finished_page's NULL range, read in either direction
    ORDER BY CASE WHEN $15 = 'asc' THEN r.finished_at END ASC, CASE WHEN $15 = 'desc' THEN r.finished_at END DESC,
             CASE WHEN $15 = 'asc' THEN r.id END ASC, r.id DESC
    LIMIT $6)
) p
ORDER BY finished_at IS NULL, CASE WHEN $15 = 'asc' THEN finished_at END ASC,
         CASE WHEN $15 = 'desc' THEN finished_at END DESC, CASE WHEN $15 = 'asc' THEN id END ASC, id DESC
LIMIT $6;

-- name: api_runs_page_by_queue
-- params: queues text[], statuses text[], handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: limit int8, submitted_by text, max_id int8, id int8, tenant text, concurrency_key text,
-- params: idempotency_key text, arg text, arg_min_id int8, sort text, sort_order text, has_cursor bool,
-- params: after_status text, after_id int8, offset int8
-- returns: id int8, handler text, queue text, status text, priority int2, attempt int4, run_at timestamptz,
-- returns: created_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: last_error text, reason text, version int8, workflow_id uuid, schedule_id int8
-- The runs list within a set of queues (a queue filter, or a scoped token's queues), sorted by id or by
-- status then id (issue 24): one range of runs_queue_status (queue, status, id) per queue and state, each
-- read in id order and limited, then merged. At most queues x states x limit index entries, whatever the
-- queues hold: the plain filter read every run of the queue and sorted them (30,000 of `payments`, 25 ms), or
-- walked the primary key past every newer run of other queues (100,000 for queue+status, 22 ms).
-- $1 the queues, $2 the states (a status filter: one), $3-$5 handler and creation time, $6 limit,
-- $7 submitter prefix, $8 below this id, $9 id, $10-$12 tenant, concurrency and idempotency key, $13 argument
-- substring above id $14, $15 'id' or 'status', $16 'asc' / 'desc', $17 a cursor is given, then its
-- status ($18, status sort) and id ($19), or $20 rows to skip (the dashboard's offset pages: each range
-- then reads up to limit + offset ids). Each range gets its id bounds here, so they are index conditions;
-- the ranges read ids (index-only where no other filter needs the row), the page's rows are read by id.
SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
       r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
FROM (
SELECT p.id, p.status FROM (
    SELECT s.status,
           CASE WHEN $17::boolean AND $16 = 'asc' AND ($15 = 'id' OR s.status = $18::text) THEN $19::bigint
                ELSE 0 END AS lo,
           CASE WHEN $17::boolean AND $16 = 'desc' AND ($15 = 'id' OR s.status = $18::text) THEN $19::bigint
                ELSE 9223372036854775807 END AS hi
    FROM unnest($2::text[]) s(status)
    WHERE NOT $17::boolean OR $15 = 'id'
       OR (CASE WHEN $16 = 'asc' THEN s.status >= $18::text ELSE s.status <= $18::text END)
) b
CROSS JOIN unnest($1::text[]) q(queue)
CROSS JOIN LATERAL (
    SELECT r.id, r.status  -- the index's own columns: an index-only scan when no other filter needs the row
    FROM runs r
    -- status = b.status AND lo < id < hi, written as bounds on (status, id): the scan starts at one and stops
    -- at the other (an equality on status beside them made it start at the queue's first run of that state
    -- and filter; a bound on id alone, or ORDER BY id, made the primary key look cheaper)
    WHERE r.queue = q.queue AND (r.status, r.id) > (b.status, b.lo) AND (r.status, r.id) < (b.status, b.hi)
      AND ($3::text IS NULL OR r.handler = $3)
      AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
      AND ($7::text IS NULL OR r.submitted_by = $7 OR r.submitted_by LIKE $7 || '@%'
           OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                      AND (e.actor = $7 OR e.actor LIKE $7 || '@%')))
      AND ($8::bigint IS NULL OR r.id < $8)
      AND ($9::bigint IS NULL OR r.id = $9)
      AND ($10::text IS NULL OR r.tenant = $10)
      AND ($11::text IS NULL OR r.concurrency_key = $11)
      AND ($12::text IS NULL OR r.idempotency_key = $12)
      AND ($13::text IS NULL OR (r.id > $14 AND position(convert_to($13, 'UTF8') IN r.payload) > 0))
    -- (status, id): one state's ids in order, which runs_queue_status gives and the primary key does not
    ORDER BY CASE WHEN $16 = 'asc' THEN r.status END ASC, CASE WHEN $16 = 'asc' THEN r.id END ASC,
             r.status DESC, r.id DESC
    LIMIT $6::bigint + $20::bigint
) p
ORDER BY CASE WHEN $16 = 'asc' AND $15 = 'status' THEN p.status END ASC,
         CASE WHEN $16 = 'desc' AND $15 = 'status' THEN p.status END DESC,
         CASE WHEN $16 = 'asc' THEN p.id END ASC, p.id DESC
LIMIT $6 OFFSET $20
) k JOIN runs r ON r.id = k.id  -- the page's rows only
ORDER BY CASE WHEN $16 = 'asc' AND $15 = 'status' THEN k.status END ASC,
         CASE WHEN $16 = 'desc' AND $15 = 'status' THEN k.status END DESC,
         CASE WHEN $16 = 'asc' THEN k.id END ASC, k.id DESC;

-- name: api_runs_page_other
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: limit int8, scope text[], submitted_by text, max_id int8, id int8, tenant text, concurrency_key text,
-- params: idempotency_key text, arg text, sort text, sort_order text, arg_min_id int8, has_cursor bool,
-- params: after_int int8, after_text text, after_id int8
-- returns: id int8, handler text, queue text, status text, priority int2, attempt int4, run_at timestamptz,
-- returns: created_at timestamptz, started_at timestamptz, finished_at timestamptz, last_error_class text,
-- returns: last_error text, reason text, version int8, workflow_id uuid, schedule_id int8
-- Sorts no index serves (a top-N sort of the matches): attempt, handler, status (with a queue filter,
-- runs_queue_status serves status); ties by id in the same direction. $19 the cursor's integer, $20 its
-- text, $21 its id.
SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
       r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
FROM runs r
WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
  AND ($3::text IS NULL OR r.handler = $3)
  AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
  AND ($7::text[] IS NULL OR r.queue = ANY($7))
  AND ($8::text IS NULL OR r.submitted_by = $8 OR r.submitted_by LIKE $8 || '@%'
       OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                  AND (e.actor = $8 OR e.actor LIKE $8 || '@%')))
  AND ($9::bigint IS NULL OR r.id < $9)
  AND ($10::bigint IS NULL OR r.id = $10)
  AND ($11::text IS NULL OR r.tenant = $11)
  AND ($12::text IS NULL OR r.concurrency_key = $12)
  AND ($13::text IS NULL OR r.idempotency_key = $13)
  AND ($14::text IS NULL OR (r.id > $17 AND position(convert_to($14, 'UTF8') IN r.payload) > 0))
  AND (NOT $18::boolean OR CASE
        WHEN $15 = 'attempt' AND $16 = 'asc' THEN (r.attempt, r.id) > ($19::bigint, $21::bigint)
        WHEN $15 = 'attempt' THEN (r.attempt, r.id) < ($19::bigint, $21::bigint)
        WHEN $16 = 'asc' THEN (CASE $15 WHEN 'handler' THEN r.handler ELSE r.status END, r.id) > ($20::text, $21::bigint)
        ELSE (CASE $15 WHEN 'handler' THEN r.handler ELSE r.status END, r.id) < ($20::text, $21::bigint) END)
ORDER BY
  CASE WHEN $16 = 'asc' THEN CASE $15 WHEN 'handler' THEN r.handler WHEN 'status' THEN r.status END END ASC,
  CASE WHEN $16 = 'desc' THEN CASE $15 WHEN 'handler' THEN r.handler WHEN 'status' THEN r.status END END DESC,
  CASE WHEN $16 = 'asc' AND $15 = 'attempt' THEN r.attempt END ASC,
  CASE WHEN $16 = 'desc' AND $15 = 'attempt' THEN r.attempt END DESC,
  CASE WHEN $16 = 'asc' THEN r.id END ASC,
  r.id DESC
LIMIT $6;

-- Named queries of the dashboard's operations routes (scheduler/api/routes_ops.py, issue 24).
-- Every listing filters by the token's scope ($scope: NULL = every queue) before it limits.
-- name: ops_list_finished
-- params: p1 text, queue text, handler text, queue_2 text[], cursor_finished_at timestamptz, cursor_id int8,
-- params: limit int8
-- returns: id int8, handler text, queue text, status text, attempt int4, priority int2, version int8,
-- returns: run_at timestamptz, created_at timestamptz, started_at timestamptz, finished_at timestamptz,
-- returns: last_error_class text, last_error text, reason text, workflow_id uuid, schedule_id int8
-- The dead letter ($1 'dead': FAILED / TIMED_OUT, not under review) or the review queue ($1 'review'),
-- newest finish first, paged by the keyset ($5 finished_at, $6 id) of the last row of the page before.
-- $2 queue, $3 handler, $4 queues in scope, $7 limit.
SELECT id, handler, queue, status, attempt, priority, version, run_at, created_at, started_at, finished_at,
       last_error_class, last_error, reason, workflow_id, schedule_id
FROM runs
WHERE status IN ('FAILED', 'TIMED_OUT')
  AND CASE WHEN $1::text = 'review' THEN status = 'FAILED' AND reason = 'review'
           ELSE reason IS DISTINCT FROM 'review' END
  AND ($2::text IS NULL OR queue = $2) AND ($3::text IS NULL OR handler = $3)
  AND ($4::text[] IS NULL OR queue = ANY($4))
  AND ($5::timestamptz IS NULL OR (finished_at, id) < ($5, $6::bigint))
ORDER BY finished_at DESC, id DESC
LIMIT $7;

-- name: ops_list_retries
-- params: queue text, handler text, queue_2 text[], cursor_run_at timestamptz, cursor_id int8, limit int8
-- returns: id int8, handler text, queue text, status text, attempt int4, priority int2, version int8,
-- returns: run_at timestamptz, created_at timestamptz, started_at timestamptz, finished_at timestamptz,
-- returns: last_error_class text, last_error text, reason text, workflow_id uuid, schedule_id int8
-- Retries waiting (RETRY_WAIT), soonest first, paged by the keyset ($4 run_at, $5 id). $1 queue,
-- $2 handler, $3 queues in scope, $6 limit. Its own statement (not one with the scheduled list's, by a
-- parameter): the state is written out, so the partial index of RETRY_WAIT runs (036) is used instead of
-- walking the due PENDING runs of the waiting index first (294 ms at 1,000,000 due runs).
SELECT id, handler, queue, status, attempt, priority, version, run_at, created_at, started_at, finished_at,
       last_error_class, last_error, reason, workflow_id, schedule_id
FROM runs
WHERE status = 'RETRY_WAIT'
  AND ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR handler = $2)
  AND ($3::text[] IS NULL OR queue = ANY($3))
  AND ($4::timestamptz IS NULL OR (run_at, id) > ($4, $5::bigint))
ORDER BY run_at, id
LIMIT $6;

-- name: ops_list_scheduled
-- params: queue text, handler text, queue_2 text[], cursor_run_at timestamptz, cursor_id int8, limit int8
-- returns: id int8, handler text, queue text, status text, attempt int4, priority int2, version int8,
-- returns: run_at timestamptz, created_at timestamptz, started_at timestamptz, finished_at timestamptz,
-- returns: last_error_class text, last_error text, reason text, workflow_id uuid, schedule_id int8
-- Scheduled runs (PENDING with a run_at in the future), soonest first, paged by the keyset ($4 run_at,
-- $5 id); the waiting index (035) from now on. $1 queue, $2 handler, $3 queues in scope, $6 limit.
SELECT id, handler, queue, status, attempt, priority, version, run_at, created_at, started_at, finished_at,
       last_error_class, last_error, reason, workflow_id, schedule_id
FROM runs
WHERE status = 'PENDING' AND run_at > now()
  AND ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR handler = $2)
  AND ($3::text[] IS NULL OR queue = ANY($3))
  AND ($4::timestamptz IS NULL OR (run_at, id) > ($4, $5::bigint))
ORDER BY run_at, id
LIMIT $6;

-- name: ops_runs_by_id
-- params: id int8[], queue text[]
-- returns: id int8, handler text, queue text, status text, version int8, reason text
-- The runs among $1 that are in scope ($2), with their versions and reasons (a selection ticked on a page).
SELECT id, handler, queue, status, version, reason FROM runs WHERE id = ANY($1::bigint[]) AND ($2::text[] IS NULL OR queue = ANY($2))
ORDER BY id;

-- name: ops_archive_run
-- params: id int8, version int8
-- returns: id int8
-- Delete a finished run from the lists: it moves to runs_archive with its checkpoint gone (as retention
-- moves it), only while it is still at version $2 in a terminal state and not part of a workflow.
-- Its events and attempts stay: GET /v1/runs/{id} and its timeline still show it. NULL when it moved.
WITH picked AS (
    SELECT id FROM runs WHERE id = $1 AND version = $2
      AND status IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED') AND workflow_id IS NULL
    FOR UPDATE
), ckpt AS (
    DELETE FROM checkpoints c USING picked p WHERE c.run_id = p.id
), moved AS (
    DELETE FROM runs r USING picked p WHERE r.id = p.id RETURNING r.*
)
INSERT INTO runs_archive SELECT * FROM moved RETURNING id;

-- name: ops_select_runs
-- params: queue text, status text, handler text, min_created_at timestamptz, max_created_at timestamptz,
-- params: queue_2 text[], id int8, tenant text, concurrency_key text, idempotency_key text, p11 text,
-- params: limit int8
-- returns: id int8, handler text, queue text, status text, version int8, reason text
-- The runs a bulk action over the runs list's filter counts (the same filters GET /v1/runs takes):
-- $1 queue, $2 status, $3 handler, $4 created at or after, $5 created before, $6 queues in scope,
-- $7 id, $8 tenant, $9 concurrency key, $10 idempotency key, $11 argument substring, $12 at most this
-- many, lowest ids first.
SELECT r.id, r.handler, r.queue, r.status, r.version, r.reason FROM runs r
WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
  AND ($3::text IS NULL OR r.handler = $3)
  AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
  AND ($6::text[] IS NULL OR r.queue = ANY($6))
  AND ($7::bigint IS NULL OR r.id = $7)
  AND ($8::text IS NULL OR r.tenant = $8)
  AND ($9::text IS NULL OR r.concurrency_key = $9)
  AND ($10::text IS NULL OR r.idempotency_key = $10)
  AND ($11::text IS NULL OR position(convert_to($11, 'UTF8') IN r.payload) > 0)
ORDER BY r.id LIMIT $12;

-- Named queries of the whole-queue drift comparison (DriftRepair.suspects: `fencepost reconcile --check`
-- and `--repair`, issue 24 item 12). Both are read with COPY ... TO STDOUT: one tab-separated line per run,
-- `id status version tenant`, compared byte for byte with the same line built from Redis (its hash's state
-- and version, and the tenant of the due set it waits in, else its hash's).
-- name: reconcile_check_runs
-- params: queue text
-- returns: id int8, status text, version int8, tenant text
-- The runs of a queue Redis holds a hash for (drift_active_ids' states without BLOCKED, which lives in
-- PostgreSQL only until its upstreams release it): one sequential pass, no keyset pages.
SELECT id, status, version, coalesce(tenant, '') AS tenant FROM runs
WHERE queue = $1 AND status IN ('PENDING', 'RETRY_WAIT', 'RUNNING', 'STOPPING', 'PAUSED');

-- name: reconcile_check_lookup
-- params: queue text, ids int8[]
-- returns: id int8, status text, version int8, tenant text
-- The rows of the queue's run hashes that reconcile_check_runs did not match (finished runs' hashes kept
-- until they expire, BLOCKED ones, drift), by id.
SELECT id, status, version, coalesce(tenant, '') AS tenant FROM runs WHERE id = ANY($2::bigint[]) AND queue = $1;
