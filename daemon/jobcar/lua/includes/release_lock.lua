--- @include "keys"

-- Drop a job's unique lock, but only while it still points at this job (it may have expired and
-- been taken by a newer job with the same key).
-- A lock key of another type (written by something else) is not this job's lock: it is left alone, for
-- fsck to report, and the script goes on (a script that fails half-way keeps the writes it made).
local function release_lock(prefix, unique, id)
  local lock = unique_key_of(prefix, unique)
  local holder = redis.pcall('GET', lock)
  if holder == id then redis.call('DEL', lock) end
end
