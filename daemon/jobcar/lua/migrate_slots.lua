#!lua
-- `jobcar migrate` from key layout 1 (ADR 0019): one slot SET of an earlier lease, <prefix>running:<group>,
-- moves into its type's slot hash <prefix>slots:<type> (ADR 0018), in one atomic step.
-- KEYS[1] the SET; ARGV[1] the queue's prefix; ARGV[2] its group, "<type>" or "<type>#<key>".
-- The SET holds at most the group's slots taken, so one step reads it whole.
-- Each id whose job is still active gets its entry: its key for a key's group; for the type's total, "" unless
-- its key's SET came first (one entry counts in both groups). Its `slots` field, if an earlier lease wrote it as
-- a JSON array of the groups, becomes their names one per line, the type's total first. An id of a job no
-- longer active held a slot that the earlier reaper had not swept yet: it is dropped. The SET is deleted, so
-- a step done is not done again.
-- Reply: {ids moved into the slot hash, slots fields rewritten}

--- @include "keys"
--- @include "group_names"

local set, prefix, group = KEYS[1], ARGV[1], ARGV[2]
local _, job_type, key = group_parts(group)
local slots = slots_key_of(prefix, job_type)

-- A JSON array of group names as lines, the type's total (the name without a `#`) first; nil if not one.
local function as_lines(raw)
  local ok, names = pcall(cjson.decode, raw)
  if not ok or type(names) ~= 'table' then return nil end
  local lines = {}
  for _, name in ipairs(names) do
    if type(name) == 'string' then
      if names_a_key(name) then lines[#lines + 1] = name else table.insert(lines, 1, name) end
    end
  end
  if #lines == 0 then return nil end
  return table.concat(lines, '\n')
end

local moved, rewritten = 0, 0
for _, id in ipairs(redis.call('SMEMBERS', set)) do
  local job_key = job_key_of(prefix, id)
  local fields = redis.pcall('HMGET', job_key, 'state', 'slots')  -- a key of another type holds no job
  if not fields.err and fields[1] == 'active' then
    if key then
      redis.call('HSET', slots, id, key)
    else
      redis.call('HSETNX', slots, id, '')
    end
    moved = moved + 1
    local lines = fields[2] and string.byte(fields[2]) == 91 and as_lines(fields[2])  -- 91: '['
    if lines then
      redis.call('HSET', job_key, 'slots', lines)
      rewritten = rewritten + 1
    end
  end
end
redis.call('DEL', set)
return {moved, rewritten}
