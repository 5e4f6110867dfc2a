-- Named queries of `fencepost reconcile --check`'s fast comparison (scheduler/cli/reconcile.py, issue 24
-- item 12).

-- name: reconcile_check_page
-- The runs of queue $1 Redis must hold (drift_active_ids' states) with ids above $2, $3 at a time.
SELECT id, status FROM runs
WHERE queue = $1 AND id > $2 AND status IN ('PENDING', 'RETRY_WAIT', 'RUNNING', 'STOPPING', 'PAUSED', 'BLOCKED')
ORDER BY id LIMIT $3;
