-- enqueue_runs.lua: make runs that PostgreSQL already committed claimable (submit,
-- outbox relay, reconciler repair and rebuild).
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1]  now (ms)
-- then per run: id, state, run_at (ms), priority, n, followed by n field/value pairs
--   stored verbatim in the run hash (handler, payload, max_retries, timeout_ms, ...).
-- state is PENDING, BLOCKED, RETRY_WAIT or PAUSED (the last two only from a rebuild).
-- Returns: the number of runs created. A run whose hash already exists is left alone,
-- so enqueueing twice never duplicates or rewinds a run.
-- No event is written: the submit event is committed to PostgreSQL with the run.
-- @include common
local now = tonumber(ARGV[1])
local created = 0
local i = 2
while i <= #ARGV do
  local id, state, run_at, priority, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], tonumber(ARGV[i + 4])
  local key = run_key(id)
  if redis.call('EXISTS', key) == 0 then
    local fields = {'state', state, 'run_at', run_at, 'priority', priority}
    for j = 1, 2 * n do fields[#fields + 1] = ARGV[i + 4 + j] end
    redis.call('HSET', key, unpack(fields))
    if state == 'RETRY_WAIT' or (state == 'PENDING' and run_at > now) then
      redis.call('ZADD', K_DELAYED, run_at, id)
    elseif state == 'PENDING' then
      redis.call('ZADD', K_DUE, due_score(priority), id)
    end
    created = created + 1
  end
  i = i + 5 + 2 * n
end
if created > 0 then nudge() end
return created
