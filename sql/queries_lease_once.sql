-- Named queries: a lease expiry recorded exactly once (a lost lease whose expiry is still in the stream).

-- name: drift_interrupt_lost_unlogged
-- drift_interrupt_lost for runs whose queue stream still holds an entry of theirs (the reaper's or
-- repair_interrupt's lease_expired, not yet recorded): the projection and the attempt are closed the same
-- way, but no event row is written here; the recorder writes it from the stream (once).
WITH r AS (
    UPDATE runs SET status = CASE WHEN status = 'RUNNING' THEN 'PENDING' ELSE 'STOPPED' END,
                    lease_owner = NULL, lease_expires_at = NULL, version = version + 1,
                    finished_at = CASE WHEN status = 'STOPPING' THEN now() END,
                    reason = 'redis_lost', updated_at = now()
    WHERE id = ANY($1::bigint[]) AND status IN ('RUNNING', 'STOPPING')
    RETURNING id, status, attempt, version, token
), a AS (
    UPDATE attempts SET finished_at = now(), outcome = 'interrupted',
                        error_message = 'lease state lost from Redis'
    WHERE (run_id, attempt) IN (SELECT id, attempt FROM r) AND finished_at IS NULL
)
SELECT id, status, version FROM r;
