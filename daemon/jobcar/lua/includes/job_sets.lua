--- @include "keys"
--- @include "pending_lists"

-- The state sets that hold a job id, by name, for fsck's repairs (KEYS[1..4]: pending scheduled active
-- dead; every priority's pending list counts as pending; ARGV[1] the key prefix, for a held job's list and
-- <prefix>waiting).
-- A repair re-checks with it, atomically, what the check saw before it writes anything.
local function job_sets(id)
  local found = {}
  for _, list in ipairs(pending_lists(KEYS[1])) do
    if redis.call('TYPE', list).ok == 'list' and redis.call('LPOS', list, id) then
      found[#found + 1] = 'pending'
      break
    end
  end
  if redis.call('ZSCORE', KEYS[2], id) then found[#found + 1] = 'scheduled' end
  if redis.call('ZSCORE', KEYS[3], id) then found[#found + 1] = 'active' end
  if redis.call('ZSCORE', KEYS[4], id) then found[#found + 1] = 'dead' end
  local waiting = redis.pcall('ZSCORE', waiting_key_of(ARGV[1]), id)
  if type(waiting) == 'string' then found[#found + 1] = 'waiting' end
  local group = redis.pcall('HGET', job_key_of(ARGV[1], id), 'held')
  if type(group) == 'string' then
    local list = held_key_of(ARGV[1], group)
    if redis.call('TYPE', list).ok == 'list' and redis.call('LPOS', list, id) then found[#found + 1] = 'held' end
  end
  return found
end
