-- Named queries: Batches with callbacks and their lists.
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: batch_insert
-- params: id uuid, name text, on_complete int8, on_success int8, p5 int8[]
-- returns: nothing
-- One batch, its callback runs (inserted BLOCKED in the same transaction) and its members.
WITH b AS (
    INSERT INTO batches (id, name, on_complete, on_success) VALUES ($1, $2, $3, $4)
)
INSERT INTO batch_members (run_id, batch_id) SELECT unnest($5::bigint[]), $1;

-- name: batch_lock_open
-- params: run_id int8[]
-- returns: id uuid
-- The unsettled batches of runs that just reached a terminal state, locked in id order: two
-- transactions finishing the last two members of one batch are serialized, and the second
-- sees the first's commit in its next statement (batch_settling), so neither misses the end.
SELECT b.id FROM batches b
WHERE b.id IN (SELECT m.batch_id FROM batch_members m WHERE m.run_id = ANY($1::bigint[]))
  AND b.settled_at IS NULL
ORDER BY b.id
FOR UPDATE OF b;

-- name: batch_settling
-- params: id uuid[]
-- returns: id uuid, on_complete int8, on_success int8, all_ok bool
-- Of the given (locked) batches, those whose every member is terminal: settled now, with
-- whether every member SUCCEEDED. A member missing from runs was archived, so it finished.
WITH done AS (
    SELECT b.id, b.on_complete, b.on_success,
           NOT EXISTS (SELECT 1 FROM batch_members m JOIN runs r ON r.id = m.run_id
                       WHERE m.batch_id = b.id AND r.status <> 'SUCCEEDED')
           AND NOT EXISTS (SELECT 1 FROM batch_members m JOIN runs_archive a ON a.id = m.run_id
                           WHERE m.batch_id = b.id AND a.status <> 'SUCCEEDED') AS all_ok
    FROM batches b
    WHERE b.id = ANY($1::uuid[]) AND b.settled_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM batch_members m JOIN runs r ON r.id = m.run_id
                      WHERE m.batch_id = b.id AND r.status NOT IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED'))
), upd AS (
    UPDATE batches b SET settled_at = now() FROM done WHERE b.id = done.id RETURNING b.id
)
SELECT done.id, done.on_complete, done.on_success, done.all_ok FROM done JOIN upd ON upd.id = done.id;

-- name: batch_release
-- params: id int8[], actor text
-- returns: id int8, queue text, notified int8
-- Callback runs of settled batches: BLOCKED -> PENDING (outbox=true: the relay moves them to
-- Redis after commit). Only a BLOCKED run moves, so a replayed settle is a no-op.
WITH upd AS (
    UPDATE runs r SET status = 'PENDING', version = r.version + 1, outbox = true, run_at = now(),
                      reason = NULL, updated_at = now()
    WHERE r.id = ANY($1::bigint[]) AND r.status = 'BLOCKED'
    RETURNING r.id, r.queue, r.version, r.trace_id
), ev AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, actor, reason, trace_id, at)
    SELECT id, queue, 'released', 'BLOCKED', 'PENDING', version, $2, 'batch_settled', trace_id, now() FROM upd
), notify AS (
    SELECT pg_notify('fencepost_outbox', q.queue) FROM (SELECT DISTINCT queue FROM upd) q
)
SELECT id, queue, (SELECT count(*) FROM notify) AS notified FROM upd;

-- name: batch_cancel_callbacks
-- params: id int8[], actor text
-- returns: id int8
-- on_success callbacks of batches where a member did not succeed: BLOCKED -> CANCELLED.
WITH upd AS (
    UPDATE runs r SET status = 'CANCELLED', version = r.version + 1, reason = 'batch_failed',
                      finished_at = now(), outbox = false, updated_at = now()
    WHERE r.id = ANY($1::bigint[]) AND r.status = 'BLOCKED'
    RETURNING r.id, r.queue, r.version, r.trace_id
), ev AS (
    INSERT INTO events (run_id, queue, type, from_status, to_status, version, actor, reason, trace_id, at)
    SELECT id, queue, 'cancelled', 'BLOCKED', 'CANCELLED', version, $2, 'batch_failed', trace_id, now() FROM upd
)
SELECT id FROM upd;

