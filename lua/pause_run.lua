-- pause_run.lua: park a run. PENDING / RETRY_WAIT -> PAUSED at once; RUNNING gets
-- pause_requested (ctl=pause): the worker sees it at its next heartbeat or checkpoint,
-- checkpoints, and finish_runs moves it to PAUSED, freeing the slot.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: run id, actor, reason, expected version ('' = any)  (see control_args; time is the server's)
-- Returns: 'PAUSED' or 'REQUESTED'
-- Errors: NO_RUN, STALE_VERSION, STATE <id> <current> pause (any other state)
-- @keys queue
-- @argv id actor reason expected
-- @returns str
-- @include common
local now, id, key, st, who = control_args('pause')
who[#who + 1] = 'ctl'; who[#who + 1] = 'pause'
if PAUSE_AT_ONCE[st] then
  unqueue(id, key)
  redis.call('ZREM', K_DELAYED, id)
  transition(id, key, st, 'PAUSED', 'paused', now, who)
  return 'PAUSED'
elseif st == 'RUNNING' then
  if redis.call('HGET', key, 'ctl') == 'pause' then return 'REQUESTED' end
  redis.call('HSET', key, 'ctl', 'pause')
  transition(id, key, st, 'RUNNING', 'pause_requested', now, who)
  return 'REQUESTED'
end
refuse(id, st, 'pause')
