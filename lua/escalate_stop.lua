-- escalate_stop.lua: a run asked to stop (or cancel) did not let go within its grace
-- period; record the escalation before the worker kills it (process model) or gives it
-- up (thread model: the slot is counted as leaked).
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] now (ms), ARGV[2] run id, ARGV[3] token, ARGV[4] worker id, ARGV[5] grace (s)
-- Returns: 1 if recorded, 0 if the token no longer owns a STOPPING run.
-- @keys queue
-- @argv now id token worker grace
-- @returns bool
-- @include common
local now, id, token = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local key = run_key(id)
local f = redis.call('HMGET', key, 'state', 'token', 'attempt')
if f[1] ~= 'STOPPING' or f[2] ~= token then return 0 end
transition(id, key, 'STOPPING', 'STOPPING', 'stop_escalated', now,
           {'attempt', f[3], 'token', token, 'worker', ARGV[4], 'actor', 'worker',
            'reason', 'no response within ' .. ARGV[5] .. 's grace period'})
return 1
