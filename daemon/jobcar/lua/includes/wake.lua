-- Wake daemons blocked on the queue (they wait with BLMOVE wake wake, which does not consume it).
local function wake(wake_key)
  if redis.call('EXISTS', wake_key) == 0 then redis.call('RPUSH', wake_key, '1') end
end
