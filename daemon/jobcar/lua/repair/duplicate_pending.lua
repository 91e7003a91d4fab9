#!lua flags=allow-oom
-- repair/duplicate_pending: an id listed more than once in the pending lists keeps one entry, the one
-- leased first (the highest priority's list, nearest its right end).
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix, ARGV[2] the job id.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "pending_lists"

local id = ARGV[2]
local found = {}  -- list, count, list, count...
local total = 0
for _, list in ipairs(pending_lists(KEYS[1])) do
  if redis.call('TYPE', list).ok == 'list' then
    local n = #redis.call('LPOS', list, id, 'COUNT', 0)
    if n > 0 then
      found[#found + 1] = list
      found[#found + 1] = n
      total = total + n
    end
  end
end
if total < 2 then return 0 end
-- Keep the entry nearest the right end of the first list; drop every other one. (A count of 0 would make
-- LREM remove them all.)
if found[2] > 1 then redis.call('LREM', found[1], found[2] - 1, id) end
for i = 3, #found, 2 do redis.call('LREM', found[i], 0, id) end
return 1
