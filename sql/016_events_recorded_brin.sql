-- 016_events_recorded_brin: the live fleet event stream (GET /v1/events/stream, fencepost.api.stream)
-- asks every second for the events recorded since its last look. Rows are appended in the order they
-- are recorded, so a BRIN index on recorded_at finds the newest pages at the cost of a few index
-- tuples per month, where a B-tree would add an insert to every event the recorder writes.
-- autosummarize: a block range is summarised as soon as the next one starts filling, so a query only
-- ever rechecks the newest unsummarised range instead of everything since the last VACUUM.
-- On an existing installation the build reads each events partition once and holds off its writes
-- meanwhile (seconds per GB); the recorder waits and catches up.
CREATE INDEX events_recorded_at ON events USING brin (recorded_at) WITH (pages_per_range = 32, autosummarize = on);
