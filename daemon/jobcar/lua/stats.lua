#!lua flags=no-writes
-- stats: one queue's counts in one round trip (read-only: runs under OOM and on replicas).
--
-- KEYS[1] pending    LIST
-- KEYS[2] scheduled  ZSET  id -> run-at ms
-- KEYS[3] active     ZSET
-- KEYS[4] dead       ZSET
-- KEYS[5] paused     STRING
-- ARGV[1] the queue's key prefix
-- Pending counts every priority's list (`pending`, `pending:1` to `pending:9`).
-- Returns {now_ms, pending, scheduled, active, dead, paused (0/1), oldest_ready_ms (-1: none), held,
--          {type, held, type, held, ...}, waiting, max_pending (-1: none),
--          refused, {type, pending_or_held, max_pending (-1: none), ...}}
--   oldest_ready_ms: when the job that has waited longest became runnable: the oldest pending job,
--   or a scheduled job already due but not yet promoted (no daemon is leasing), whichever is older.
--   held: jobs waiting for a concurrency limit's slot, in the lists of <prefix>limit_groups (ADR 0014);
--   then the same by job type (a group is "<type>", "<type>#<key>", "@<type>", "@<type>#<key>" or
--   "~<type>#<key>").
--   waiting: jobs waiting for others to end (<prefix>waiting, ADR 0016).
--   max_pending: the bound enqueue holds the pending and held count to; refused: the jobs enqueue refused by
--   it and by the types' bounds, ever (both in <prefix>settings, ADR 0024).
--   Then by type, sorted by type, each type with a count in <prefix>pending_counts or a bound in
--   <prefix>settings (`max_pending:<type>`): its jobs pending or held (0: none) and its bound.

--- @include "keys"
--- @include "now_ms"
--- @include "pending_lists"
--- @include "settings_fields"

local prefix = ARGV[1]
local oldest = -1
local pending = 0
for _, list in ipairs(pending_lists(KEYS[1])) do
  if redis.call('TYPE', list).ok == 'list' then
    pending = pending + redis.call('LLEN', list)
    local tail = redis.call('LINDEX', list, -1)
    if tail then
      local f = redis.call('HMGET', job_key_of(prefix, tail), 'run_at', 'created')
      local ready = tonumber(f[1] or f[2] or '-1') or -1
      if ready >= 0 and (oldest < 0 or ready < oldest) then oldest = ready end
    end
  end
end
local now = now_ms()
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #head > 0 and tonumber(head[2]) <= now and (oldest < 0 or tonumber(head[2]) < oldest) then
  oldest = tonumber(head[2])
end
local held, by_type = 0, {}
local groups = redis.pcall('SMEMBERS', limit_groups_key_of(prefix))
if not groups.err then
  for _, group in ipairs(groups) do
    local n = redis.pcall('LLEN', held_key_of(prefix, group))
    if type(n) == 'number' and n > 0 then
      held = held + n
      local job_type = string.match(group, '^[@~]?([^#]*)')
      by_type[job_type] = (by_type[job_type] or 0) + n
    end
  end
end
local held_by_type = {}
for job_type, n in pairs(by_type) do
  held_by_type[#held_by_type + 1] = job_type
  held_by_type[#held_by_type + 1] = n
end
local waiting = redis.pcall('ZCARD', waiting_key_of(prefix))
-- A bound as the enqueue script takes it: a number of at least 1 (rounded down here), else none (-1).
local function bound_of(value)
  local max = tonumber(value)
  return max and max >= 1 and math.floor(max) or -1
end
-- A key of another type (fsck reports it) reads as empty, as in the enqueue script.
local function fields_of(key)
  local flat = redis.pcall('HGETALL', key)
  local fields = {}
  if not flat.err then
    for i = 1, #flat, 2 do fields[flat[i]] = flat[i + 1] end
  end
  return fields
end
local settings, counts = fields_of(settings_key_of(prefix)), fields_of(pending_counts_key_of(prefix))
local types, typed = {}, {}
for field in pairs(settings) do
  if string.sub(field, 1, #TYPE_BOUND_PREFIX) == TYPE_BOUND_PREFIX then
    types[#types + 1] = string.sub(field, #TYPE_BOUND_PREFIX + 1)
  end
end
for job_type in pairs(counts) do
  if not settings[TYPE_BOUND_PREFIX .. job_type] then types[#types + 1] = job_type end
end
table.sort(types)
for _, job_type in ipairs(types) do
  typed[#typed + 1] = job_type
  typed[#typed + 1] = tonumber(counts[job_type]) or 0
  typed[#typed + 1] = bound_of(settings[TYPE_BOUND_PREFIX .. job_type])
end
return {now, pending, redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]),
  redis.call('ZCARD', KEYS[4]), redis.call('EXISTS', KEYS[5]), oldest, held, held_by_type,
  type(waiting) == 'number' and waiting or 0, bound_of(settings[MAX_PENDING_FIELD]),
  tonumber(settings[REFUSED_FIELD]) or 0, typed}
