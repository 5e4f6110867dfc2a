-- expire_finished.lua: once the recorder has committed a run's terminal state to
-- PostgreSQL, its Redis hash may expire. Conditional on the recorded version, so a run
-- that an operator retried in the meantime keeps its hash.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] ttl (ms), then pairs: run id, version the recorder committed
-- Returns: the number of hashes given a TTL.
-- @keys queue
-- @argv ttl_ms
-- @each id version
-- @returns int
-- @include common
local ttl = tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV, 2 do
  local key = run_key(ARGV[i])
  local f = redis.call('HMGET', key, 'state', 'version')
  if f[2] == ARGV[i + 1] and TERMINAL[f[1]] then
    redis.call('PEXPIRE', key, ttl)
    n = n + 1
  end
end
return n
