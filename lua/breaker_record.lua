-- breaker_record.lua: add a worker's outcomes for one dependency and move the breaker:
-- closed -> open when the failure rate over the window reaches the threshold (with at
-- least min_calls calls); half-open -> closed on a successful probe, -> open on a failed one.
-- Not a queue script: it touches one circuit breaker, shared by every worker.
-- KEYS[1] the breaker hash, KEYS[2] the probe lock, KEYS[3] the bucket key prefix
-- ARGV[1] successes, ARGV[2] failures, ARGV[3] probe result ('' | 'ok' | 'fail'),
-- ARGV[4] failure-rate threshold (0..1), ARGV[5] min calls, ARGV[6] window (ms), ARGV[7] cooldown (ms)
-- Windows and cooldowns are on the Redis server's clock (includes/clock.lua).
-- Returns: {mode, until}: the mode after this call and its opened_until (ms, 0 if never opened)
-- @keys state probe buckets
-- @argv successes failures probe threshold min_calls window_ms cooldown_ms
-- @returns {mode until}
-- @include clock
local now, ok, bad, probe = server_now_ms(), tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local threshold, min_calls, window, cooldown = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local width = math.max(math.floor(window / 10), 1)
local bucket = math.floor(now / width)
if ok > 0 then
  redis.call('HINCRBY', KEYS[3] .. 's:' .. bucket, 'n', ok)
  redis.call('PEXPIRE', KEYS[3] .. 's:' .. bucket, window + width)
end
if bad > 0 then
  redis.call('HINCRBY', KEYS[3] .. 'f:' .. bucket, 'n', bad)
  redis.call('PEXPIRE', KEYS[3] .. 'f:' .. bucket, window + width)
end
local state = redis.call('HGET', KEYS[1], 'mode') or 'closed'
if probe == 'ok' then
  redis.call('HSET', KEYS[1], 'mode', 'closed', 'opened_until', 0)
  redis.call('DEL', KEYS[2])
  for i = 0, 9 do redis.call('DEL', KEYS[3] .. 'f:' .. (bucket - i)) end
  return {'closed', 0}
elseif probe == 'fail' then
  redis.call('HSET', KEYS[1], 'mode', 'open', 'opened_until', now + cooldown)
  redis.call('DEL', KEYS[2])
  return {'open', now + cooldown}
end
if state == 'closed' then
  local s, f = 0, 0
  for i = 0, 9 do
    s = s + tonumber(redis.call('HGET', KEYS[3] .. 's:' .. (bucket - i), 'n') or '0')
    f = f + tonumber(redis.call('HGET', KEYS[3] .. 'f:' .. (bucket - i), 'n') or '0')
  end
  if s + f >= min_calls and f >= threshold * (s + f) then
    redis.call('HSET', KEYS[1], 'mode', 'open', 'opened_until', now + cooldown)
    return {'open', now + cooldown}
  end
end
return {state, tonumber(redis.call('HGET', KEYS[1], 'opened_until') or '0')}
