--- @include "wake"
--- @include "pending_key"
--- @include "release_slots"
--- @include "count_pending"

-- An active job whose lease is unknown goes back to pending, its attempt unchanged (as reap does).
-- Its limit slots are given back. For fsck's repairs: KEYS[1] pending, KEYS[3] active, KEYS[5] wake,
-- ARGV[1] the key prefix.
local function unlease(job_key, id)
  redis.call('ZREM', KEYS[3], id)
  release_slots(ARGV[1], id, redis.call('HGET', job_key, 'slots'))
  redis.call('HSET', job_key, 'state', 'pending')
  redis.call('HDEL', job_key, 'token', 'started', 'slots')
  local fields = redis.call('HMGET', job_key, 'priority', 'type')
  local list = pending_key(KEYS[1], fields[1])
  if not redis.call('LPOS', list, id) then redis.call('LPUSH', list, id) end
  count_pending(ARGV[1], fields[2], 1)
  wake(KEYS[5])
end
