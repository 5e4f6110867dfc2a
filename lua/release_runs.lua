-- release_runs.lua: a worker shutting down gives back runs it will not finish; they are
-- PENDING again at once (not counted as failures), each conditional on its token.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: pairs: run id, token
-- Returns: the number of runs released (a run whose token moved on is skipped).
-- @keys queue
-- @each id token
-- @returns int
-- @include common
local now = server_now_ms()
local released = 0
for i = 1, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local key = run_key(id)
  local f = redis.call('HMGET', key, 'state', 'token', 'attempt', 'worker', 'priority', 'tenant', 'ckey')
  if f[1] == 'RUNNING' and f[2] == token then
    redis.call('ZREM', K_ACTIVE, id)
    lease_done(id, key, f[7] or false)
    transition(id, key, 'RUNNING', 'PENDING', 'released', now,
               {'attempt', f[3], 'token', token, 'worker', f[4], 'outcome', 'released'})
    make_due(id, f[5], f[6], now)
    released = released + 1
  end
end
if released > 0 then nudge() end
return released
