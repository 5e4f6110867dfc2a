-- reconcilers_live.lua: a reconciler says it is alive and learns who else is (issue 23 item 5).
-- Not a queue script: one set shared by every reconciler of a prefix. The live reconcilers split the
-- queues between them (fencepost/reconciler/shares.py: each queue's stream is read, and its drift
-- ticked, by one of them), so a second reconciler stands by instead of halving every batch.
-- Times are the Redis server's (includes/clock.lua): a skewed host neither drops a live peer nor
-- keeps a dead one in the set.
-- KEYS[1] ZSET member -> alive until (ms) (fencepost.core.keys.RECONCILERS_KEY)
-- ARGV[1] this reconciler's member name
-- ARGV[2] liveness (ms): how long after this call the member counts as alive; 0 = leaving
-- Returns: the members alive now, this one included unless it is leaving
-- @keys live
-- @argv member liveness_ms
-- @returns [str]
-- @include clock
local now, liveness = server_now_ms(), tonumber(ARGV[2])
if liveness <= 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + liveness, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
