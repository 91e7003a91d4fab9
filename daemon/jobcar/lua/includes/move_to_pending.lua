--- @include "pending_key"

-- Put a job (already removed from its previous set) back at the tail of its priority's pending list.
local function move_to_pending(job_key, pending, id)
  redis.call('HSET', job_key, 'state', 'pending')
  redis.call('HDEL', job_key, 'token', 'started', 'slots')
  redis.call('LPUSH', pending_key(pending, redis.call('HGET', job_key, 'priority')), id)
end
