-- repair_sync.lua: make a run's hot copy agree with the terminal state PostgreSQL recorded
-- (drift repair; the record wins when Redis is behind it: a promoted replica that missed
-- the finish, or a change PostgreSQL made that Redis never saw). The run leaves due,
-- delayed and active, so it can never be claimed again, and its hash expires like any
-- recorded terminal run.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] ttl (ms), then quads: run id, version the reconciler read, status, version in PostgreSQL
-- Returns: the ids synced. Compare-and-set on the version read; a hash newer than the
--   PostgreSQL version is never rewound.
-- No event and no state-machine edge: the copy is rewritten to the record, which already
-- holds the events.
-- Errors: none.
-- @keys queue
-- @argv ttl_ms
-- @each id seen_version status pg_version
-- @returns [int]
-- @include common
local ttl = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 4 do
  local id, seen, status, pg_version = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local key = run_key(id)
  local v = redis.call('HGET', key, 'version')
  if v and v == seen and tonumber(v) <= tonumber(pg_version) then
    redis.call('HSET', key, 'state', status, 'version', pg_version)
    redis.call('HDEL', key, 'token')  -- no lease survives: a pre-failover token cannot checkpoint
    unqueue(id, key)
    redis.call('ZREM', K_DELAYED, id)
    if redis.call('ZREM', K_ACTIVE, id) == 1 then lease_done(id, key) end
    redis.call('PEXPIRE', key, ttl)
    out[#out + 1] = id
  end
end
return out
