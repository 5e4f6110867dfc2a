-- breaker_record.lua: add a worker's outcomes for one dependency and move the breaker:
-- closed -> open when the failure rate over the window reaches the threshold (with at
-- least min_calls calls); half-open -> closed on a successful probe, -> open on a failed one.
-- Not a queue script: it touches one circuit breaker, shared by every worker.
-- KEYS[1] the breaker hash, KEYS[2] the probe lock, KEYS[3] the bucket key prefix
-- ARGV[1] now (ms), ARGV[2] successes, ARGV[3] failures, ARGV[4] probe result ('' | 'ok' | 'fail'),
-- ARGV[5] failure-rate threshold (0..1), ARGV[6] min calls, ARGV[7] window (ms), ARGV[8] cooldown (ms)
-- Returns: {mode, until}: the mode after this call and its opened_until (ms, 0 if never opened)
-- @keys state probe buckets
-- @argv now successes failures probe threshold min_calls window_ms cooldown_ms
-- @returns {mode until}
local now, ok, bad, probe = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local threshold, min_calls, window, cooldown = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
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
