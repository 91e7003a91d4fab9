--- @include "keys"
--- @include "group_names"
--- @include "wake"

-- Fleet-wide limits (ADR 0014). A concurrency group is a job type ("<type>", its total) or a type and a
-- key ("<type>#<key>", its per-key limit): includes/group_names.lua names them. Their slots are
-- <prefix>slots:<type>, a HASH job id -> key ("" for a job that took no slot of a key): taken by the lease
-- and given back by whatever takes the job out of active. Its length is the type's slots taken, and a key's
-- are the entries with its key. A rate group is "@<type>" or "@<type>#<key>" (includes/gcra.lua). A job
-- the lease finds over a limit waits in <prefix>held:<group> (a LIST, oldest at the right) in state "held".
-- The SET <prefix>limit_groups names every group that held a job, until the reaper's pass finds it idle.

-- The keys of `job_type` holding slots, each to how many: one read of the type's slot hash. A slot hash of
-- another type (fsck reports it) holds none.
local function key_counts(prefix, job_type)
  local counts = {}
  local keys = redis.pcall('HVALS', slots_key_of(prefix, job_type))
  if keys.err then return counts end
  for _, taken_by in ipairs(keys) do counts[taken_by] = (counts[taken_by] or 0) + 1 end
  return counts
end

-- How many slots of concurrency group `group` are taken: O(1) for a type's total, one read of the type's
-- slots for a key's.
local function slots_taken(prefix, group)
  local _, job_type, key = group_parts(group)
  if key then return key_counts(prefix, job_type)[key] or 0 end
  local n = redis.pcall('HLEN', slots_key_of(prefix, job_type))
  return type(n) == 'number' and n or 0
end

-- The queue's limit keys that the lease and the reaper's pass write, with their types, as `wrong_type`
-- checks them before a script's first write.
local function limit_key_types(prefix)
  return {limit_groups_key_of(prefix), 'set', throttled_key_of(prefix), 'zset'}
end

-- Drop `group` from <prefix>limit_groups once nothing of it runs or waits (the reaper's pass and cancel:
-- a release leaves it, to stay two commands per group). A key's turn group leaves its type's turns with it:
-- turns name only indexed groups, so a release that finds no index has no turns to look at either. A rate
-- or turn group takes no slot. `taken`: the group's slots taken, when the caller counted them already.
local function forget_idle_group(prefix, group, taken)
  if redis.call('EXISTS', held_key_of(prefix, group)) == 1 then return end
  local kind, job_type, key = group_parts(group)
  if kind == 'concurrency' and (taken or slots_taken(prefix, group)) > 0 then return end
  redis.call('SREM', limit_groups_key_of(prefix), group)
  if kind == 'turn' and key then redis.pcall('ZREM', turns_key_of(prefix, job_type), key) end
end

-- Move up to n held jobs of `group`, oldest first, to <prefix>pending:released, which the lease takes before
-- the other pending lists (FIFO: a job let go twice before a lease keeps its place). An id whose hash is
-- gone or no longer held (canceled, repaired) leaves the list uncounted.
-- A held list of another type (fsck reports it) moves nothing. Returns how many moved.
local function unpark(prefix, group, n)
  local held = held_key_of(prefix, group)
  local moved = 0
  while moved < n do
    local id = redis.pcall('RPOP', held)
    if type(id) ~= 'string' then break end
    local job_key = job_key_of(prefix, id)
    local state = redis.pcall('HGET', job_key, 'state')
    if state == 'held' then
      -- `held` stays until the job is leased: held again before that, it goes back to the head of its
      -- group's list (it is the oldest), not to the tail.
      redis.call('HSET', job_key, 'state', 'pending')
      redis.call('LPUSH', released_key_of(prefix), id)
      moved = moved + 1
    end
  end
  if moved > 0 then wake(wake_key_of(prefix)) end
  return moved
end
