-- refill_held.lua: give every free concurrency slot to a held run, for a page of the keys
-- that have held runs (reconciler tick, and after an operator changed a limit). Lease ends
-- already do this for their own key; this pass covers what no lease end will: a raised
-- limit, a held run left behind by a repair, a slot freed by a lost write.
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] cursor (SSCAN over the keys with held runs; '0' to start), ARGV[2] page size
-- Returns: {next cursor ('0' when done), runs moved back to due}
-- Errors: none.
-- @keys queue
-- @argv cursor page
-- @returns {cursor count}
-- @include common
local page = redis.call('SSCAN', K_HELDKEYS, ARGV[1], 'COUNT', tonumber(ARGV[2]))
local moved = 0
for _, ckey in ipairs(page[2]) do
  moved = moved + refill(ckey)
end
return {page[1], moved}
