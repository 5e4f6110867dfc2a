-- 006_tenants_limits: fair sharing between tenants and concurrency limits.
-- A run may name a tenant (dispatch is weighted-fair between a queue's tenants) and a
-- concurrency key with its default limit (at most that many runs of the key leased at
-- once). Redis enforces both in claim_due.lua; these columns let a rebuild restore them.
ALTER TABLE runs
    ADD COLUMN tenant text NOT NULL DEFAULT '',
    ADD COLUMN concurrency_key text,
    ADD COLUMN concurrency_limit integer CHECK (concurrency_limit BETWEEN 1 AND 1000000),
    ADD CONSTRAINT limit_with_key CHECK ((concurrency_key IS NULL) = (concurrency_limit IS NULL));

-- Operator settings of a queue (fencepost queue ...), the record Redis's copies are
-- rebuilt from: tenant weights, per-key limit overrides, a queue-wide limit on leased runs,
-- and the priority aging step.
ALTER TABLE queues
    ADD COLUMN weights jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN limits jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN max_running integer CHECK (max_running BETWEEN 1 AND 1000000),
    -- at most 30 days: the clock (~1.8e15 us) plus 255 steps must stay an exact double (< 2^53)
    ADD COLUMN priority_age_ms bigint CHECK (priority_age_ms BETWEEN 1 AND 2592000000);
