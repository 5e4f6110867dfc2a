-- 017_quarantine_any_row: quarantine works on any stored row (issue 22 item 8).
--
-- 010 added its bounds NOT VALID: rows an older version stored are left in place, but PostgreSQL
-- checks a NOT VALID constraint on every UPDATE of a row, so an UPDATE that keeps the bad value
-- (the quarantine itself: pause a schedule, cancel a run) was refused, and the loop that found the
-- row failed on it for ever. Two answers, one per table:
--
-- * schedules: a quarantined schedule (schedules.quarantined set, paused) is exempt from the
--   bounds and keeps the values it was stored with, so `fencepost schedule show` shows what was
--   wrong. It leaves quarantine only through `schedule update` (or a re-add), which validates the
--   merged definition first, and clears `quarantined`: from then on the bounds hold again.
-- * runs: a run's values are read and its row updated by every loop while it lives (recorder,
--   commands, drift, rebuild, retention), so there no exemption would do. The quarantine queries
--   (queries_isolation.sql) write the stored values into the quarantine event ('stored') and put
--   the row's values back inside the bounds (fencepost_run_bounded below): from then on every
--   UPDATE of the row passes.
ALTER TABLE schedules DROP CONSTRAINT schedules_interval_bounded,
    ADD CONSTRAINT schedules_interval_bounded
    CHECK (quarantined IS NOT NULL OR interval_s IS NULL OR interval_s BETWEEN 1 AND 315360000) NOT VALID;
ALTER TABLE schedules DROP CONSTRAINT schedules_spread_bounded,
    ADD CONSTRAINT schedules_spread_bounded CHECK (quarantined IS NOT NULL OR spread_s <= 86400) NOT VALID;

-- Whether a run's bounded values satisfy 010's constraints (runs_timeout_bounded,
-- runs_max_retries_bounded), for the queries that find and fix rows stored before them.
CREATE FUNCTION fencepost_run_bounded(timeout_s double precision, max_retries integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT timeout_s <= 2592000 AND max_retries <= 10000
$$;
