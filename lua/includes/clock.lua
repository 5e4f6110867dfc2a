-- clock.lua: the one clock (docs/clock.md). Every decision about leases, due times, retry times,
-- reaping, liveness, rate, budget and breaker windows is taken on the Redis server's clock, read
-- here once per script call (every use in one call sees the same instant). No script takes a
-- caller's time: a host whose clock is minutes off neither reaps its peers' runs, nor starts
-- delayed runs early, nor loses its own leases. TIME before writes is fine on Redis >= 5
-- (effects replication: replicas and the AOF get the writes, not the script).
local clock_ms = nil
local function server_now_ms()
  if not clock_ms then
    local t = redis.call('TIME')
    clock_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    -- @testclock
  end
  return clock_ms
end
