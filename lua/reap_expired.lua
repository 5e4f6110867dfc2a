-- reap_expired.lua: runs whose lease expired (worker died, partitioned, paused too long),
-- or whose worker stopped pulsing (pulse_worker.lua: liveness kept apart from leases, so a
-- crash is noticed in seconds even under a long lease), go back to PENDING; the attempt is
-- recorded as interrupted. An interruption is not a handler failure: it does not use up
-- max_retries, it is counted apart (the run's `interrupts`), and only a run interrupted more
-- than ARGV[2] times goes FAILED, reason interrupted_too_often (a run that kills every worker
-- that takes it must not cycle for ever). A run an operator asked to pause, stop or cancel goes where
-- they asked (PAUSED / STOPPED / CANCELLED). Safe to run from many processes at once.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] max runs to reap in this call (leases expire on the server's clock, never a reaper's)
-- ARGV[2] max interruptions of one run (settings.max_interruptions)
-- A worker is dead once its pulse deadline (BASE..'workers', Redis server clock) has passed:
-- every leased run naming it is reaped, then it leaves the set (once the whole active set
-- was seen and the limit was not reached, else the next call carries on).
-- Returns: the number of runs reaped.
-- @keys queue
-- @argv limit max_interruptions
-- @returns int
-- @include common
local now, limit, max_interrupts = server_now_ms(), tonumber(ARGV[1]), tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', K_ACTIVE, '-inf', now, 'LIMIT', 0, limit)
local expired = #ids
local dead = redis.call('ZRANGEBYSCORE', K_WORKERS, '-inf', now)
local gone = {}
if #dead > 0 then
  for _, w in ipairs(dead) do gone[w] = true end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_ACTIVE, '(' .. now, '+inf')) do
    if #ids >= limit then break end
    if gone[redis.call('HGET', run_key(id), 'worker')] then ids[#ids + 1] = id end
  end
end
local reaped = 0
for i, id in ipairs(ids) do
  local key = run_key(id)
  local f = redis.call('HMGET', key, 'state', 'lease_until', 'attempt', 'token', 'worker', 'interrupts', 'priority',
                       'ctl', 'compensate', 'tenant', 'ckey')
  if i <= expired or ACTIVE[f[1]] then redis.call('ZREM', K_ACTIVE, id) end
  if ACTIVE[f[1]] and (tonumber(f[2]) <= now or gone[f[5]]) then
    lease_done(id, key, f[11] or false)
    local ev = {'attempt', f[3], 'token', f[4], 'worker', f[5], 'outcome', 'interrupted'}
    redis.call('HDEL', key, 'ctl')
    if f[1] == 'STOPPING' and f[8] == 'cancel' then
      if f[9] then ev[#ev + 1] = 'compensate'; ev[#ev + 1] = f[9] end
      transition(id, key, 'STOPPING', 'CANCELLED', 'lease_expired', now, ev)
    elseif f[1] == 'STOPPING' then
      transition(id, key, 'STOPPING', 'STOPPED', 'lease_expired', now, ev)
    elseif f[8] == 'pause' then
      transition(id, key, 'RUNNING', 'PAUSED', 'lease_expired', now, ev)
    else
      local interrupts = (tonumber(f[6]) or 0) + 1
      if interrupts <= max_interrupts then
        transition(id, key, 'RUNNING', 'PENDING', 'lease_expired', now, ev, {'interrupts', interrupts})
        make_due(id, f[7], f[10], now)
        nudge()
      else
        ev[#ev + 1] = 'reason'; ev[#ev + 1] = 'interrupted_too_often'
        transition(id, key, 'RUNNING', 'FAILED', 'lease_expired', now, ev, {'interrupts', interrupts})
      end
    end
    reaped = reaped + 1
  end
end
if #dead > 0 and #ids < limit then redis.call('ZREM', K_WORKERS, unpack(dead)) end
return reaped
