--- @include "unpark"

-- A job leaving active gives back the slots its lease took (`slots`, the JSON array of its groups that the
-- lease wrote), and one held job of each of those groups goes back to pending to take the slot. The caller
-- deletes the `slots` field with the lease's other fields (move_to_pending, move_to_dead), or the hash.
local function release_slots(prefix, id, slots)
  if not slots then return end
  local ok, groups = pcall(cjson.decode, slots)
  if not ok or type(groups) ~= 'table' then return end
  local lists = {}
  for _, group in ipairs(groups) do
    if type(group) == 'string' then
      redis.pcall('SREM', prefix .. 'running:' .. group, id)
      lists[#lists + 1] = prefix .. 'held:' .. group
    end
  end
  -- One EXISTS over the groups' held lists: a limit that does not bind costs no more per job.
  if #lists == 0 or redis.call('EXISTS', unpack(lists)) == 0 then return end
  for _, group in ipairs(groups) do
    if type(group) == 'string' then unpark(prefix, group, 1) end
  end
end
