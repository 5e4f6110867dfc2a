-- Named queries. fencepost/core/record.py (scheduler/core/record.py) is the only module that runs
-- SQL; it loads these by name. One file per area; every name is used and every used name exists
-- (tests/test_gateways.py).

-- name: ping
-- params: none
-- returns: ?column? int4
-- Readiness probe of the HTTP API.
SELECT 1;

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

-- name: upsert_definitions
-- params: name text[], model text[], queue text[], priority int2[], timeout_s float8[], max_retries int4[],
-- params: version int4[], resumable bool[], owner text[], options jsonb[]
-- returns: nothing
INSERT INTO job_definitions (name, model, queue, priority, timeout_s, max_retries, version, resumable, owner, options, updated_at)
SELECT * , now() FROM unnest($1::text[], $2::text[], $3::text[], $4::smallint[], $5::double precision[],
                             $6::integer[], $7::integer[], $8::boolean[], $9::text[], $10::jsonb[])
ON CONFLICT (name) DO UPDATE SET model = excluded.model, queue = excluded.queue, priority = excluded.priority,
    timeout_s = excluded.timeout_s, max_retries = excluded.max_retries, version = excluded.version,
    resumable = excluded.resumable, owner = excluded.owner, options = excluded.options, updated_at = now();

-- name: definitions
-- params: none
-- returns: name text, model text, queue text, priority int2, timeout_s float8, max_retries int4,
-- returns: version int4, resumable bool, owner text, options jsonb
SELECT name, model, queue, priority, timeout_s, max_retries, version, resumable, owner, options FROM job_definitions;

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

-- name: run_events
-- params: run_id int8
-- returns: id int8, type text, from_status text, to_status text, version int8, attempt int4, token int8,
-- returns: worker_id text, actor text, reason text, error_class text, error_message text, trace_id text,
-- returns: at timestamptz, recorded_at timestamptz
-- A run's timeline: its event rows and its attempts' claim and finish columns, as one list of
-- event-shaped rows (the view `history`, 020_attempt_history.sql). Within one millisecond, the
-- order of the stream entries (a claim and the finish of a no-op job share their ts).
SELECT id, type, from_status, to_status, version, attempt, token, worker_id, actor, reason,
       error_class, error_message, trace_id, at, recorded_at
FROM history WHERE run_id = $1 ORDER BY at, stream_id NULLS FIRST, id;

-- name: run_attempts
-- params: run_id int8
-- returns: attempt int4, token int8, worker_id text, started_at timestamptz, finished_at timestamptz,
-- returns: outcome text, error_class text, error_message text
SELECT attempt, token, worker_id, started_at, finished_at, outcome, error_class, error_message
FROM attempts WHERE run_id = $1 ORDER BY attempt;

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

