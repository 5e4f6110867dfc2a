-- stop_run.lua: ask a running run to stop gracefully. RUNNING -> STOPPING (ctl=stop);
-- the worker interrupts the handler at its next checkpoint (or it polls should_stop),
-- the handler checkpoints, and finish_runs moves it to STOPPED. Past the grace period
-- the worker escalates (kills a process job; STOPPED forced).
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: run id, actor, reason, expected version ('' = any)  (see control_args; time is the server's)
-- Returns: 'STOPPING'
-- Errors: NO_RUN, STALE_VERSION, STATE <id> <current> stop
-- @keys queue
-- @argv id actor reason expected
-- @returns str
-- @include common
local now, id, key, st, who = control_args('stop')
who[#who + 1] = 'ctl'; who[#who + 1] = 'stop'
if st == 'RUNNING' then
  redis.call('HSET', key, 'ctl', 'stop')
  transition(id, key, st, 'STOPPING', 'stop_requested', now, who)
  return 'STOPPING'
end
refuse(id, st, 'stop')
