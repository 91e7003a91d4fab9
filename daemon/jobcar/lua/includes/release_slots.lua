--- @include "keys"
--- @include "group_names"
--- @include "turns"
--- @include "call_in_chunks"

-- A job leaving active gives back the slots its lease took: its entry in <prefix>slots:<type>, which counts
-- in each group its `slots` field names (the names of its groups that the lease wrote, one per line: a group
-- name has no line break). One held job of each of those groups goes back to pending to take the slot: for a
-- type's total with keys taking turns (`fair`), the job of the key whose turn it is. The caller deletes the
-- `slots` field with the lease's other fields (move_to_pending, move_to_dead), or the hash.
-- A script ending many jobs (ack) collects their slots with `slot_returns` and gives them back once: one
-- HDEL per type and one look at the held lists, however many of its jobs a call ends. The `slots` fields are
-- split into groups only while some group of the queue is indexed: otherwise nothing waits for a slot.
local function slot_returns(prefix)
  local types, ids_of = {}, {}  -- types in the order of their first job; type -> the ids to give back
  local ended = {}  -- the jobs' `slots`, read for their groups only when something may wait for them
  local returns = {}
  function returns.add(id, slots)
    if not slots then return end
    ended[#ended + 1] = slots
    -- A job's groups are all of its type, which starts its first line: the slot hash its id leaves.
    local job_type = type_of_slots(slots)
    if not job_type then return end
    local ids = ids_of[job_type]
    if ids then
      ids[#ids + 1] = id
    else
      ids_of[job_type] = {id}
      types[#types + 1] = job_type
    end
  end
  function returns.give_back()
    if #ended == 0 then return end
    for _, job_type in ipairs(types) do
      call_in_chunks('HDEL', slots_key_of(prefix, job_type), ids_of[job_type], true)
    end
    -- A group with held jobs or turns is in <prefix>limit_groups (ADR 0014): without that SET, nothing waits
    -- for these slots.
    if redis.call('EXISTS', limit_groups_key_of(prefix)) == 0 then return end
    -- The groups of the jobs ended, in the order of their first slot, each with its slots given back.
    local groups, given = {}, {}
    for _, slots in ipairs(ended) do
      for group in string.gmatch(slots, '[^\n]+') do
        if given[group] then
          given[group] = given[group] + 1
        else
          given[group] = 1
          groups[#groups + 1] = group
        end
      end
    end
    local lists = {}
    for _, group in ipairs(groups) do
      lists[#lists + 1] = held_key_of(prefix, group)
      if not names_a_key(group) then lists[#lists + 1] = turns_key_of(prefix, group) end
    end
    -- One EXISTS over the groups' held lists and turns: a limit that does not bind costs no more.
    if redis.call('EXISTS', unpack(lists)) == 0 then return end
    for _, group in ipairs(groups) do let_go(prefix, group, given[group]) end
  end
  return returns
end

local function release_slots(prefix, id, slots)
  local returns = slot_returns(prefix)
  returns.add(id, slots)
  returns.give_back()
end
