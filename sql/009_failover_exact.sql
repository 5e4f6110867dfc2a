-- 009: failover-exact executions (issue 13).
-- After Redis loses writes, a run the lost dataset may have claimed gets an attempt row with
-- outcome 'unknown' (error_class 'RedisLost') before it is claimed again, so attempt numbers
-- are never reused and the attempts table never undercounts executions. Such a row has no
-- token of its own (token 0): any token the lost dataset issued is below the new epoch's.
DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'attempts'::regclass AND contype = 'c'
               AND pg_get_constraintdef(oid) LIKE '%outcome = ANY%'
    LOOP
        EXECUTE format('ALTER TABLE attempts DROP CONSTRAINT %I', c.conname);
    END LOOP;
END $$;
ALTER TABLE attempts ADD CONSTRAINT attempts_outcome_known CHECK (outcome IN (
    'succeeded', 'error', 'fatal', 'timeout', 'crash', 'review', 'policy', 'deferred', 'interrupted', 'released',
    'paused', 'stopped', 'cancelled', 'unknown'));
