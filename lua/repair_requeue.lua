-- repair_requeue.lua: put runs back into the sorted set their state needs (drift repair):
-- a PENDING run in neither due nor delayed, a RETRY_WAIT run not in delayed, or a leased
-- run not in active would never be claimed, promoted or reaped.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: pairs: run id, version the reconciler read
-- Returns: the ids put back. A run whose version moved on, or that is already in its set,
--   is skipped (compare-and-set). No event and no transition: the state does not change.
-- Errors: none.
-- @keys queue
-- @each id version
-- @returns [int]
-- @include common
local now = server_now_ms()
local out = {}
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  local f = redis.call('HMGET', run_key(id), 'state', 'version', 'run_at', 'priority', 'lease_until', 'tenant', 'ckey')
  if f[2] == ARGV[i + 1] then
    local st = f[1]
    local in_due = queued(id, run_key(id))
    local in_delayed = redis.call('ZSCORE', K_DELAYED, id)
    local fixed = false
    if st == 'PENDING' and not in_due and not in_delayed then
      local run_at = tonumber(f[3]) or 0
      if run_at > now then
        redis.call('ZADD', K_DELAYED, run_at, id)
      else
        make_due(id, f[4], f[6], now)
        nudge()
      end
      fixed = true
    elseif st == 'RETRY_WAIT' and not in_delayed then
      redis.call('ZADD', K_DELAYED, tonumber(f[3]) or now, id)
      fixed = true
    elseif ACTIVE[st] and not redis.call('ZSCORE', K_ACTIVE, id) then
      redis.call('ZADD', K_ACTIVE, tonumber(f[5]) or now, id)
      if f[7] then redis.call('SADD', ck_key(f[7]), id) end
      fixed = true
    end
    if fixed then out[#out + 1] = id end
  end
end
return out
