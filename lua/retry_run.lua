-- retry_run.lua: an operator retries a dead-lettered run: FAILED / TIMED_OUT /
-- CANCELLED -> PENDING with fresh retry and crash budgets, keeping its checkpoint.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: now, run id, actor, reason, expected version ('' = any)  (see control_args)
-- Returns: 'PENDING'
-- Errors: NO_RUN, STALE_VERSION, STATE <id> <current> retry
-- @include common
local now, id, key, st, who = control_args('retry')
if st == 'FAILED' or st == 'TIMED_OUT' or st == 'CANCELLED' then
  redis.call('PERSIST', key)
  redis.call('HDEL', key, 'ctl', 'compensate', 'result')
  redis.call('HSET', key, 'fails', 0, 'crashes', 0)
  local prio = redis.call('HGET', key, 'priority')
  transition(id, key, st, 'PENDING', 'retried', now, who)
  redis.call('ZADD', K_DUE, due_score(prio), id)
  nudge()
  return 'PENDING'
end
refuse(id, st, 'retry')
