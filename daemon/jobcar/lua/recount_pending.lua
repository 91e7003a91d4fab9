#!lua flags=allow-oom
-- recount_pending: a queue's <prefix>pending_counts rebuilt from what it counts (includes/count_pending.lua): by
-- type, the jobs whose id is in one of its pending lists or in the held list of a limit group its
-- <prefix>limit_groups names, and whose hash is in state `pending` or `held`. The authority on the counts, for
-- fsck's repair of a count gone wrong and for `jobcar migrate` to key layout 3, whose earlier daemons kept none.
--
-- KEYS[1] the queue's pending_counts HASH (the key it writes; it names the script's slot)
-- ARGV[1] the queue's key prefix
-- ARGV[2] (optional) "check": write nothing, only answer (fsck's report of a count, confirmed at one instant)
-- Reads every pending list, <prefix>limit_groups, the held list of each group it names, and the hash of every id
-- they hold. Each id counts once, however often and in however many lists it is; an id whose hash is missing,
-- of another type, or in another state counts nothing; a list of another type, or a limit_groups of another type
-- (no held list then), holds nothing (fsck reports each such key). A job hash without a `type` counts under "".
-- Writes KEYS[1] only when it holds anything but the true counts: DEL, then one HSET of the types counted (a
-- type with no such job has no field). A key of another type is replaced too: what it held is no count.
-- O(jobs pending and held), in one call: the counts must be those of one instant, which no step of a bounded
-- walk would see while daemons run. Like fsck's repairs it runs on a full server (allow-oom): the hash it
-- writes holds one field per type.
-- Returns {changed (1: the counts were wrong, and it wrote the true ones unless asked to check; 0: they were
-- right already), type, n, type, n, ...}: the true counts, types sorted.

--- @include "keys"
--- @include "pending_lists"
--- @include "call_in_chunks"
--- @include "count_pending"

local prefix = ARGV[1]
local seen, counts = {}, {}

local function count_ids(ids)
  if type(ids) ~= 'table' or ids.err then return end  -- not a list
  for _, id in ipairs(ids) do
    if not seen[id] then
      seen[id] = true
      local f = redis.pcall('HMGET', job_key_of(prefix, id), 'state', 'type')
      if not f.err and is_counted(f[1]) then
        local job_type = f[2] or ''
        counts[job_type] = (counts[job_type] or 0) + 1
      end
    end
  end
end

for _, list in ipairs(pending_lists(pending_key_of(prefix))) do count_ids(redis.pcall('LRANGE', list, 0, -1)) end
local groups = redis.pcall('SMEMBERS', limit_groups_key_of(prefix))
if not groups.err then
  for _, group in ipairs(groups) do count_ids(redis.pcall('LRANGE', held_key_of(prefix, group), 0, -1)) end
end

local types = {}
for job_type in pairs(counts) do types[#types + 1] = job_type end
table.sort(types)

-- Compared field by field as text: a stored count that is not the number's own text ("07", "1.0") is rewritten.
local changed = redis.call('TYPE', KEYS[1]).ok ~= (#types > 0 and 'hash' or 'none')
if not changed and #types > 0 then
  changed = redis.call('HLEN', KEYS[1]) ~= #types
  for _, job_type in ipairs(types) do
    if changed then break end
    changed = redis.call('HGET', KEYS[1], job_type) ~= tostring(counts[job_type])
  end
end

local reply, fields = {changed and 1 or 0}, {}
for _, job_type in ipairs(types) do
  reply[#reply + 1] = job_type
  reply[#reply + 1] = counts[job_type]
  fields[#fields + 1] = job_type
  fields[#fields + 1] = tostring(counts[job_type])
end
if changed and ARGV[2] ~= 'check' then
  redis.call('DEL', KEYS[1])
  call_in_chunks('HSET', KEYS[1], fields)  -- chunks of 1,000 values keep the pairs whole
end
return reply
