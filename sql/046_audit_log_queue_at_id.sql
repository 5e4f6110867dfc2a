-- 046_audit_log_queue_at_id: the audit view of a queue, or of a scoped token's queues, reads the log queue by
-- queue in (queue, at, id) order, newest first, one range from the cursor down (audit_list, issue 24). It
-- read audit_log_at_id from the cursor down and filtered on the queue, past every other queue's entry (465
-- entries for a page of 50 in tests/test_listing_plans.py; 38-70 ms for a deep page of one queue of ten at
-- 1,000,000 runs). audit_log_queue (008: queue, at) has no id to order a time's ties by, so the planner
-- preferred the time-ordered scan. The new index serves every read audit_log_queue did (a queue's entries by
-- time, either way), so that one goes: one index fewer to write per entry.
CREATE INDEX audit_log_queue_at_id ON audit_log (queue, at, id);
DROP INDEX IF EXISTS audit_log_queue;
