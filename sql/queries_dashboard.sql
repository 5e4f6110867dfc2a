-- Queries of the dashboard's views (issue 17), run through fencepost.core.record.

-- name: dashboard_runs
-- The runs list: every filter optional (NULL: any). $1 queue, $2 status, $3 handler, $4 created at or
-- after, $5 created before, $6 limit, $7 queues in scope (NULL: all), $8 submitted by this actor prefix
-- (NULL: anyone), $9 before id (keyset, id order only), $10 id, $11 tenant, $12 concurrency key,
-- $13 idempotency key, $14 argument substring (bytes of a string argument, as msgpack stores it),
-- $15 sort column (id, created_at, finished_at, attempt, handler, status), $16 'asc' / 'desc', $17 offset.
SELECT r.id, r.handler, r.queue, r.status, r.priority, r.attempt, r.run_at, r.created_at, r.started_at,
       r.finished_at, r.last_error_class, r.last_error, r.reason, r.version, r.workflow_id, r.schedule_id
FROM runs r
WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
  AND ($3::text IS NULL OR r.handler = $3)
  AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
  AND ($7::text[] IS NULL OR r.queue = ANY($7))
  AND ($8::text IS NULL OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                                   AND (e.actor = $8 OR e.actor LIKE $8 || '@%')))
  AND ($9::bigint IS NULL OR r.id < $9)
  AND ($10::bigint IS NULL OR r.id = $10)
  AND ($11::text IS NULL OR r.tenant = $11)
  AND ($12::text IS NULL OR r.concurrency_key = $12)
  AND ($13::text IS NULL OR r.idempotency_key = $13)
  AND ($14::text IS NULL OR position(convert_to($14, 'UTF8') IN r.payload) > 0)
ORDER BY
  CASE WHEN $16 = 'asc' THEN CASE $15 WHEN 'created_at' THEN r.created_at WHEN 'finished_at' THEN r.finished_at END END
      ASC NULLS LAST,
  CASE WHEN $16 = 'desc' THEN CASE $15 WHEN 'created_at' THEN r.created_at WHEN 'finished_at' THEN r.finished_at END END
      DESC NULLS LAST,
  CASE WHEN $16 = 'asc' THEN CASE $15 WHEN 'handler' THEN r.handler WHEN 'status' THEN r.status END END ASC,
  CASE WHEN $16 = 'desc' THEN CASE $15 WHEN 'handler' THEN r.handler WHEN 'status' THEN r.status END END DESC,
  CASE WHEN $16 = 'asc' AND $15 = 'attempt' THEN r.attempt END ASC,
  CASE WHEN $16 = 'desc' AND $15 = 'attempt' THEN r.attempt END DESC,
  CASE WHEN $16 = 'asc' THEN r.id END ASC,
  r.id DESC
LIMIT $6 OFFSET $17;

-- name: dashboard_runs_count
-- How many runs the filters of dashboard_runs match, counted up to a bound (the page says "more than N"
-- rather than scan a huge table for an exact figure). $1 queue, $2 status, $3 handler, $4 since, $5 until,
-- $6 queues in scope, $7 submitter prefix, $8 before id, $9 id, $10 tenant, $11 concurrency key,
-- $12 idempotency key, $13 argument substring, $14 the bound.
SELECT count(*) AS n FROM (
  SELECT 1 FROM runs r
  WHERE ($1::text IS NULL OR r.queue = $1) AND ($2::text IS NULL OR r.status = $2)
    AND ($3::text IS NULL OR r.handler = $3)
    AND ($4::timestamptz IS NULL OR r.created_at >= $4) AND ($5::timestamptz IS NULL OR r.created_at < $5)
    AND ($6::text[] IS NULL OR r.queue = ANY($6))
    AND ($7::text IS NULL OR EXISTS (SELECT 1 FROM events e WHERE e.type = 'submitted' AND e.run_id = r.id
                                     AND (e.actor = $7 OR e.actor LIKE $7 || '@%')))
    AND ($8::bigint IS NULL OR r.id < $8)
    AND ($9::bigint IS NULL OR r.id = $9)
    AND ($10::text IS NULL OR r.tenant = $10)
    AND ($11::text IS NULL OR r.concurrency_key = $11)
    AND ($12::text IS NULL OR r.idempotency_key = $12)
    AND ($13::text IS NULL OR position(convert_to($13, 'UTF8') IN r.payload) > 0)
  LIMIT $14
) m;