-- name: batch_unsettled
-- params: p1 float8, limit int8
-- returns: id uuid
-- Sweep: open batches (older than $1 seconds) whose members are all terminal, e.g. a member
-- whose terminal state was written by drift repair rather than by the recorder.
SELECT b.id FROM batches b
WHERE b.settled_at IS NULL AND b.created_at < now() - make_interval(secs => $1)
  AND NOT EXISTS (SELECT 1 FROM batch_members m JOIN runs r ON r.id = m.run_id
                  WHERE m.batch_id = b.id AND r.status NOT IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED'))
ORDER BY b.id
LIMIT $2
FOR UPDATE OF b SKIP LOCKED;

-- name: batch_get
-- params: id uuid
-- returns: id uuid, name text, on_complete int8, on_success int8, settled_at timestamptz,
-- returns: created_at timestamptz, run_ids int8[], statuses text[]
-- A batch with its callbacks and each member's current status (hot row, else archived).
SELECT b.id, b.name, b.on_complete, b.on_success, b.settled_at, b.created_at,
       array_agg(m.run_id ORDER BY m.run_id) AS run_ids,
       array_agg(COALESCE(r.status, a.status) ORDER BY m.run_id) AS statuses
FROM batches b JOIN batch_members m ON m.batch_id = b.id
LEFT JOIN runs r ON r.id = m.run_id LEFT JOIN runs_archive a ON a.id = m.run_id AND r.id IS NULL
WHERE b.id = $1
GROUP BY b.id;

-- name: batch_results_of_callback
-- params: on_complete int8
-- returns: run_id int8, status text, result bytea
-- For a callback run: every member of its batch with status and result (hot, else archived).
SELECT m.run_id, COALESCE(r.status, a.status) AS status, COALESCE(r.result, a.result) AS result
FROM batches b JOIN batch_members m ON m.batch_id = b.id
LEFT JOIN runs r ON r.id = m.run_id LEFT JOIN runs_archive a ON a.id = m.run_id AND r.id IS NULL
WHERE b.on_complete = $1 OR b.on_success = $1
ORDER BY m.run_id;

-- name: api_batch_queues
-- params: batch_id uuid
-- returns: array_agg text[]
-- The queues of a batch's members and callbacks (hot row, else archived): the API's scope check.
SELECT array_agg(DISTINCT x.queue) FROM (
    SELECT COALESCE(r.queue, a.queue) AS queue
    FROM batch_members m LEFT JOIN runs r ON r.id = m.run_id
    LEFT JOIN runs_archive a ON a.id = m.run_id AND r.id IS NULL
    WHERE m.batch_id = $1
    UNION ALL
    SELECT COALESCE(r.queue, a.queue)
    FROM batches b CROSS JOIN LATERAL (VALUES (b.on_complete), (b.on_success)) c(id)
    LEFT JOIN runs r ON r.id = c.id LEFT JOIN runs_archive a ON a.id = c.id AND r.id IS NULL
    WHERE b.id = $1 AND c.id IS NOT NULL
) x WHERE x.queue IS NOT NULL;

-- name: ops_batches_page
-- params: scope text[], after_created_at timestamptz, after_id uuid, limit int8, scan int8
-- returns: id uuid, name text, created_at timestamptz, settled_at timestamptz, on_complete int8,
-- returns: on_success int8, members int8, succeeded int8, failed int8, cancelled int8, waiting int8,
-- returns: archived int8, queues text[]
-- Batches newest first, by keyset cursor (issue 24): of the $5 newest batches after the cursor ($2, $3: only
-- batches before (created_at, id) in this order; NULL: from the newest), those whose members still in `runs`
-- are all in scope ($1; NULL: all), at most $4, each with its members counted by state. Paging by time alone
-- (`before`) skipped the rest of the batches created in the same instant as the last one of a page. The scan
-- is bounded ($5): a scoped token whose queues hold few batches gets a short page and a cursor of where the
-- scan stopped (ops_batches_page_scanned) instead of a read of every batch's members.
SELECT b.id, b.name, b.created_at, b.settled_at, b.on_complete, b.on_success, c.members, c.succeeded, c.failed,
       c.cancelled, c.waiting, c.archived, c.queues
FROM (SELECT * FROM batches
      WHERE $2::timestamptz IS NULL OR (created_at <= $2 AND (created_at, id) < ($2, $3::uuid))
      ORDER BY created_at DESC, id DESC LIMIT $5) b
CROSS JOIN LATERAL (
    SELECT count(*) AS members,
           count(*) FILTER (WHERE r.status = 'SUCCEEDED') AS succeeded,
           count(*) FILTER (WHERE r.status IN ('FAILED', 'TIMED_OUT')) AS failed,
           count(*) FILTER (WHERE r.status = 'CANCELLED') AS cancelled,
           count(*) FILTER (WHERE r.status NOT IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED')) AS waiting,
           count(*) FILTER (WHERE r.id IS NULL) AS archived,
           coalesce(array_agg(DISTINCT r.queue) FILTER (WHERE r.queue IS NOT NULL), '{}') AS queues
    FROM batch_members m LEFT JOIN runs r ON r.id = m.run_id WHERE m.batch_id = b.id
) c
WHERE ($1::text[] IS NULL OR (cardinality(c.queues) > 0 AND c.queues <@ $1::text[]))
ORDER BY b.created_at DESC, b.id DESC
LIMIT $4;

-- name: ops_batches_page_scanned
-- params: after_created_at timestamptz, after_id uuid, scan int8
-- returns: n int8, created_at timestamptz, id uuid
-- How far ops_batches_page's bounded scan ($3 batches after the cursor $1, $2) reached: how many it read
-- (fewer than $3: the end) and the key of the oldest, where the next page starts.
SELECT count(*) AS n, (array_agg(created_at ORDER BY created_at, id))[1] AS created_at,
       (array_agg(id ORDER BY created_at, id))[1] AS id
FROM (SELECT created_at, id FROM batches
      WHERE $1::timestamptz IS NULL OR (created_at <= $1 AND (created_at, id) < ($1, $2::uuid))
      ORDER BY created_at DESC, id DESC LIMIT $3) s;
