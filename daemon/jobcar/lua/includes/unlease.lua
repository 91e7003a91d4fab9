--- @include "wake"
--- @include "pending_key"

-- An active job whose lease is unknown goes back to pending, its attempt unchanged (as reap does).
-- For fsck's repairs: KEYS[1] pending, KEYS[3] active, KEYS[5] wake.
local function unlease(job_key, id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('HSET', job_key, 'state', 'pending')
  redis.call('HDEL', job_key, 'token', 'started')
  local list = pending_key(KEYS[1], redis.call('HGET', job_key, 'priority'))
  if not redis.call('LPOS', list, id) then redis.call('LPUSH', list, id) end
  wake(KEYS[5])
end
