-- breaker_check.lua: may a run that needs this dependency start now?
-- Not a queue script: it touches one circuit breaker, shared by every worker.
-- KEYS[1] the breaker hash {mode, opened_until} (fencepost.core.keys.breaker_keys)
-- KEYS[2] the half-open probe lock (same hash tag)
-- ARGV[1] probe timeout (ms); times are the Redis server's (includes/clock.lua)
-- Returns: {'closed', 0} run it | {'open', until_ms} defer it until then |
--   {'probe', 0} run it as the half-open probe (its outcome closes or re-opens the breaker)
-- @keys state probe
-- @argv probe_ms
-- @returns {mode until}
-- @include clock
local now, probe_ms = server_now_ms(), tonumber(ARGV[1])
local f = redis.call('HMGET', KEYS[1], 'mode', 'opened_until')
local state, opened_until = f[1] or 'closed', tonumber(f[2] or '0')
if state == 'closed' then return {'closed', 0} end
if now < opened_until then return {'open', opened_until} end
if redis.call('SET', KEYS[2], now, 'NX', 'PX', probe_ms) then
  redis.call('HSET', KEYS[1], 'mode', 'half_open')
  return {'probe', 0}
end
return {'open', now + math.min(probe_ms, 5000)}  -- a probe is out: look again soon
