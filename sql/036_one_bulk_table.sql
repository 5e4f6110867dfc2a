-- 036_one_bulk_table: one table of counted sets for every bulk action (issue 24). The queue bulk of
-- the API (030, bulk_handles: one queue, `command`) and the dashboard's list bulk (035, ops_bulk_sets:
-- lists that may span queues, `action`) were two tables and two code paths for one protocol; both
-- now count into bulk_handles and confirm through the same queries (sql/queries_bulk.sql,
-- fencepost.api.bulk). A set is bound to its token, its action and `list` ('queue': the API's queue
-- bulk, whose `queue` is the queue in its path; else a dashboard list, `queue` NULL), and holds each
-- counted run's queue, state and version.
ALTER TABLE bulk_handles RENAME COLUMN command TO action;
ALTER TABLE bulk_handles ALTER COLUMN queue DROP NOT NULL;
ALTER TABLE bulk_handles ADD COLUMN list text NOT NULL DEFAULT 'queue';
ALTER TABLE bulk_handles ADD COLUMN queues text[];
UPDATE bulk_handles SET queues = array_fill(queue, ARRAY[cardinality(ids)]);
ALTER TABLE bulk_handles ALTER COLUMN queues SET NOT NULL;
ALTER TABLE bulk_handles ALTER COLUMN list DROP DEFAULT;
ALTER TABLE bulk_handles ADD CONSTRAINT bulk_handles_list CHECK ((list = 'queue') = (queue IS NOT NULL));
ALTER TABLE bulk_handles ADD CONSTRAINT bulk_handles_arrays
    CHECK (cardinality(ids) = cardinality(versions) AND cardinality(ids) = cardinality(states)
           AND cardinality(ids) = cardinality(queues));

-- Counted sets still waiting for their confirmation (at most 5 minutes old) carry over: a page that
-- counted before the upgrade confirms after it. Expired ones are dropped with the table.
INSERT INTO bulk_handles (handle, token_id, queue, action, list, selection, matched, ids, queues, states, versions,
                          created_at, expires_at)
SELECT handle, token_id, NULL, action, list, selection, matched, ids, queues, states, versions, created_at, expires_at
FROM ops_bulk_sets WHERE expires_at > now() AND list <> 'queue'
ON CONFLICT (handle) DO NOTHING;
DROP TABLE ops_bulk_sets;

-- The dashboard's lists at 1,000,000 runs (bench/listing_scale.py): the retries-waiting list pages a
-- partial index of its own (through 035's index of every waiting run it walked the due PENDING runs
-- first: 294 ms), and the batches view walks batches newest first instead of counting every batch's
-- members before it sorts (102 ms).
CREATE INDEX runs_retry_wait_run_at ON runs (run_at, id) WHERE status = 'RETRY_WAIT';
CREATE INDEX batches_created ON batches (created_at);
