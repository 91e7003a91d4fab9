--- @include "turns"
--- @include "ids_by_group"

-- A job leaving active gives back the slots its lease took (`slots`, the names of its groups that the lease
-- wrote, one per line: a group name has no line break), and one held job of each of those groups goes back
-- to pending to take the slot: for a type's total with keys taking turns (`fair`), the job of the key whose
-- turn it is. The caller deletes the `slots` field with the lease's other fields (move_to_pending,
-- move_to_dead), or the hash.
-- A script ending many jobs (ack) collects their slots with `slot_returns` and gives them back once: one
-- SREM per group and one look at the held lists, however many of its jobs a call ends.
local function slot_returns(prefix)
  local groups, first_of, more_of = {}, {}, {}  -- groups in the order of their first id; includes/ids_by_group.lua
  local returns = {}
  local function add(id, group)
    if not first_of[group] then
      first_of[group] = id
      groups[#groups + 1] = group
    elseif more_of[group] then
      local more = more_of[group]
      more[#more + 1] = id
    else
      more_of[group] = {id}
    end
  end
  function returns.add(id, slots)
    if not slots then return end
    if string.byte(slots) == 91 then  -- '['
      -- A JSON array, as the lease of an earlier jobcar wrote it (a group name starts with a letter or digit).
      local ok, names = pcall(cjson.decode, slots)
      if ok and type(names) == 'table' then
        for _, group in ipairs(names) do
          if type(group) == 'string' then add(id, group) end
        end
      end
      return
    end
    -- Split with a plain find, not a pattern: this runs for every limited job that ends.
    local first = 1
    while true do
      local line_end = string.find(slots, '\n', first, true)
      if not line_end then
        if first == 1 then add(id, slots) elseif first <= #slots then add(id, string.sub(slots, first)) end
        return
      end
      if line_end > first then add(id, string.sub(slots, first, line_end - 1)) end
      first = line_end + 1
    end
  end
  function returns.give_back()
    if #groups == 0 then return end
    for _, group in ipairs(groups) do
      send_ids('SREM', prefix .. 'running:' .. group, first_of[group], more_of[group])
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
    -- As many held jobs go as slots came back: all of a group's ids are in `more_of` once `send_ids` above
    -- added its first, or it gave back one.
    for _, group in ipairs(groups) do let_go(prefix, group, more_of[group] and #more_of[group] or 1) end
  end
  return returns
end

local function release_slots(prefix, id, slots)
  local returns = slot_returns(prefix)
  returns.add(id, slots)
  returns.give_back()
end
