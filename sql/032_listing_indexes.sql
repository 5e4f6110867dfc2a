-- 032_listing_indexes: the listing routes page with keyset cursors after filtering by scope
-- (issue 24 items 3 and 12). The dead-letter and review views read newest finished first with
-- (finished_at, id) as the cursor, per queue or over all; the runs list sorts by creation time.
CREATE INDEX runs_dead_page ON runs (finished_at DESC, id DESC) WHERE status IN ('FAILED', 'TIMED_OUT');
CREATE INDEX runs_dead_queue_page ON runs (queue, finished_at DESC, id DESC) WHERE status IN ('FAILED', 'TIMED_OUT');
CREATE INDEX runs_created_page ON runs (created_at DESC, id DESC);
CREATE INDEX runs_queue_created_page ON runs (queue, created_at DESC, id DESC);
