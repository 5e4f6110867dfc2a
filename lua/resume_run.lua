-- resume_run.lua: PAUSED / STOPPED -> PENDING, same run id; the next claim is a new
-- attempt with a new token that starts from the latest committed checkpoint. Resume is
-- a state transition, not a new enqueue: of two racing resumes exactly one wins.
-- (Checkpoint schema and input checks happen in the client before this call.)
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: run id, actor, reason, expected version ('' = any)  (see control_args; time is the server's)
-- Returns: 'PENDING'
-- Errors: NO_RUN, STALE_VERSION, STATE <id> <current> resume
-- @keys queue
-- @argv id actor reason expected
-- @returns str
-- @include common
local now, id, key, st, who = control_args('resume')
if RESUMABLE[st] then
  redis.call('HDEL', key, 'ctl')
  local f = redis.call('HMGET', key, 'priority', 'tenant')
  transition(id, key, st, 'PENDING', 'resumed', now, who)
  make_due(id, f[1], f[2], now)
  nudge()
  return 'PENDING'
end
refuse(id, st, 'resume')
