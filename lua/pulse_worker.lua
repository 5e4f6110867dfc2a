-- pulse_worker.lua: a worker says it is alive (its liveness, kept apart from its runs' leases).
-- A worker pulses every queue it serves several times per liveness period, from a thread of its
-- own, so a busy event loop does not stop it; reap_expired.lua reclaims at once the runs of a
-- worker whose pulse stopped (SIGKILL, host lost), whatever their lease. Times come from the
-- Redis server's clock, so a skewed host neither kills its peers nor keeps a dead one alive.
-- KEYS: the queue keys (includes/common.lua); BASE..'workers' ZSET worker id -> alive until (ms)
-- ARGV[1] worker id
-- ARGV[2] liveness (ms): how long after this pulse the worker counts as alive; 0 = leaving
--   (a graceful stop: its runs were released or finished, it is no longer expected to pulse)
-- Returns: 1
-- @keys queue
-- @argv worker liveness_ms
-- @returns int
-- @include common
local liveness = tonumber(ARGV[2])
if liveness <= 0 then
  redis.call('ZREM', K_WORKERS, ARGV[1])
  return 1
end
redis.call('ZADD', K_WORKERS, server_now_ms() + liveness, ARGV[1])
return 1
