-- 033_listing_history_indexes: the fleet history and the audit view read newest first with a LIMIT
-- (issue 24 item 12). Without an index on events.at, GET /v1/events sorted every event of its window
-- (a million submits in the last hour: ~1 s); the audit view scanned every event to find the few an
-- operator made. events_at costs one right-edge B-tree insert per event row (events are submits,
-- retries and operator commands since 020: claims and finishes are attempt columns);
-- events_operator_at holds only operator commands, so it costs nothing on the submit path.
CREATE INDEX events_at ON events (at DESC, id DESC);
CREATE INDEX events_operator_at ON events (at DESC, id DESC)
    WHERE run_id IS NOT NULL AND actor IS NOT NULL AND type <> 'submitted'
      AND actor NOT IN ('worker', 'recorder', 'reconciler', 'trigger');
CREATE INDEX audit_log_at_id ON audit_log (at DESC, id DESC);
