-- common.lua: included at the top of every queue script by fencepost.core.hot.
--
-- Each script's header ends with its calling convention (`-- @keys`, `-- @argv`, `-- @each`,
-- `-- @returns`), the layout fencepost.core.hot.CONTRACTS declares (tests/test_gateways.py).
-- Every queue script (`-- @keys queue`) receives the same KEYS (fencepost.core.keys, Keys.script_keys):
--   KEYS[1] due      ZSET  claimable runs of the default tenant (see "Dispatch order" below)
--   KEYS[2] delayed  ZSET  delayed and RETRY_WAIT runs, score = run_at (ms)
--   KEYS[3] active   ZSET  RUNNING / STOPPING runs, score = lease expiry (ms)
--   KEYS[4] events   STREAM transitions for the recorder
--   KEYS[5] seq      the queue clock (~ microseconds, strictly increasing per enqueue)
--   KEYS[6] token    counter, low 40 bits of fencing tokens in the current epoch
--   KEYS[7] epoch    HASH stamp {epoch, server}: absent, or written on another server
--                    (restart, promoted replica), means the dataset is not trusted
--   KEYS[8] paused   exists while the queue is paused
--   KEYS[9] wake     LIST nudged so idle workers wake up
--   KEYS[10] stats   HASH of counters
-- Run hashes are BASE .. 'run:' .. id, in the same hash slot as the keys above.
local K_DUE, K_DELAYED, K_ACTIVE, K_EVENTS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_SEQ, K_TOKEN, K_EPOCH, K_PAUSED, K_WAKE, K_STATS = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
-- @queue_keys
local BASE = string.sub(K_DUE, 1, -1 - #KEY.due)  -- KEY: fencepost.core.keys.QUEUE_SUFFIXES
-- @include clock
local TOKEN_SPAN = 1099511627776 -- 2^40: tokens are epoch * 2^40 + counter

local function run_key(id)
  return BASE .. KEY.run .. id
end

-- LEGAL['FROM>TO>event'] = true and one set per state group (ACTIVE[st], TERMINAL[st], ...),
-- rendered from fencepost/core/states.py (scheduler/core/states.py: the only copy).
-- @states

-- EVENT_FIELD[name] = true for each field a stream entry may carry, rendered from
-- fencepost/core/stream.py (EVENT_FIELDS: the only copy; the recorder reads these names).
-- @event_fields

-- Move a run to a new state and append the event. Callers check the current state
-- first (compare-and-set); this guard only stops an edge the state table lacks.
-- `set`: more fields of the run's hash, written with the state in the same HSET; `seen`: the
-- run's version as the caller read it with the state (saves a HINCRBY on the hot scripts; the
-- script runs atomically, so nothing moved it in between).
local function transition(id, key, from, to, event, now, extra, set, seen)
  if not LEGAL[from .. '>' .. to .. '>' .. event] then
    error({err = 'ILLEGAL_TRANSITION ' .. id .. ' ' .. from .. ' ' .. to})
  end
  local reason = ''
  if extra then  -- every field of the entry is declared (EVENT_FIELD), checked before anything is written
    for i = 1, #extra - 1, 2 do
      if not EVENT_FIELD[extra[i]] then error({err = 'UNDECLARED_EVENT_FIELD ' .. tostring(extra[i])}) end
      if extra[i] == 'reason' then reason = extra[i + 1] end
    end
  end
  local v = tonumber(seen or '')
  local fields = set or {}
  for i = 1, #fields - 1, 2 do  -- in one HSET the last value wins: a caller's field must not pass the guard
    if fields[i] == 'state' or fields[i] == 'version' then error({err = 'ILLEGAL_FIELD ' .. fields[i]}) end
  end
  if v then
    v = v + 1
    fields[#fields + 1], fields[#fields + 2] = 'version', v
  else
    v = redis.call('HINCRBY', key, 'version', 1)
  end
  local ev = {'run', id, 'type', event, 'from', from, 'to', to, 'v', v, 'ts', now}
  if extra then
    for i = 1, #extra do ev[#ev + 1] = extra[i] end
  end
  -- a terminal state keeps its reason (e.g. 'review') in the hash, so drift repair can record a
  -- terminal state whose stream entry was lost, reason included (repair_inspect.lua reads it)
  if TERMINAL[to] then fields[#fields + 1], fields[#fields + 2] = 'reason', reason end
  redis.call('HSET', key, 'state', to, unpack(fields))
  redis.call('XADD', K_EVENTS, '*', unpack(ev))
  return v
end

-- The queue's epoch if the stamp was written on this very server process, else nil.
-- A promoted replica or a restarted server has a new run_id, so a replicated or
-- persisted stamp does not vouch for it: claims wait until the reconciler rebuilt it.
local function trusted_epoch()
  local stamp = redis.call('HMGET', K_EPOCH, 'epoch', 'server')
  if not stamp[1] then return nil end
  local server = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
  if stamp[2] ~= server then return nil end
  return tonumber(stamp[1])
end

-- Operator commands: ARGV[1] run id, ARGV[2] actor, ARGV[3] reason, ARGV[4] expected
-- version ('' = any). Returns now (the server's clock), id, key, state, and the event
-- fields naming who asked and why. Errors NO_RUN, or STALE_VERSION when the caller
-- acted on a version that has moved on (compare-and-set).
local function control_args(verb)
  local now, id, actor, reason, expected = server_now_ms(), ARGV[1], ARGV[2], ARGV[3], ARGV[4]
  local key = run_key(id)
  local f = redis.call('HMGET', key, 'state', 'version')
  if not f[1] then error({err = 'NO_RUN ' .. id}) end
  if expected ~= '' and expected ~= f[2] then
    error({err = 'STALE_VERSION ' .. id .. ' ' .. f[1] .. ' ' .. verb .. ' ' .. f[2]})
  end
  return now, id, key, f[1], {'actor', actor, 'reason', reason}
end

local function refuse(id, state, verb)
  error({err = 'STATE ' .. id .. ' ' .. state .. ' ' .. verb})
end

-- Retry budget: retries of a queue may not exceed floor + ratio * first attempts over a
-- sliding window (12 buckets, each a counter key with a TTL, in the queue's hash slot).
-- Configured per queue in the hash BASE..'config' (workers write it from their settings;
-- absent = no budget): budget_ratio, budget_floor, budget_window_ms.
-- The config hash also holds max_running, priority_age_ms and rate ('N/ms', the queue-wide
-- rate limit) (fairness.py writes them);
-- one HMGET per script call reads it all.
local config_cache = nil
local function queue_config()
  if not config_cache then
    local c = redis.call('HMGET', BASE .. KEY.config, 'budget_ratio', 'budget_floor', 'budget_window_ms',
                         'max_running', 'priority_age_ms', 'rate')
    config_cache = {tonumber(c[1] or '0') or 0, tonumber(c[2] or '0') or 0, tonumber(c[3] or '0') or 0,
                    tonumber(c[4] or ''), tonumber(c[5] or ''), c[6] or nil}
  end
  return config_cache
end

local function budget_config()
  local c = queue_config()
  return c[1], c[2], c[3]
end
local function budget_key(kind, now, window)
  local width = math.floor(window / 12)
  return BASE .. KEY.budget .. kind .. ':' .. math.floor(now / width), width
end

local function budget_count(kind, now, window, n)
  if window <= 0 or n == 0 then return end
  local key, width = budget_key(kind, now, window)
  redis.call('INCRBY', key, n)
  redis.call('PEXPIRE', key, window + width)
end

local function budget_allows(now, ratio, floor_, window)
  if ratio <= 0 or window <= 0 then return true end
  local width = math.floor(window / 12)
  local b = math.floor(now / width)
  local ak, rk = {}, {}
  for i = 0, 11 do
    ak[#ak + 1] = BASE .. KEY.budget_a .. (b - i)
    rk[#rk + 1] = BASE .. KEY.budget_r .. (b - i)
  end
  local firsts, retries = 0, 0
  for _, v in ipairs(redis.call('MGET', unpack(ak))) do firsts = firsts + (tonumber(v) or 0) end
  for _, v in ipairs(redis.call('MGET', unpack(rk))) do retries = retries + (tonumber(v) or 0) end
  return retries < floor_ + ratio * firsts
end

-- Dispatch order: fair between tenants, priority with aging within a tenant.
-- A run's tenant ('' when it has none) owns a due ZSET: K_DUE for '', BASE..'due:t:'..name
-- otherwise. K_TENANTS holds each tenant that has due runs, scored by its virtual time;
-- claim_due serves the smallest and advances it by 1 / weight per run (K_WEIGHTS, default
-- 1), so backlogged tenants share dispatches in proportion to their weights whatever their
-- backlogs. A tenant that becomes active starts at the current virtual time (K_FAIR 'v',
-- the smallest virtual time of the active tenants after the last claim): idling earns no
-- credit.
-- Within a tenant a run's score is its position on the queue clock (K_SEQ: ~ microseconds
-- when it became due, strictly increasing; kept in the run's `qpos`) plus
-- (255 - priority) * the queue's aging step (config 'priority_age_ms', default 60 s): one
-- priority level is a head start of one step, so a run is overtaken only by runs that
-- became due less than (255 - priority) steps after it, and no run waits forever behind a
-- stream of higher-priority ones. rescore_due.lua re-scores from `qpos` when the step changes.
local K_TENANTS, K_WEIGHTS, K_FAIR = BASE .. KEY.tenants, BASE .. KEY.weights, BASE .. KEY.fair
local K_HELDKEYS = BASE .. KEY.heldkeys
local K_WORKERS = BASE .. KEY.workers  -- ZSET worker id -> alive until (ms, server clock): pulse_worker.lua
local DEFAULT_AGE_MS = 60000

local function tenant_due(tenant)
  if not tenant or tenant == '' then return K_DUE end
  return BASE .. KEY.tenant_due .. tenant
end

local clock, age_units, vnow = nil, nil, nil
local activated = {}
local defer_seq = false  -- a batch script writes K_SEQ once, at its end (flush_seq)

-- The queue clock in microseconds: the server's clock (`now` is server_now_ms()), strictly
-- increasing per position handed out.
local function next_position(now)
  if not clock then clock = tonumber(redis.call('GET', K_SEQ) or '0') end
  clock = math.max(clock + 1, math.floor(now) * 1000)
  if not defer_seq then redis.call('SET', K_SEQ, string.format('%.0f', clock)) end
  return clock
end

local function flush_seq()
  if clock then redis.call('SET', K_SEQ, string.format('%.0f', clock)) end
end

local function age_of(priority)
  if not age_units then age_units = (queue_config()[5] or DEFAULT_AGE_MS) * 1000 end
  return (255 - (tonumber(priority) or 0)) * age_units
end

local function activate(tenant)
  tenant = tenant or ''
  if activated[tenant] then return end
  activated[tenant] = true
  if redis.call('ZSCORE', K_TENANTS, tenant) then return end  -- active already: a read, no write
  if not vnow then vnow = tonumber(redis.call('HGET', K_FAIR, 'v') or '0') or 0 end
  redis.call('ZADD', K_TENANTS, vnow, tenant)
end

local function deactivate(tenant)
  redis.call('ZREM', K_TENANTS, tenant or '')
  activated[tenant or ''] = nil
end

-- Put a run into its tenant's due set at a given score (a held run keeps its place).
local function queue_at(id, tenant, score)
  redis.call('ZADD', tenant_due(tenant), score, id)
  activate(tenant)
end

-- Make a PENDING run claimable at queue position `pos` (already in its hash as `qpos`).
local function due_at(id, priority, tenant, pos)
  queue_at(id, tenant, pos + age_of(priority))
end

-- Make a PENDING run claimable (callers have checked its state and moved it).
local function make_due(id, priority, tenant, now)
  local pos = next_position(now)
  redis.call('HSET', run_key(id), 'qpos', pos)
  due_at(id, priority, tenant, pos)
end

-- Concurrency keys: a run may carry `ckey` and the limit it declares (`climit`). A key's
-- limit is the operator's override (BASE..'limits') or else the smallest limit its runs
-- declared (BASE..'climits'). BASE..'ck:'..ckey is the SET of its leased runs; a due run
-- whose key is full waits in BASE..'held:'..ckey (same score) until a slot frees up, and
-- K_HELDKEYS lists the keys with held runs.
local function held_key(ckey) return BASE .. KEY.held .. ckey end
local function ck_key(ckey) return BASE .. KEY.ck .. ckey end

local function key_limit(ckey)
  local v = redis.call('HMGET', BASE .. KEY.limits, ckey)[1]
  if not v then v = redis.call('HGET', BASE .. KEY.climits, ckey) end
  return tonumber(v or '') or 0
end

local function declare_limit(ckey, climit)
  local n = tonumber(climit)
  if not n or n < 1 then return end
  local cur = tonumber(redis.call('HGET', BASE .. KEY.climits, ckey) or '')
  if not cur or n < cur then redis.call('HSET', BASE .. KEY.climits, ckey, n) end
end

local function hold(id, ckey, score)
  redis.call('ZADD', held_key(ckey), score, id)
  redis.call('SADD', K_HELDKEYS, ckey)
end

-- Move up to `room` runs of held set `h` back to their tenant's due set at their old score,
-- dropping members whose run is no longer PENDING on the way. Returns the runs moved.
local function unhold(h, room)
  local moved = 0
  while room > 0 do
    local nxt = redis.call('ZPOPMIN', h, 1)
    if not nxt[1] then break end
    local f = redis.call('HMGET', run_key(nxt[1]), 'state', 'tenant')
    if f[1] == 'PENDING' then
      queue_at(nxt[1], f[2], tonumber(nxt[2]))
      room = room - 1
      moved = moved + 1
    end
  end
  return moved
end

-- Give free slots of a key to its best held runs (back to their tenant's due set at their
-- old score). Held members whose run is no longer PENDING are dropped on the way.
local function refill(ckey)
  local h = held_key(ckey)
  local limit = key_limit(ckey)
  local room = redis.call('ZCARD', h)
  if limit > 0 then room = math.min(room, limit - redis.call('SCARD', ck_key(ckey))) end
  local moved = unhold(h, room)
  if redis.call('EXISTS', h) == 0 then redis.call('SREM', K_HELDKEYS, ckey) end
  if moved > 0 and redis.call('LLEN', K_WAKE) == 0 then redis.call('RPUSH', K_WAKE, 1) end
  return moved
end

-- Rate limits: at most N starts per interval, for the whole queue (config 'rate' = 'N/ms',
-- fairness.py writes it) and per rate key (a run's `rkey` with the limit it
-- declares, `rlimit` = 'N/ms', unless the operator's override in BASE..'rates' replaces it).
-- Windows are exact and slide on the Redis server's clock (never a worker's): BASE..'rw'
-- (queue) and BASE..'rw:'..rkey hold one member per start ('<id>:<attempt>', so retries count)
-- scored by its start time in ms; a start is allowed while fewer than N lie in (now - ms, now].
-- A due run whose key's window is full waits in BASE..'rheld:'..rkey at its due score (its
-- place in the fair order), and K_RWAIT scores the key with when its window frees: claim_due
-- releases it then (no rescan before), and idle workers set their wake-up timer by it. The
-- member '' of K_RWAIT is the queue-wide window (nothing is held for it: claims just stop).
local K_RWAIT = BASE .. KEY.rwait
local RELEASE_PAGE = 1000  -- held runs released per key per call (the rest at the next call)
local function rheld_key(rkey) return BASE .. KEY.rheld .. rkey end
local function rw_key(rkey)
  if rkey == '' then return BASE .. KEY.rw end
  return BASE .. KEY.rw_key .. rkey
end

local function parse_rate(v)
  if not v then return nil end
  local n, ms = string.match(v, '^(%d+)/(%d+)$')
  n, ms = tonumber(n), tonumber(ms)
  if not n or n < 1 or ms < 1 then return nil end
  return n, ms
end

-- A window's state for this call: {n, ms, used, key, exact}, or false when no limit applies.
-- `declared` is the run's own 'N/ms' (the queue-wide limit passes its config's). Runs of one
-- key declare one rate (the key names their handler); if they differ, the first run a call
-- meets decides for that call. "No limit" is not remembered: a later run may declare one.
-- `used` starts as the set's size, an upper bound (old starts may not be trimmed yet): below
-- N it already proves room; only a window that looks full is trimmed and counted exactly.
local rate_states = {}
local rate_overrides = nil
local function rate_state(rkey, declared, now)
  local s = rate_states[rkey]
  if s == nil then
    local n, ms
    if rkey == '' then
      n, ms = parse_rate(declared)
    else
      if rate_overrides == nil then rate_overrides = redis.call('EXISTS', BASE .. KEY.rates) == 1 end
      n, ms = parse_rate(rate_overrides and redis.call('HGET', BASE .. KEY.rates, rkey) or declared)
    end
    if not n then return false end
    local w = rw_key(rkey)
    s = {n = n, ms = ms, used = redis.call('ZCARD', w), key = w, exact = false, ttl = false}
    rate_states[rkey] = s
  end
  return s
end

-- The window trimmed to (now - ms, now] and counted exactly (once per call).
local function rate_exact(s, now)
  if not s.exact then
    redis.call('ZREMRANGEBYSCORE', s.key, '-inf', now - s.ms)
    s.used = redis.call('ZCARD', s.key)
    s.exact = true
  end
  return s
end

local function rate_full(s, now)
  return s.used >= s.n and rate_exact(s, now).used >= s.n
end

-- When the window's next start is allowed (ms; the window is exact): its oldest start leaves
-- it, or, while it is empty, a full interval after starts made now.
local function rate_free_at(s, now)
  local oldest = redis.call('ZRANGE', s.key, 0, 0, 'WITHSCORES')
  return (tonumber(oldest[2]) or now) + s.ms
end

local function rate_start(s, member, now)
  redis.call('ZADD', s.key, now, member)
  if not s.ttl then  -- every start of a call has the same `now`: one expiry per window per call
    redis.call('PEXPIRE', s.key, s.ms + 1000)
    s.ttl = true
  end
  s.used = s.used + 1
end

local function rate_hold(id, rkey, score, s, now)
  redis.call('ZADD', rheld_key(rkey), score, id)
  redis.call('ZADD', K_RWAIT, 'LT', rate_free_at(s, now), rkey)
end

-- Give held runs of keys whose windows may have room back to their tenant's due set (at
-- their old score), as many as each window has room for; a key with runs still held is
-- scored with when its window frees next. Returns the runs moved.
local function rate_release(now, page)
  local moved = 0
  for _, rkey in ipairs(redis.call('ZRANGEBYSCORE', K_RWAIT, '-inf', now, 'LIMIT', 0, page)) do
    local h = rheld_key(rkey)
    local head = rkey ~= '' and redis.call('ZRANGE', h, 0, 0) or {}
    if not head[1] then
      redis.call('ZREM', K_RWAIT, rkey)
    else
      local s = rate_state(rkey, redis.call('HGET', run_key(head[1]), 'rlimit'), now)
      local room = RELEASE_PAGE
      if s then room = math.min(room, s.n - rate_exact(s, now).used) end
      moved = moved + unhold(h, room)
      if redis.call('EXISTS', h) == 0 then
        redis.call('ZREM', K_RWAIT, rkey)
      elseif s then
        redis.call('ZADD', K_RWAIT, rate_free_at(s, now), rkey)
      else
        redis.call('ZADD', K_RWAIT, now, rkey)  -- no limit any more: the rest at the next call
      end
    end
  end
  return moved
end

-- Take a run out of the due structures (cancel, pause, repair), wherever it waits; a slot
-- its key offered it goes to the next held run.
local function unqueue(id, key)
  local f = redis.call('HMGET', key, 'tenant', 'ckey', 'rkey')
  local z = tenant_due(f[1])
  if redis.call('ZREM', z, id) == 1 and redis.call('EXISTS', z) == 0 then deactivate(f[1]) end
  if f[2] then
    redis.call('ZREM', held_key(f[2]), id)
    refill(f[2])
  end
  if f[3] then redis.call('ZREM', rheld_key(f[3]), id) end
end

-- Whether a run waits where it will be dispatched: in its tenant's due set with the tenant
-- active, or held for its concurrency or rate key (drift inspection; a run elsewhere needs a
-- requeue).
local function queued(id, key)
  local f = redis.call('HMGET', key, 'tenant', 'ckey', 'rkey')
  if redis.call('ZSCORE', tenant_due(f[1]), id) then
    return redis.call('ZSCORE', K_TENANTS, f[1] or '') ~= false
  end
  if f[3] and redis.call('ZSCORE', rheld_key(f[3]), id) then
    return redis.call('ZSCORE', K_RWAIT, f[3]) ~= false  -- held for its rate key, with a release time
  end
  return f[2] ~= false and f[2] ~= nil and redis.call('ZSCORE', held_key(f[2]), id) ~= false
end

-- A lease ended (the run left K_ACTIVE): free its concurrency slot for a held run.
local function lease_done(id, key, ckey)
  if ckey == nil then ckey = redis.call('HGET', key, 'ckey') end
  if not ckey then return end
  redis.call('SREM', ck_key(ckey), id)
  refill(ckey)
end

local function nudge()
  if redis.call('LLEN', K_WAKE) == 0 then redis.call('RPUSH', K_WAKE, 1) end
end
