-- repair_inspect.lua: read what the reconciler compares with PostgreSQL, for many runs of
-- one queue in one call (read-only; one reply parsed in C instead of six per run).
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: run ids
-- Returns: 16 fields per id, '' where absent: exists (1|0), state, version, run_at, priority,
--   lease_until, attempt, token, handler, error_class, error, reason, payload length,
--   member of due, delayed, active ('1' | '').
-- Errors: none. Changes nothing.
-- @keys queue
-- @each id
-- @returns [exists state version run_at priority lease_until attempt token handler
-- @returns error_class error reason payload_len due delayed active]
-- @include common
local out = {}
local n = 0
for i = 1, #ARGV do
  local id = ARGV[i]
  local key = run_key(id)
  local f = redis.call('HMGET', key, 'state', 'version', 'run_at', 'priority', 'lease_until', 'attempt', 'token',
                       'handler', 'error_class', 'error', 'reason')
  local exists = redis.call('EXISTS', key)
  out[n + 1] = exists
  for j = 1, 11 do out[n + 1 + j] = f[j] or '' end
  out[n + 13] = redis.call('HSTRLEN', key, 'payload')
  out[n + 14] = queued(id, key) and '1' or ''
  out[n + 15] = redis.call('ZSCORE', K_DELAYED, id) and '1' or ''
  out[n + 16] = redis.call('ZSCORE', K_ACTIVE, id) and '1' or ''
  n = n + 16
end
return out
