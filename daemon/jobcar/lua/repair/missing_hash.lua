#!lua flags=allow-oom
-- repair/missing_hash: an id in a state set without a job hash leaves that set.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix, ARGV[2] the job id.
-- ARGV[3] the set it leaves (pending, scheduled, active, dead or waiting, which drops its dependencies too).
-- Only while the job still has no hash.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"
--- @include "pending_lists"

local id = ARGV[2]
if redis.call('EXISTS', job_key_of(ARGV[1], id)) == 1 then return 0 end
local keys = {pending = KEYS[1], scheduled = KEYS[2], active = KEYS[3], dead = KEYS[4],
  waiting = waiting_key_of(ARGV[1])}
if ARGV[3] == 'waiting' then redis.call('DEL', deps_key_of(ARGV[1], id)) end
if ARGV[3] == 'pending' then
  local removed = 0
  for _, list in ipairs(pending_lists(KEYS[1])) do
    if redis.call('TYPE', list).ok == 'list' then removed = removed + redis.call('LREM', list, 0, id) end
  end
  return removed > 0 and 1 or 0
end
return redis.call('ZREM', keys[ARGV[3]], id)
