-- Wake daemons blocked on the queue (they wait with BLMOVE wake wake, which does not consume it). The element is
-- what a woken daemon reads: '1', work to lease (the default), or SETTLED_WAKE, an entry in the queue's settled
-- list for its settler (includes/tell_dependents.lua; leasing.SETTLED_WAKE, which tests/unit/test_lua_keys.py
-- holds to this one). Only an empty list is pushed: a daemon blocks only on one.
local SETTLED_WAKE = 'settled'
local function wake(wake_key, element)
  if redis.call('EXISTS', wake_key) == 0 then redis.call('RPUSH', wake_key, element or '1') end
end
