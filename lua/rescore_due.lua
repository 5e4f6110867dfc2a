-- rescore_due.lua: re-score the runs of one due or held set after the queue's aging step
-- changed, from each run's queue position (`qpos`) and priority, so runs already waiting
-- get the new step too (idempotent: a member met twice by ZSCAN gets the same score).
-- KEYS: the queue keys (includes/common.lua)
-- ARGV[1] set suffix after the queue base ('due', 'due:t:<tenant>', 'held:<key>' or 'rheld:<key>'),
-- ARGV[2] cursor (ZSCAN; '0' to start), ARGV[3] page size,
-- ARGV[4] the step (ms) the current scores were made with (for runs without `qpos`)
-- Returns: {next cursor ('0' when done), runs re-scored}
-- Errors: BAD_SET when the suffix names no due or held set.
-- @keys queue
-- @argv suffix cursor page old_step_ms
-- @returns {cursor count}
-- @include common
local suffix = ARGV[1]
if suffix ~= KEY.due and string.sub(suffix, 1, #KEY.tenant_due) ~= KEY.tenant_due
   and string.sub(suffix, 1, #KEY.held) ~= KEY.held and string.sub(suffix, 1, #KEY.rheld) ~= KEY.rheld then
  return redis.error_reply('BAD_SET ' .. suffix)
end
local z = BASE .. suffix
local old_units = tonumber(ARGV[4]) * 1000
local page = redis.call('ZSCAN', z, ARGV[2], 'COUNT', tonumber(ARGV[3]))
local n = 0
for i = 1, #page[2], 2 do
  local id, score = page[2][i], tonumber(page[2][i + 1])
  local f = redis.call('HMGET', run_key(id), 'qpos', 'priority')
  local pos = tonumber(f[1] or '')
  if not pos then pos = score - (255 - (tonumber(f[2]) or 0)) * old_units end
  redis.call('ZADD', z, 'XX', pos + age_of(f[2]), id)
  n = n + 1
end
return {page[1], n}
