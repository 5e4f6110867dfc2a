-- enqueue_runs.lua: make runs that PostgreSQL already committed claimable (submit,
-- outbox relay, reconciler repair and rebuild).
-- KEYS: the queue keys (includes/common.lua)
-- ARGV: then 19 per run: id, state, run_at (ms), priority, handler, payload, max_retries,
--   timeout_ms, attempt, version, fire_time (ms or ''), trace ('' if none), gen,
--   tenant ('' = none), ckey (concurrency key, '' = none), climit (the limit the run declares),
--   rkey (rate key, '' = none), rlimit (the rate the run declares, 'N/ms'),
--   delay_ms (ms, '' = none)
-- delay_ms: the run is due that long after now on the server's clock (a submit with a delay, or
--   0: due at once), whatever the submitting host's clock says; without it the run is due at
--   run_at, a wall-clock instant (a user's absolute run_at, or a time PostgreSQL holds: rebuild,
--   repair, outbox relay) compared with the server's clock (docs/clock.md).
-- state is PENDING, BLOCKED, RETRY_WAIT or PAUSED (the last two only from a rebuild).
-- Returns: the number of runs created. A run whose hash already exists is left alone,
-- so enqueueing twice never duplicates or rewinds a run, except a BLOCKED copy older
-- than the given version (a workflow node PostgreSQL released since it was copied).
-- No event is written: the submit event is committed to PostgreSQL with the run.
-- @keys queue
-- @each id state run_at priority handler payload max_retries timeout_ms
-- @each attempt version fire_time trace gen tenant ckey climit rkey rlimit delay_ms
-- @returns int
-- @include common
local now = server_now_ms()
local created = 0
defer_seq = true
-- due runs go into their tenant's due set in one ZADD per tenant at the end (score, id, ...), not one
-- ZADD per run: in a sorted set of up to 128 members (a listpack) each ZADD call scans it
local due, tenants = {}, {}  -- tenants in the order first seen: the writes do not depend on table order
for i = 1, #ARGV, 19 do
  local id, state, run_at, priority = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local delay = tonumber(ARGV[i + 18])
  if delay then run_at = now + delay end
  local key = run_key(id)
  local held = redis.call('HMGET', key, 'state', 'version')
  if held[1] == 'BLOCKED' and state ~= 'BLOCKED' and tonumber(held[2]) < tonumber(ARGV[i + 9]) then
    redis.call('DEL', key)
    held[1] = false
  end
  if not held[1] then
    local is_due = state == 'PENDING' and run_at <= now
    local pos = is_due and next_position(now) or 0
    -- optional fields ride in the same HSET as the rest of the run's hash (one call per run)
    local more = {}
    if ARGV[i + 10] ~= '' then more[#more + 1], more[#more + 2] = 'fire_time', ARGV[i + 10] end
    if ARGV[i + 11] ~= '' then more[#more + 1], more[#more + 2] = 'trace', ARGV[i + 11] end
    if ARGV[i + 13] ~= '' then more[#more + 1], more[#more + 2] = 'tenant', ARGV[i + 13] end
    if ARGV[i + 14] ~= '' then
      more[#more + 1], more[#more + 2], more[#more + 3], more[#more + 4] = 'ckey', ARGV[i + 14], 'climit', ARGV[i + 15]
      declare_limit(ARGV[i + 14], ARGV[i + 15])
    end
    if ARGV[i + 16] ~= '' then
      more[#more + 1], more[#more + 2], more[#more + 3], more[#more + 4] = 'rkey', ARGV[i + 16], 'rlimit', ARGV[i + 17]
    end
    redis.call('HSET', key, 'state', state, 'run_at', run_at, 'priority', priority, 'handler', ARGV[i + 4],
               'payload', ARGV[i + 5], 'max_retries', ARGV[i + 6], 'timeout_ms', ARGV[i + 7],
               'attempt', ARGV[i + 8], 'version', ARGV[i + 9], 'gen', ARGV[i + 12],
               'qpos', pos, unpack(more))  -- qpos: an integer-valued double < 2^53: Redis writes its digits
    if state == 'RETRY_WAIT' or (state == 'PENDING' and run_at > now) then
      redis.call('ZADD', K_DELAYED, run_at, id)
    elseif is_due then
      local tenant = ARGV[i + 13]
      local z = due[tenant]
      if not z then
        z = {}
        due[tenant] = z
        tenants[#tenants + 1] = tenant
      end
      z[#z + 1], z[#z + 2] = pos + age_of(priority), id
    end
    created = created + 1
  end
end
for _, tenant in ipairs(tenants) do
  local z, key = due[tenant], tenant_due(tenant)
  for j = 1, #z, 1000 do redis.call('ZADD', key, unpack(z, j, math.min(j + 999, #z))) end
  activate(tenant)
end
flush_seq()
if created > 0 then nudge() end
return created
