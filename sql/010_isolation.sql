-- 010_isolation: no run, queue or schedule stops a service loop (issue 13).
--
-- A schedule the trigger cannot fire (an interval or cron line an older version accepted, a
-- handler declaring an impossible timeout) is paused and says why, instead of failing every
-- tick for every schedule. `fencepost schedule show` prints it; fix and re-add the schedule.
ALTER TABLE schedules ADD COLUMN quarantined text;

-- The epoch is spent only by a rebuild that stamps: a rebuild bumps the epoch only when the
-- current one may have been stamped (tokens may exist under it), and marks it stamped just
-- before it writes the stamp. A rebuild that fails before that reuses the epoch on the next
-- try. New queues are stamped by their creator at their first epoch, hence the default.
ALTER TABLE queues ADD COLUMN epoch_stamped boolean NOT NULL DEFAULT true;

-- Values no store can hold are refused by the record too (fencepost.core.validate is the
-- first line): finite, bounded numbers. NOT VALID: rows written by an older version are left
-- to the reconciler, which quarantines the ones Redis cannot hold.
ALTER TABLE runs ADD CONSTRAINT runs_timeout_bounded CHECK (timeout_s <= 2592000) NOT VALID;
ALTER TABLE runs ADD CONSTRAINT runs_max_retries_bounded CHECK (max_retries <= 10000) NOT VALID;
ALTER TABLE schedules ADD CONSTRAINT schedules_interval_bounded
    CHECK (interval_s IS NULL OR interval_s BETWEEN 1 AND 315360000) NOT VALID;
ALTER TABLE schedules ADD CONSTRAINT schedules_spread_bounded CHECK (spread_s <= 86400) NOT VALID;
