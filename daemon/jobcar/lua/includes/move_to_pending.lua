--- @include "pending_key"
--- @include "count_pending"

-- Put a job (already removed from its previous set, in none of the pending or held lists) back at the tail of
-- its priority's pending list, and count it there.
local function move_to_pending(prefix, job_key, pending, id)
  redis.call('HSET', job_key, 'state', 'pending')
  redis.call('HDEL', job_key, 'token', 'started', 'slots')
  local fields = redis.call('HMGET', job_key, 'priority', 'type')
  redis.call('LPUSH', pending_key(pending, fields[1]), id)
  count_pending(prefix, fields[2], 1)
end
