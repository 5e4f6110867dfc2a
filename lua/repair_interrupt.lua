-- repair_interrupt.lua: during the rebuild of an untrusted dataset (restart, promoted
-- replica), runs it holds as leased lose their lease: the attempt is recorded as
-- interrupted (reason redis_lost) and RUNNING goes back to PENDING, STOPPING to STOPPED
-- (the lease_expired edges, as in reap_expired.lua; not counted as a failure). So no token
-- issued before the failover can renew, finish or checkpoint afterwards.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: pairs: run id, version the reconciler read
-- Returns: the ids interrupted (a run whose version moved on is skipped).
-- Errors: ILLEGAL_TRANSITION only if the state table lost the lease_expired edges.
-- @keys queue
-- @each id version
-- @returns [int]
-- @include common
local now = server_now_ms()
local out = {}
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  local key = run_key(id)
  local f = redis.call('HMGET', key, 'state', 'version', 'attempt', 'token', 'worker', 'priority', 'tenant', 'ckey')
  if f[2] == ARGV[i + 1] and ACTIVE[f[1]] then
    redis.call('ZREM', K_ACTIVE, id)
    lease_done(id, key, f[8] or false)
    redis.call('HDEL', key, 'token')  -- the old token no longer vouches for anything (checkpoints check it)
    local ev = {'attempt', f[3] or '', 'token', f[4] or '', 'worker', f[5] or '', 'outcome', 'interrupted',
                'reason', 'redis_lost'}
    if f[1] == 'STOPPING' then
      transition(id, key, 'STOPPING', 'STOPPED', 'lease_expired', now, ev)
    else
      transition(id, key, 'RUNNING', 'PENDING', 'lease_expired', now, ev)
      make_due(id, f[6], f[7], now)
      nudge()
    end
    out[#out + 1] = id
  end
end
return out
