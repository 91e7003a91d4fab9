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
  local function add(id, group)
    local ids = ids_of[group]
    if ids then
      ids[#ids + 1] = id
    else
      ids_of[group] = {id}
      groups[#groups + 1] = group
    end
  end
  function returns.add(id, slots)
    if not slots then return end
    if string.sub(slots, 1, 1) == '[' then
      -- A JSON array, as the lease of an earlier jobcar wrote it (a group name starts with a letter or digit).
      local ok, names = pcall(cjson.decode, slots)
      if ok and type(names) == 'table' then
        for _, group in ipairs(names) do
          if type(group) == 'string' then add(id, group) end
        end
      end
      return
    end
    for group in string.gmatch(slots, '[^\n]+') do add(id, group) end
  end
  function returns.give_back()
    if #groups == 0 then return end
    for _, group in ipairs(groups) do
      local ids = ids_of[group]
      for first = 1, #ids, UNPACK_IDS do
        redis.pcall('SREM', prefix .. 'running:' .. group, unpack(ids, first, math.min(first + UNPACK_IDS - 1, #ids)))
      end
    end
    -- A group with held jobs or turns is in <prefix>limit_groups (ADR 0014): without that SET, nothing waits
    -- for these slots.
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
