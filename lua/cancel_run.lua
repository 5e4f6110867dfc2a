-- cancel_run.lua: PENDING / PAUSED / RETRY_WAIT / BLOCKED / STOPPED -> CANCELLED at once;
-- RUNNING -> STOPPING with ctl=cancel (stop, then CANCELLED when the worker lets go);
-- STOPPING -> ctl=cancel.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: run id, actor, reason, expected version ('' = any)  (see control_args; time is the server's),
--   ARGV[5] compensation handler ('' = none): recorded on the cancelled event when the
--   run had started (attempt > 0), so the recorder enqueues it and flags the run
--   needs_compensation. Nothing claims a rollback that did not happen.
-- Returns: 'CANCELLED' or 'STOPPING'
-- Errors: NO_RUN, STALE_VERSION, STATE <id> <current> cancel (terminal states)
-- @keys queue
-- @argv id actor reason expected compensate
-- @returns str
-- @include common
local now, id, key, st, who = control_args('cancel')
who[#who + 1] = 'ctl'; who[#who + 1] = 'cancel'
local compensate = ARGV[5]
local started = tonumber(redis.call('HGET', key, 'attempt') or '0') > 0
-- the compensate field is written only by a cancel that is accepted: a refused one changes nothing
local function remember() if compensate ~= '' and started then redis.call('HSET', key, 'compensate', compensate) end end
if CANCEL_AT_ONCE[st] then
  unqueue(id, key)
  redis.call('ZREM', K_DELAYED, id)
  if compensate ~= '' and started then
    who[#who + 1] = 'compensate'; who[#who + 1] = compensate
  end
  remember()
  transition(id, key, st, 'CANCELLED', 'cancelled', now, who)
  return 'CANCELLED'
elseif st == 'RUNNING' then
  remember()
  redis.call('HSET', key, 'ctl', 'cancel')
  transition(id, key, st, 'STOPPING', 'stop_requested', now, who)
  return 'STOPPING'
elseif st == 'STOPPING' then
  remember()
  redis.call('HSET', key, 'ctl', 'cancel')
  transition(id, key, st, 'STOPPING', 'cancel_requested', now, who)
  return 'STOPPING'
end
refuse(id, st, 'cancel')
