--- @include "call_in_chunks"

-- Job ids gathered by limit group in a script, to be sent with one command per group at its end: the slots a
-- lease takes (SADD), the slots an ending script gives back (SREM). A group's first id is kept in
-- `first_of[group]` and the ones after it in a table `more_of[group]`, made only for a second id: a key's
-- group mostly takes or gives back one slot per call. The scripts gather ids inline, not through a function:
-- that runs for every slot, and a Lua call there costs more than its few lines.

-- `command` on the slot set `key` with a group's ids (`first`, and `more` if any, to which `first` is added).
-- A slot set of another type (fsck reports it) takes no ids and stops no script: hence pcall.
local function send_ids(command, key, first, more)
  if not more then
    redis.pcall(command, key, first)
  else
    more[#more + 1] = first
    call_in_chunks(command, key, more, true)
  end
end
