-- resolve_run.lua: an operator reconciled a run from the review queue (a non-idempotent
-- side effect that may or may not have happened) and records what really happened:
-- FAILED -> SUCCEEDED, or FAILED -> FAILED (with the operator's reason, or resolved_failed;
-- either way the run's reason is no longer 'review', so it leaves the queue).
-- (Retrying it instead is retry_run.lua.)
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: run id, actor, reason, expected version ('' = any)  (see control_args; time is the server's),
--   ARGV[5] 'succeeded' or 'failed'
-- Returns: the new state
-- Errors: NO_RUN, STALE_VERSION, STATE <id> <current> resolve
-- @keys queue
-- @argv id actor reason expected outcome
-- @returns str
-- @include common
local now, id, key, st, who = control_args('resolve')
if st ~= 'FAILED' then refuse(id, st, 'resolve') end
redis.call('PERSIST', key)
if ARGV[5] == 'succeeded' then
  transition(id, key, st, 'SUCCEEDED', 'resolved', now, who)
  return 'SUCCEEDED'
end
if ARGV[3] == '' then who[4] = 'resolved_failed' end  -- the run's reason leaves 'review'
transition(id, key, st, 'FAILED', 'resolved', now, who)
return 'FAILED'
