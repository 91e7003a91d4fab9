--- @include "turns"

-- A job leaving active gives back the slots its lease took (`slots`, the names of its groups that the lease
-- wrote, one per line: a group name has no line break), and one held job of each of those groups goes back
-- to pending to take the slot: for a type's total with keys taking turns (`fair`), the job of the key whose
-- turn it is. The caller deletes the `slots` field with the lease's other fields (move_to_pending,
-- move_to_dead), or the hash.
-- A script ending many jobs (ack) collects their slots with `slot_returns` and gives them back once: one
-- SREM per group and one look at the held lists, however many of its jobs a call ends.
local UNPACK_IDS = 1000

local function slot_returns(prefix)
  local ids_of, groups = {}, {}
  local returns = {}
  function returns.add(id, slots)
    if not slots then return end
    for group in string.gmatch(slots, '[^\n]+') do
      local ids = ids_of[group]
      if not ids then
        ids = {}
        ids_of[group] = ids
        groups[#groups + 1] = group
      end
      ids[#ids + 1] = id
    end
  end
  function returns.give_back()
    if #groups == 0 then return end
    for _, group in ipairs(groups) do
      local ids = ids_of[group]
      for first = 1, #ids, UNPACK_IDS do
        redis.pcall('SREM', prefix .. 'running:' .. group, unpack(ids, first, math.min(first + UNPACK_IDS - 1, #ids)))
      end
    end
    -- A group that holds jobs is in <prefix>limit_groups (ADR 0014): without that SET, nothing waits for them.
    if redis.call('EXISTS', prefix .. 'limit_groups') == 0 then return end
    local lists = {}
    for _, group in ipairs(groups) do
      lists[#lists + 1] = prefix .. 'held:' .. group
      if not string.find(group, '#', 1, true) then lists[#lists + 1] = prefix .. 'turns:' .. group end
    end
    -- One EXISTS over the groups' held lists and turns: a limit that does not bind costs no more.
    if redis.call('EXISTS', unpack(lists)) == 0 then return end
    for _, group in ipairs(groups) do let_go(prefix, group, #ids_of[group]) end
  end
  return returns
end

local function release_slots(prefix, id, slots)
  local returns = slot_returns(prefix)
  returns.add(id, slots)
  returns.give_back()
end
