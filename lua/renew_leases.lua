-- renew_leases.lua: extend many leases of one queue in one call (the heartbeat).
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] lease duration (ms, from the server's clock now), then pairs: run id, token
-- Returns: one entry per pair:
--   0        lost: the run's token differs or it is no longer RUNNING/STOPPING; abandon it
--   1        renewed
--   'pause' | 'stop' | 'cancel'   renewed, and an operator asked for that (control flag)
-- @keys queue
-- @argv lease_ms
-- @each id token
-- @returns [result]
-- @include common
local now, lease_ms = server_now_ms(), tonumber(ARGV[1])
local lease = now + lease_ms
local out = {}
local leased = {}  -- lease, id, ...: one ZADD for the call (every renewed lease ends at the same time)
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local key = run_key(id)
  local f = redis.call('HMGET', key, 'state', 'token', 'ctl')
  if ACTIVE[f[1]] and f[2] == token then
    redis.call('HSET', key, 'lease_until', lease)
    leased[#leased + 1], leased[#leased + 2] = lease, id
    out[#out + 1] = f[3] or 1
  else
    out[#out + 1] = 0
  end
end
for i = 1, #leased, 1000 do
  redis.call('ZADD', K_ACTIVE, unpack(leased, i, math.min(i + 999, #leased)))
end
return out
