-- restart_run.lua: run again from the beginning, discarding the checkpoint:
-- PAUSED / STOPPED / FAILED / TIMED_OUT / CANCELLED -> PENDING. The checkpoint
-- generation (gen) is bumped, so no attempt of this run reads an older checkpoint.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: run id, actor, reason, expected version ('' = any)  (see control_args; time is the server's)
-- Returns: 'PENDING'
-- Errors: NO_RUN, STALE_VERSION, STATE <id> <current> restart
-- @keys queue
-- @argv id actor reason expected
-- @returns str
-- @include common
local now, id, key, st, who = control_args('restart')
if RESTARTABLE[st] then
  redis.call('PERSIST', key)
  redis.call('HDEL', key, 'ctl', 'compensate', 'result', 'error', 'error_class')
  redis.call('HSET', key, 'fails', 0, 'crashes', 0)
  local gen = redis.call('HINCRBY', key, 'gen', 1)
  who[#who + 1] = 'gen'; who[#who + 1] = gen
  local f = redis.call('HMGET', key, 'priority', 'tenant')
  transition(id, key, st, 'PENDING', 'restarted', now, who)
  make_due(id, f[1], f[2], now)
  nudge()
  return 'PENDING'
end
refuse(id, st, 'restart')
