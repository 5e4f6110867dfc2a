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