-- name: apply_attempts
-- params: run_id int8[], attempt int4[], token int8[], worker_id text[], started_at timestamptz[],
-- params: finished_at timestamptz[], outcome text[], error_class text[], error_message text[],
-- params: claim_version int8[], claim_stream_id int8[], finish_type text[], finish_from text[],
-- params: finish_to text[], finish_version int8[], finish_stream_id int8[], reason text[], queue text[]
-- returns: nothing
-- One row per attempt, one statement per batch, each attempt's row found by its whole key
-- (run_id, attempt, started_at): every closing transition the recorder writes this way carries its
-- attempt's start (finish_runs.lua's `started`, or the claim in the same batch), so the insert goes
-- to the one monthly partition of that start and its conflict check reads that partition's key only,
-- whatever the size of the history. A claim and its finish in one batch are one insert; a finish
-- after its claim's batch is one update of that row (ON CONFLICT), a claim after its finish's batch
-- (another recorder's) fills the claim columns. Rows go in (run_id, attempt) order so recorder
-- replicas take the key locks in one order (no deadlock). A row that brings nothing the attempt does
-- not have (a batch recorded already) changes nothing: the statement's count tells the recorder.
-- Closes whose start is not known, and the rows of a late batch, go to apply_attempts_by_run.
-- $1-$9 run, attempt, token, worker, started, finished, outcome, error class, error message;
-- $10-$16 claim version, claim stream id, finish type / from / to / version / stream id; $17 reason;
-- $18 the queue (the stream's the entry came from, 047: a queue's history reads its own rows).
INSERT INTO attempts AS a (run_id, attempt, token, worker_id, started_at, finished_at, outcome, error_class,
                           error_message, claim_version, claim_stream_id, finish_type, finish_from, finish_to,
                           finish_version, finish_stream_id, reason, queue)
SELECT * FROM unnest($1::bigint[], $2::integer[], $3::bigint[], $4::text[], $5::timestamptz[],
                     $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::bigint[], $11::bigint[],
                     $12::text[], $13::text[], $14::text[], $15::bigint[], $16::bigint[], $17::text[], $18::text[])
    AS u(run_id, attempt, token, worker_id, started_at, finished_at, outcome, error_class, error_message,
         claim_version, claim_stream_id, finish_type, finish_from, finish_to, finish_version, finish_stream_id,
         reason, queue)
ORDER BY 1, 2
ON CONFLICT (run_id, attempt, started_at) DO UPDATE SET
    finished_at = COALESCE(excluded.finished_at, a.finished_at),
    outcome = COALESCE(excluded.outcome, a.outcome),
    error_class = COALESCE(excluded.error_class, a.error_class),
    error_message = COALESCE(excluded.error_message, a.error_message),
    claim_version = COALESCE(a.claim_version, excluded.claim_version),
    claim_stream_id = COALESCE(a.claim_stream_id, excluded.claim_stream_id),
    finish_type = COALESCE(excluded.finish_type, a.finish_type),
    finish_from = COALESCE(excluded.finish_from, a.finish_from),
    finish_to = COALESCE(excluded.finish_to, a.finish_to),
    finish_version = COALESCE(excluded.finish_version, a.finish_version),
    finish_stream_id = COALESCE(excluded.finish_stream_id, a.finish_stream_id),
    reason = COALESCE(excluded.reason, a.reason),
    queue = COALESCE(a.queue, excluded.queue),
    recorded_at = now()
WHERE (a.claim_stream_id IS NULL AND excluded.claim_stream_id IS NOT NULL)
   OR (a.finished_at IS NULL AND excluded.finished_at IS NOT NULL);

-- name: apply_attempts_by_run
-- params: run_id int8[], attempt int4[], token int8[], worker_id text[], started_at timestamptz[],
-- params: finished_at timestamptz[], outcome text[], error_class text[], error_message text[],
-- params: claim_version int8[], claim_stream_id int8[], finish_type text[], finish_from text[],
-- params: finish_to text[], finish_version int8[], finish_stream_id int8[], reason text[], queue text[]
-- returns: nothing
-- apply_attempts for the rows whose attempt row cannot be found by its whole key: closes that do not
-- carry their attempt's start (a lease expiry, a release at shutdown, a run whose Redis hash was
-- rebuilt without it, an older version's entry; $5 NULL), and every row of a batch that came late
-- (apply_runs found a newer version of one of its runs: another recorder's batch, a replay), whose
-- claim may find its attempt inserted by a close recorded before it. Found by (run_id, attempt), so
-- this reads the key of every partition; the recorder sends it only such rows. A close that finds no
-- row inserts the attempt started at the close; its claim, late by then, moves the start back.
-- Parameters as apply_attempts.
WITH input AS (
    SELECT * FROM unnest($1::bigint[], $2::integer[], $3::bigint[], $4::text[], $5::timestamptz[],
                         $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::bigint[], $11::bigint[],
                         $12::text[], $13::text[], $14::text[], $15::bigint[], $16::bigint[], $17::text[],
                         $18::text[])
        AS u(run_id, attempt, token, worker_id, started_at, finished_at, outcome, error_class, error_message,
             claim_version, claim_stream_id, finish_type, finish_from, finish_to, finish_version, finish_stream_id,
             reason, queue)
    ORDER BY 1, 2
), found AS (
    SELECT a.run_id, a.attempt FROM attempts a JOIN input i ON a.run_id = i.run_id AND a.attempt = i.attempt
), upd AS (
    UPDATE attempts a SET
        started_at = LEAST(a.started_at, i.started_at),
        finished_at = COALESCE(i.finished_at, a.finished_at),
        outcome = COALESCE(i.outcome, a.outcome),
        error_class = COALESCE(i.error_class, a.error_class),
        error_message = COALESCE(i.error_message, a.error_message),
        claim_version = COALESCE(a.claim_version, i.claim_version),
        claim_stream_id = COALESCE(a.claim_stream_id, i.claim_stream_id),
        finish_type = COALESCE(i.finish_type, a.finish_type),
        finish_from = COALESCE(i.finish_from, a.finish_from),
        finish_to = COALESCE(i.finish_to, a.finish_to),
        finish_version = COALESCE(i.finish_version, a.finish_version),
        finish_stream_id = COALESCE(i.finish_stream_id, a.finish_stream_id),
        reason = COALESCE(i.reason, a.reason),
        queue = COALESCE(a.queue, i.queue),
        recorded_at = now()
    FROM input i WHERE a.run_id = i.run_id AND a.attempt = i.attempt
      AND ((a.claim_stream_id IS NULL AND i.claim_stream_id IS NOT NULL)   -- what the row does not have yet
           OR (a.finished_at IS NULL AND i.finished_at IS NOT NULL) OR i.started_at < a.started_at)
)
INSERT INTO attempts AS a (run_id, attempt, token, worker_id, started_at, finished_at, outcome, error_class,
                           error_message, claim_version, claim_stream_id, finish_type, finish_from, finish_to,
                           finish_version, finish_stream_id, reason, queue)
SELECT run_id, attempt, token, worker_id, COALESCE(started_at, finished_at), finished_at, outcome, error_class,
       error_message, claim_version, claim_stream_id, finish_type, finish_from, finish_to, finish_version,
       finish_stream_id, reason, queue
FROM input i WHERE NOT EXISTS (SELECT 1 FROM found f WHERE f.run_id = i.run_id AND f.attempt = i.attempt)
ON CONFLICT (run_id, attempt, started_at) DO NOTHING;

-- name: recorded_attempt_entries
-- params: run_id int8[]
-- returns: run_id int8, attempt int4, claim_stream_id int8, finish_stream_id int8
-- For a replayed batch (entries that may be committed already): the stream ids of the claims and
-- finishes the attempts of runs $1 hold, so the recorder counts only the entries it writes now.
SELECT run_id, attempt, claim_stream_id, finish_stream_id FROM attempts WHERE run_id = ANY($1::bigint[]);

-- name: queue_epochs
-- params: none
-- returns: name text, epoch int8, paused bool
SELECT name, epoch, paused FROM queues ORDER BY name;

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

-- name: insert_events_json
-- params: p1 jsonb
-- returns: stream text, stream_id int8
-- The recorder's events, as one jsonb array of arrays (decoded once by PostgreSQL instead
-- of 15 typed arrays encoded element by element in Python). Positions: run, type, from,
-- to, version, attempt, token, worker, reason, error class, error, ts (ms), stream,
-- stream id, actor, queue (the stream's, 047). `at` is derived from the entry's ts only, so a redelivered entry hits
-- the (stream, stream_id, at) key (events are partitioned by `at`) and is skipped.
INSERT INTO events (run_id, type, from_status, to_status, version, attempt, token, worker_id,
                    reason, error_class, error_message, at, stream, stream_id, actor, queue)
SELECT (e->>0)::bigint, e->>1, e->>2, e->>3, (e->>4)::bigint, (e->>5)::integer, (e->>6)::bigint, e->>7,
       e->>8, e->>9, e->>10, to_timestamp((e->>11)::bigint / 1000.0), e->>12, (e->>13)::bigint, e->>14, e->>15
FROM jsonb_array_elements($1::jsonb) AS e
ON CONFLICT (stream, stream_id, at) WHERE stream_id IS NOT NULL DO NOTHING
RETURNING stream, stream_id;
