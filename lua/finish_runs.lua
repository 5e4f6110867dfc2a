-- finish_runs.lua: record the outcome of many attempts of one queue, each conditional
-- on its fencing token.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] crashes after which a run is quarantined (FAILED, reason quarantined)
-- then 6 per item: run id, token, outcome, data, error class, retry delay (ms)
-- The queue's retry budget comes from its config hash (budget_config in common.lua):
-- beyond it a retry is delayed by half a window more (reason retry_budget_exhausted;
-- stats.budget_exhausted counts it).
--   outcome: ok (data = encoded result) | error | fatal (never retried) | timeout | crash
--   | review (non-idempotent side effect failed: FAILED, reason review, for an operator)
--   | policy (authorization/policy: FAILED, reason policy) | deferred (an open circuit
--   breaker: RETRY_WAIT after the delay, not counted as a failure)
--   (data = error message) | interrupted (the handler let go at a safe boundary; data =
--   'forced' when the worker had to kill it after the stop grace period). The delay is
--   computed by the caller (backoff + full jitter) and counted from the server's clock.
--   An interrupted run goes where the operator asked (ctl): pause -> PAUSED, stop ->
--   STOPPED, cancel -> CANCELLED; with no request (worker shutdown) it is PENDING again.
-- Returns: one entry per item: the run's new state, or 'STALE' when the token is not
--   the run's current one (nothing changes; counted in stats.stale_finish).
-- @keys queue
-- @argv quarantine
-- @each id token outcome data error_class delay_ms
-- @returns [state]
-- @include common
local now, quarantine = server_now_ms(), tonumber(ARGV[1])
local ratio, floor_, window = budget_config()
local out = {}
local unleased = {}  -- every finished run leaves K_ACTIVE in one ZREM at the end
for i = 2, #ARGV, 6 do
  local id, token, outcome, data, eclass, delay = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], tonumber(ARGV[i + 5])
  local key = run_key(id)
  local f = redis.call('HMGET', key, 'state', 'token', 'attempt', 'max_retries', 'worker', 'ctl', 'compensate', 'priority', 'tenant', 'ckey',
                       'version', 'started')
  local st = f[1]
  if not ACTIVE[st] or f[2] ~= token then
    redis.call('HINCRBY', K_STATS, 'stale_finish', 1)
    out[#out + 1] = 'STALE'
  else
    unleased[#unleased + 1] = id
    lease_done(id, key, f[10] or false)
    -- the attempt's start (claim_due's ts): the recorder finds the attempt's row in its partition by it
    local base = {'attempt', f[3], 'token', token, 'worker', f[5]}
    if f[12] then base[#base + 1] = 'started'; base[#base + 1] = f[12] end
    if outcome == 'interrupted' then
      local ctl = f[6]
      redis.call('HDEL', key, 'ctl')
      if data == 'forced' then base[#base + 1] = 'forced'; base[#base + 1] = '1' end
      if st == 'RUNNING' and ctl == 'pause' then
        base[#base + 1] = 'outcome'; base[#base + 1] = 'paused'
        transition(id, key, st, 'PAUSED', 'paused', now, base)
        out[#out + 1] = 'PAUSED'
      elseif st == 'STOPPING' and ctl == 'cancel' then
        base[#base + 1] = 'outcome'; base[#base + 1] = 'cancelled'
        if f[7] then base[#base + 1] = 'compensate'; base[#base + 1] = f[7] end
        transition(id, key, st, 'CANCELLED', 'cancelled', now, base)
        out[#out + 1] = 'CANCELLED'
      elseif st == 'STOPPING' then
        base[#base + 1] = 'outcome'; base[#base + 1] = 'stopped'
        transition(id, key, st, 'STOPPED', 'stopped', now, base)
        out[#out + 1] = 'STOPPED'
      else
        base[#base + 1] = 'outcome'; base[#base + 1] = 'released'
        transition(id, key, st, 'PENDING', 'released', now, base)
        make_due(id, f[8], f[9], now)
        nudge()
        out[#out + 1] = 'PENDING'
      end
    elseif outcome == 'ok' then
      if f[6] then redis.call('HDEL', key, 'ctl') end
      base[#base + 1] = 'result'; base[#base + 1] = data
      transition(id, key, st, 'SUCCEEDED', 'succeeded', now, base, {'result', data}, f[11])
      out[#out + 1] = 'SUCCEEDED'
    else
      local fails = 0
      if outcome == 'deferred' then
        fails = tonumber(redis.call('HGET', key, 'fails') or '0')
      else
        fails = redis.call('HINCRBY', key, 'fails', 1)
      end
      local reason = 'retries_exhausted'
      if outcome == 'fatal' or outcome == 'timeout' or outcome == 'review' or outcome == 'policy' then
        reason = outcome
      end
      if outcome == 'crash' and redis.call('HINCRBY', key, 'crashes', 1) >= quarantine then
        reason = 'quarantined'
      end
      redis.call('HSET', key, 'error_class', eclass, 'error', data)
      for _, v in ipairs({'outcome', outcome, 'error_class', eclass, 'error', data}) do base[#base + 1] = v end
      local retry = st == 'RUNNING' and outcome ~= 'fatal' and outcome ~= 'review' and outcome ~= 'policy'
                    and reason ~= 'quarantined' and (fails <= tonumber(f[4]) or outcome == 'deferred')
      if retry and f[6] == 'pause' then
        -- the operator asked for a pause: park it instead of retrying (resume decides)
        redis.call('HDEL', key, 'ctl')
        base[#base + 1] = 'reason'; base[#base + 1] = 'paused_after_error'
        transition(id, key, 'RUNNING', 'PAUSED', 'paused', now, base)
        out[#out + 1] = 'PAUSED'
      elseif retry then
        if outcome == 'deferred' then
          base[#base + 1] = 'reason'; base[#base + 1] = 'breaker_open'
        elseif not budget_allows(now, ratio, floor_, window) then
          delay = delay + math.floor(window / 2)
          redis.call('HINCRBY', K_STATS, 'budget_exhausted', 1)
          base[#base + 1] = 'reason'; base[#base + 1] = 'retry_budget_exhausted'
        end
        if outcome ~= 'deferred' then budget_count('r', now, window, 1) end
        local run_at = now + delay
        redis.call('HSET', key, 'run_at', run_at)
        redis.call('ZADD', K_DELAYED, run_at, id)
        -- idle workers sleep until the earliest delayed run they know of: wake one for an earlier one
        if redis.call('ZRANGE', K_DELAYED, 0, 0)[1] == id then nudge() end
        base[#base + 1] = 'run_at'; base[#base + 1] = run_at
        transition(id, key, 'RUNNING', 'RETRY_WAIT', 'retry_scheduled', now, base)
        out[#out + 1] = 'RETRY_WAIT'
      else
        local to, event = 'FAILED', 'failed'
        if outcome == 'timeout' and st == 'RUNNING' then to, event = 'TIMED_OUT', 'timed_out' end
        base[#base + 1] = 'reason'; base[#base + 1] = reason
        transition(id, key, st, to, event, now, base)
        out[#out + 1] = to
      end
    end
  end
end
for i = 1, #unleased, 1000 do
  redis.call('ZREM', K_ACTIVE, unpack(unleased, i, math.min(i + 999, #unleased)))
end
return out
