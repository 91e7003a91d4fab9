--- @include "unpark"

-- A job leaving active gives back the slots its lease took (`slots`, the JSON array of its groups that the
-- lease wrote), and one held job of each of those groups goes back to pending to take the slot.
local function release_slots(prefix, job_key, id, slots)
  if not slots then return end
  redis.call('HDEL', job_key, 'slots')
  local ok, groups = pcall(cjson.decode, slots)
  if not ok or type(groups) ~= 'table' then return end
  for _, group in ipairs(groups) do
    if type(group) == 'string' then
      redis.pcall('SREM', prefix .. 'running:' .. group, id)
      unpark(prefix, group, 1)
    end
  end
end
