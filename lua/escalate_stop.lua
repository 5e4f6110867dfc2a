-- escalate_stop.lua: a run asked to stop (or cancel) did not let go within its grace
-- period; record the escalation before the worker kills it (process model) or gives it
-- up (thread model: the slot is counted as leaked).
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] run id, ARGV[2] token, ARGV[3] worker id, ARGV[4] grace (s)
-- Returns: 1 if recorded, 0 if the token no longer owns a STOPPING run.
-- @keys queue
-- @argv id token worker grace
-- @returns bool
-- @include common
local now, id, token = server_now_ms(), ARGV[1], ARGV[2]
local key = run_key(id)
local f = redis.call('HMGET', key, 'state', 'token', 'attempt')
if f[1] ~= 'STOPPING' or f[2] ~= token then return 0 end
transition(id, key, 'STOPPING', 'STOPPING', 'stop_escalated', now,
           {'attempt', f[3], 'token', token, 'worker', ARGV[3], 'actor', 'worker',
            'reason', 'no response within ' .. ARGV[4] .. 's grace period'})
return 1
