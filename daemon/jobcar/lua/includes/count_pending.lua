--- @include "keys"

-- <prefix>pending_counts, a HASH type -> jobs: how many of the queue's jobs of each type are pending or held (in
-- its pending lists or a limit's held list), the count the backpressure bounds hold (includes/max_pending.lua,
-- ADR 0024). Every script that puts a job into those lists or takes one out of them counts it here; a move
-- between them (a job held, or let go) counts nothing. A job without a type counts under "". A field that
-- reaches 0 is deleted, and so is one below it (a count gone wrong: fsck finds it and recounts the queue). A
-- key or field that holds no count (fsck reports it) is passed over: a count is not worth failing the move it
-- follows.

-- Whether a job in `state` is counted: the one definition of what the count counts.
local function is_counted(state) return state == 'pending' or state == 'held' end

local function count_pending(prefix, job_type, n)
  local key, field = pending_counts_key_of(prefix), job_type or ''
  local left = redis.pcall('HINCRBY', key, field, n)
  if type(left) == 'number' and left <= 0 then redis.call('HDEL', key, field) end
end

-- count_pending for each type of `counts`, a table type -> n ("" for no type).
local function count_pending_by_type(prefix, counts)
  for job_type, n in pairs(counts) do
    if n ~= 0 then count_pending(prefix, job_type, n) end
  end
end
