-- claim_due.lua: claim up to N due runs of one queue for one worker, in priority order,
-- FIFO within a priority, issuing each a fencing token.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] now (ms)
-- ARGV[2] max runs to claim
-- ARGV[3] worker id
-- ARGV[4] lease duration (ms)
-- ARGV[5] max delayed runs to promote in this call
-- First attempts are counted for the queue's retry budget (budget_config in common.lua);
-- a `throttle` key (set while a dependency rate-limits) caps the claims per call.
-- Returns: {} if nothing is due or the queue is paused; else 10 fields per claimed run:
--   id, token, attempt, handler, payload, timeout_ms, max_retries, fire_time, trace,
--   gen (checkpoint generation: bumped by restart; older checkpoints are not read)
-- Errors: UNSTAMPED when the queue carries no epoch stamp written on this server process
--   (includes/common.lua, trusted_epoch): the dataset may have lost writes, so nothing
--   is claimed until the reconciler has rebuilt and stamped it.
-- Tokens are epoch * 2^40 + a per-queue counter, so they grow across failovers.
-- @include common
local epoch = trusted_epoch()
if not epoch then return redis.error_reply('UNSTAMPED') end
if redis.call('EXISTS', K_PAUSED) == 1 then return {} end
local now, want, worker, lease_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local _, _, budget_window = budget_config()
-- a rate-limited dependency throttles the queue: at most this many claims per call while it lasts
local throttle = redis.call('GET', BASE .. 'throttle')
if throttle then want = math.min(want, tonumber(throttle)) end

local ready = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))
for _, id in ipairs(ready) do
  local key = run_key(id)
  local f = redis.call('HMGET', key, 'state', 'priority')
  redis.call('ZREM', K_DELAYED, id)
  if f[1] == 'RETRY_WAIT' then
    transition(id, key, 'RETRY_WAIT', 'PENDING', 'due', now)
    redis.call('ZADD', K_DUE, due_score(f[2]), id)
  elseif f[1] == 'PENDING' then
    redis.call('ZADD', K_DUE, due_score(f[2]), id)
  end
end

local popped = redis.call('ZPOPMIN', K_DUE, want)
local count = #popped / 2
if count == 0 then return {} end
local last = redis.call('INCRBY', K_TOKEN, count)
local first = tonumber(epoch) * TOKEN_SPAN + last - count
local lease = now + lease_ms
local out = {}
local firsts = 0
for i = 1, count do
  local id = popped[2 * i - 1]
  local key = run_key(id)
  local f = redis.call('HMGET', key, 'state', 'attempt', 'handler', 'payload', 'timeout_ms',
                       'max_retries', 'fire_time', 'trace', 'gen', 'run_at')
  if f[1] == 'PENDING' then
    local attempt = (tonumber(f[2]) or 0) + 1
    if attempt == 1 then firsts = firsts + 1 end
    local token = string.format('%.0f', first + i)
    redis.call('HSET', key, 'attempt', attempt, 'token', token, 'worker', worker, 'lease_until', lease)
    transition(id, key, 'PENDING', 'RUNNING', 'claimed', now,
               {'attempt', attempt, 'token', token, 'worker', worker, 'lease', lease, 'due', f[10] or now})
    redis.call('ZADD', K_ACTIVE, lease, id)
    local n = #out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = id, token, attempt, f[3], f[4]
    out[n + 6], out[n + 7], out[n + 8], out[n + 9], out[n + 10] = f[5], f[6], f[7] or '', f[8] or '', f[9] or '0'
  end
  -- any other state: a leftover member of a run that moved on; dropping it is the repair
end
budget_count('a', now, budget_window, firsts)
if redis.call('ZCARD', K_DUE) > 0 then nudge() end
return out
