-- The state sets that hold a job id, by name, for fsck's repairs (KEYS[1..4]: pending scheduled active
-- dead). A repair re-checks with it, atomically, what the check saw before it writes anything.
local function job_sets(id)
  local found = {}
  if redis.call('LPOS', KEYS[1], id) then found[#found + 1] = 'pending' end
  if redis.call('ZSCORE', KEYS[2], id) then found[#found + 1] = 'scheduled' end
  if redis.call('ZSCORE', KEYS[3], id) then found[#found + 1] = 'active' end
  if redis.call('ZSCORE', KEYS[4], id) then found[#found + 1] = 'dead' end
  return found
end
