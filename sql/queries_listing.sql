-- Named queries of the API's listings that filter by the caller's scope before they limit and
-- page with keyset cursors (issue 24 item 3): the dead letter and the review queue.

-- name: api_dead_letter_page
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
