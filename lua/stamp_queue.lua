-- stamp_queue.lua: vouch for a queue's Redis state at an epoch, on this server process.
-- Written by a producer that just created the queue (nothing to lose yet, only if no
-- stamp exists) or by the reconciler after a rebuild (force).
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] epoch, ARGV[2] '1' to overwrite an existing stamp
-- Returns: 1 if the stamp was written, 0 if one existed and force was not given.
-- @keys queue
-- @argv epoch force
-- @returns bool
-- @include common
if ARGV[2] ~= '1' and redis.call('EXISTS', K_EPOCH) == 1 then return 0 end
local server = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
redis.call('HSET', K_EPOCH, 'epoch', ARGV[1], 'server', server)
return 1
