-- retry_run.lua: an operator retries a dead-lettered run: FAILED / TIMED_OUT /
-- CANCELLED -> PENDING with fresh retry and crash budgets, keeping its checkpoint.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: run id, actor, reason, expected version ('' = any)  (see control_args; time is the server's)
-- Returns: 'PENDING'
-- Errors: NO_RUN, STALE_VERSION, STATE <id> <current> retry
-- @keys queue
-- @argv id actor reason expected
-- @returns str
-- @include common
local now, id, key, st, who = control_args('retry')
if FAILED_FOR_GOOD[st] then
  redis.call('PERSIST', key)
  redis.call('HDEL', key, 'ctl', 'compensate', 'result')
  redis.call('HSET', key, 'fails', 0, 'crashes', 0)
  local f = redis.call('HMGET', key, 'priority', 'tenant')
  transition(id, key, st, 'PENDING', 'retried', now, who)
  make_due(id, f[1], f[2], now)
  nudge()
  return 'PENDING'
end
refuse(id, st, 'retry')
