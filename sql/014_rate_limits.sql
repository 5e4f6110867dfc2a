-- 014_rate_limits: proactive rate limits (at most N starts per interval).
-- A run may carry a rate key with the rate it declares ('N/ms': N starts per ms milliseconds);
-- a queue may have a queue-wide rate and per-key overrides (fencepost queue rate). Redis
-- enforces them in claim_due.lua; these columns let a rebuild restore them.
ALTER TABLE runs
    ADD COLUMN rate_key text,
    ADD COLUMN rate_limit text CHECK (rate_limit ~ '^[1-9][0-9]{0,6}/[1-9][0-9]{0,7}$'),
    ADD CONSTRAINT rate_with_key CHECK ((rate_key IS NULL) = (rate_limit IS NULL));
-- runs_archive keeps the columns of runs in the same order (007: INSERT .. SELECT * moves rows)
ALTER TABLE runs_archive
    ADD COLUMN rate_key text,
    ADD COLUMN rate_limit text;

ALTER TABLE queues
    ADD COLUMN rate_limit text CHECK (rate_limit ~ '^[1-9][0-9]{0,6}/[1-9][0-9]{0,7}$'),
    ADD COLUMN rate_limits jsonb NOT NULL DEFAULT '{}';
