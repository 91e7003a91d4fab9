-- Put a job (already removed from its previous set) back at the tail of the pending list.
local function move_to_pending(job_key, pending_key, id)
  redis.call('HSET', job_key, 'state', 'pending')
  redis.call('HDEL', job_key, 'token', 'started')
  redis.call('LPUSH', pending_key, id)
end
