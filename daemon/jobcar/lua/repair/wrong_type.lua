#!lua flags=allow-oom
-- repair/wrong_type: a key of the queue that holds another Redis type than jobcar writes there (written
-- by something else) is deleted; for a job key, its id also leaves every state set, so that no script
-- meets it again. What it held cannot be a job: nothing of jobcar's is lost.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix.
-- ARGV[2] the key, ARGV[3] the job id when it is a job key ("" otherwise), ARGV[4] the type it held when
-- checked, ARGV[5] the type jobcar expects there. Only while the key still holds that type.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "pending_lists"

local key, id, seen, expected = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local held = redis.call('TYPE', key).ok
if held ~= seen or held == expected then return 0 end
redis.call('DEL', key)
if id ~= '' then
  local sets = {{KEYS[2], 'zset'}, {KEYS[3], 'zset'}, {KEYS[4], 'zset'}}
  for _, list in ipairs(pending_lists(KEYS[1])) do sets[#sets + 1] = {list, 'list'} end
  for _, set in ipairs(sets) do
    local kind = redis.call('TYPE', set[1]).ok
    if kind == 'list' and set[2] == 'list' then redis.call('LREM', set[1], 0, id) end
    if kind == 'zset' and set[2] == 'zset' then redis.call('ZREM', set[1], id) end
  end
end
return 1
