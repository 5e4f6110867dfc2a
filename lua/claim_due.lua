-- claim_due.lua: claim up to N due runs of one queue for one worker, issuing each a
-- fencing token. Order: weighted fair between tenants, then priority with aging, FIFO
-- within a priority (includes/common.lua, "Dispatch order"). Concurrency limits: at most
-- config 'max_running' runs of the queue leased at once, and at most a key's limit of the
-- runs sharing a concurrency key; a run whose key is full is held aside (not claimed, not
-- rescanned) until a lease of that key ends. Rate limits (includes/common.lua "Rate limits"): at
-- most N starts per interval for the queue (caps the runs claimed per call) and per rate key
-- (a run over its key's window is held aside until the window frees), on the server's clock.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] max runs to claim
-- ARGV[2] worker id
-- ARGV[3] lease duration (ms)
-- ARGV[4] max delayed runs to promote in this call
-- ARGV[5] deadline (ms, the server's clock as the caller estimates it; '' = none): a claim that
--   runs after it (its caller stopped waiting: a healed partition, a re-sent command) claims
--   nothing and replies LATE_CLAIM (docs/clock.md). Leases, due times and rate windows are all
--   on the server's clock (includes/clock.lua); the caller's clock is not used.
-- First attempts are counted for the queue's retry budget (budget_config in common.lua);
-- a `throttle` key (set while a dependency rate-limits) caps the claims per call.
-- Returns: {} if nothing is due or the queue is paused; else 10 fields per claimed run:
--   id, token, attempt, handler, payload, timeout_ms, max_retries, fire_time, trace,
--   gen (checkpoint generation: bumped by restart; older checkpoints are not read)
-- Errors: LATE_CLAIM <server now> <deadline> (nothing claimed; counted in stats.late_claim);
--   UNSTAMPED when the queue carries no epoch stamp written on this server process
--   (includes/common.lua, trusted_epoch): the dataset may have lost writes, so nothing
--   is claimed until the reconciler has rebuilt and stamped it.
-- Tokens are epoch * 2^40 + a per-queue counter, so they grow across failovers.
-- A claimed event carries `rts` (the server's clock, ms) when a rate limit was in play.
-- @keys queue
-- @argv limit worker lease_ms promote deadline
-- @returns [id token attempt handler payload timeout_ms max_retries fire_time trace gen]
-- @include common
local now = server_now_ms()
local deadline = tonumber(ARGV[5])
if deadline and now > deadline then
  redis.call('HINCRBY', K_STATS, 'late_claim', 1)
  return redis.error_reply('LATE_CLAIM ' .. now .. ' ' .. ARGV[5])
end
local epoch = trusted_epoch()
if not epoch then return redis.error_reply('UNSTAMPED') end
if redis.call('EXISTS', K_PAUSED) == 1 then return {} end
local want, worker, lease_ms = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local _, _, budget_window = budget_config()
-- a rate-limited dependency throttles the queue: at most this many claims per call while it lasts
local throttle = redis.call('GET', BASE .. KEY.throttle)
if throttle then want = math.min(want, tonumber(throttle)) end
local ready = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
for _, id in ipairs(ready) do
  local key = run_key(id)
  local f = redis.call('HMGET', key, 'state', 'priority', 'tenant')
  redis.call('ZREM', K_DELAYED, id)
  if f[1] == 'RETRY_WAIT' then
    transition(id, key, 'RETRY_WAIT', 'PENDING', 'due', now)
    make_due(id, f[2], f[3], now)
  elseif f[1] == 'PENDING' then
    make_due(id, f[2], f[3], now)
  end
end
-- runs put into K_DUE by an older version (or a repair) still need their tenant entry
if not activated[''] and redis.call('EXISTS', K_DUE) == 1 then activate('') end
-- the queue-wide limit counts every leased run (checked after promoting delayed runs)
local max_running = queue_config()[4]
if max_running then
  want = math.min(want, max_running - redis.call('ZCARD', K_ACTIVE))
  if want <= 0 then return {} end
end
-- rate limits: held runs whose key's window has room go back to due first; the queue-wide
-- window caps this call (and, when full, says when to try again)
local rnow = nil  -- `now` once a rate limit is in play (the claimed event then carries it as rts)
if redis.call('EXISTS', K_RWAIT) == 1 or queue_config()[6] then
  rnow = now
  rate_release(rnow, 100)
end
local qrate = rnow and rate_state('', queue_config()[6], rnow)
if qrate then
  if rate_full(qrate, rnow) then
    if redis.call('EXISTS', K_TENANTS) == 1 then
      redis.call('ZADD', K_RWAIT, 'LT', rate_free_at(qrate, rnow), '')
      redis.call('HINCRBY', K_STATS, 'rate_limited', 1)
    end
    return {}
  end
  if qrate.n - qrate.used < want then rate_exact(qrate, rnow) end
  want = math.min(want, qrate.n - qrate.used)
end

local weights = {}
-- Pop up to n runs in fair order: {id, score, id, score, ...}.
local function pop_fair(n)
  local top = redis.call('ZRANGE', K_TENANTS, 0, 1, 'WITHSCORES')
  if #top == 2 then  -- one tenant: its own order, nothing to share
    local popped = redis.call('ZPOPMIN', tenant_due(top[1]), n)
    if redis.call('EXISTS', tenant_due(top[1])) == 0 then deactivate(top[1]) end
    return popped
  end
  local out = {}
  local vnext = nil
  while #out < 2 * n and #top >= 2 do
    local t, v = top[1], tonumber(top[2])
    local w = weights[t]
    if not w then
      w = tonumber(redis.call('HGET', K_WEIGHTS, t) or '') or 1
      if w <= 0 then w = 1 end  -- only fairness.set_weight writes weights; never divide by garbage
      weights[t] = w
    end
    local k = n - #out / 2
    -- serve the smallest tenant until it passes the next one (a run per 1 / weight)
    if #top >= 4 then k = math.min(k, math.floor((tonumber(top[4]) - v) * w) + 1) end
    local z = tenant_due(t)
    local popped = redis.call('ZPOPMIN', z, k)
    for i = 1, #popped do out[#out + 1] = popped[i] end
    local got = #popped / 2
    if got < k or redis.call('EXISTS', z) == 0 then
      deactivate(t)
    else
      redis.call('ZADD', K_TENANTS, v + got / w, t)
    end
    vnext = v + got / w
    top = redis.call('ZRANGE', K_TENANTS, 0, 1, 'WITHSCORES')
  end
  if vnext then
    -- newcomers start level with the furthest-behind active tenant, never ahead of it
    local low = redis.call('ZRANGE', K_TENANTS, 0, 0, 'WITHSCORES')
    redis.call('HSET', K_FAIR, 'v', string.format('%.6f', tonumber(low[2] or vnext)))
  end
  return out
end

local limits = {}
-- Whether a run of this key may take a lease now; drops members of the key's set that
-- are no longer leased (derived state repairs itself at the limit).
local function slot_free(ckey)
  local limit = limits[ckey]
  if not limit then
    limit = key_limit(ckey)
    limits[ckey] = limit
  end
  if limit <= 0 then return true end
  local set = ck_key(ckey)
  if redis.call('SCARD', set) < limit then return true end
  for _, m in ipairs(redis.call('SMEMBERS', set)) do
    local st = redis.call('HGET', run_key(m), 'state')
    if not ACTIVE[st] then redis.call('SREM', set, m) end
  end
  return redis.call('SCARD', set) < limit
end

local token_base = nil
local lease = now + lease_ms
local out = {}
local leased = {}  -- lease, id, ...: K_ACTIVE gets every claimed run in one ZADD at the end
local firsts, claimed, rounds, rate_held = 0, 0, 0, 0
while claimed < want and rounds < 4 do
  rounds = rounds + 1
  local popped = pop_fair(want - claimed)
  local count = #popped / 2
  if count == 0 then break end
  for i = 1, count do
    local id = popped[2 * i - 1]
    local key = run_key(id)
    local f = redis.call('HMGET', key, 'state', 'attempt', 'handler', 'payload', 'timeout_ms',
                         'max_retries', 'fire_time', 'trace', 'gen', 'run_at', 'ckey', 'rkey', 'rlimit', 'version')
    if f[1] == 'PENDING' then
      local rate = false
      if f[12] then
        rnow = now
        rate = rate_state(f[12], f[13], rnow)
      end
      if f[11] and not slot_free(f[11]) then
        hold(id, f[11], popped[2 * i])
      elseif rate and rate_full(rate, rnow) then
        rate_hold(id, f[12], popped[2 * i], rate, rnow)
        rate_held = rate_held + 1
      else
        if f[11] then redis.call('SADD', ck_key(f[11]), id) end
        if not token_base then token_base = tonumber(epoch) * TOKEN_SPAN + redis.call('INCRBY', K_TOKEN, want) - want end
        claimed = claimed + 1
        local attempt = (tonumber(f[2]) or 0) + 1
        if attempt == 1 then firsts = firsts + 1 end
        if rate then rate_start(rate, id .. ':' .. attempt, rnow) end
        if qrate then rate_start(qrate, id .. ':' .. attempt, rnow) end
        local token = string.format('%.0f', token_base + claimed)
        local ev = {'attempt', attempt, 'token', token, 'worker', worker, 'lease', lease, 'due', f[10] or now}
        if rnow then ev[#ev + 1], ev[#ev + 2] = 'rts', rnow end  -- the start as a rate window counts it
        transition(id, key, 'PENDING', 'RUNNING', 'claimed', now, ev,
                   {'attempt', attempt, 'token', token, 'worker', worker, 'lease_until', lease, 'started', now}, f[14])
        leased[#leased + 1], leased[#leased + 2] = lease, id
        local n = #out
        out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = id, token, attempt, f[3], f[4]
        out[n + 6], out[n + 7], out[n + 8], out[n + 9], out[n + 10] = f[5], f[6], f[7] or '', f[8] or '', f[9] or '0'
      end
    end
    -- any other state: a leftover member of a run that moved on; dropping it is the repair
  end
end
for i = 1, #leased, 1000 do
  redis.call('ZADD', K_ACTIVE, unpack(leased, i, math.min(i + 999, #leased)))
end
if token_base and claimed < want then redis.call('DECRBY', K_TOKEN, want - claimed) end  -- tokens stay dense
budget_count('a', now, budget_window, firsts)
if rate_held > 0 then redis.call('HINCRBY', K_STATS, 'rate_limited', rate_held) end
if redis.call('EXISTS', K_TENANTS) == 1 then nudge() end
return out
