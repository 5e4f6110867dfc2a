-- run_now.lua: an operator makes a waiting run due now, in one transition: a delayed PENDING run
-- (scheduled for later) or a RETRY_WAIT run gets the server's now as its due time (run_at) and
-- goes into its tenant's due set, event `run_now` (actor, reason, run_at). One compare-and-set
-- on the run's version, so of a run_now racing a claim, a pause, a resume or another run_now,
-- exactly one takes effect; a run already due (or held for a slot) is refused, never doubled.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: run id, actor, reason, expected version ('' = any)  (see control_args; time is the server's)
-- Returns: 'PENDING'
-- Errors: NO_RUN, STALE_VERSION, STATE <id> <current> run_now (any other state, or PENDING and due)
-- @keys queue
-- @argv id actor reason expected
-- @returns str
-- @include common
local now, id, key, st, who = control_args('run_now')
if PAUSE_AT_ONCE[st] and (st == 'RETRY_WAIT' or redis.call('ZSCORE', K_DELAYED, id)) then
  redis.call('ZREM', K_DELAYED, id)
  redis.call('HSET', key, 'run_at', now)
  local f = redis.call('HMGET', key, 'priority', 'tenant')
  who[#who + 1] = 'run_at'; who[#who + 1] = now
  transition(id, key, st, 'PENDING', 'run_now', now, who)
  make_due(id, f[1], f[2], now)
  nudge()
  return 'PENDING'
end
refuse(id, st, 'run_now')
