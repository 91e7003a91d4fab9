--- @include "turns"

-- A job leaving active gives back the slots its lease took (`slots`, the JSON array of its groups that the
-- lease wrote), and one held job of each of those groups goes back to pending to take the slot: for a type's
-- total with keys taking turns (`fair`), the job of the key whose turn it is. The caller deletes the `slots`
-- field with the lease's other fields (move_to_pending, move_to_dead), or the hash.
local function release_slots(prefix, id, slots)
  if not slots then return end
  local ok, groups = pcall(cjson.decode, slots)
  if not ok or type(groups) ~= 'table' then return end
  local lists = {}
  for _, group in ipairs(groups) do
    if type(group) == 'string' then
      redis.pcall('SREM', prefix .. 'running:' .. group, id)
      lists[#lists + 1] = prefix .. 'held:' .. group
      if not string.find(group, '#', 1, true) then lists[#lists + 1] = prefix .. 'turns:' .. group end
    end
  end
  -- One EXISTS over the groups' held lists and turns: a limit that does not bind costs no more per job.
  if #lists == 0 or redis.call('EXISTS', unpack(lists)) == 0 then return end
  for _, group in ipairs(groups) do
    if type(group) == 'string' then let_go(prefix, group, 1) end
  end
end
