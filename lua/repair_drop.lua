-- repair_drop.lua: remove Redis state that nothing vouches for (drift repair): set members
-- whose run hash is gone, run hashes PostgreSQL has no row for, and hashes that are corrupt
-- or behind PostgreSQL (the caller then restores the run from PostgreSQL).
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: triples: run id, mode, version
--   mode 'member': drop the id from due, delayed and active, only while no hash exists
--   mode 'hash':   delete the hash and its members, only while its version field still
--                  reads `version` ('' = the field is absent) (compare-and-set)
-- Returns: the ids dropped.
-- Errors: none.
-- @keys queue
-- @each id mode version
-- @returns [int]
-- @include common
local out = {}
for i = 1, #ARGV, 3 do
  local id, mode, version = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local key = run_key(id)
  local go = false
  if mode == 'member' then
    go = redis.call('EXISTS', key) == 0
  elseif mode == 'hash' then
    go = redis.call('EXISTS', key) == 1 and (redis.call('HGET', key, 'version') or '') == version
  end
  if go then
    unqueue(id, key)
    if redis.call('ZREM', K_ACTIVE, id) == 1 then lease_done(id, key) end
    redis.call('DEL', key)
    redis.call('ZREM', K_DUE, id)
    redis.call('ZREM', K_DELAYED, id)
    out[#out + 1] = id
  end
end
return out
