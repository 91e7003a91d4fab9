#!lua flags=allow-oom
-- extend: renew the leases of jobs the caller is running (the heartbeat), one call per queue.
--
-- KEYS[1] active  ZSET  id -> lease deadline ms
-- ARGV[1] the queue's key prefix
-- ARGV[2] lease length in ms (the new deadline is now + this)
-- ARGV[3..] id, token pairs
-- Returns {now_ms, status...}, one status per pair, in order:
--   1  renewed
--   2  renewed, and an operator asked to cancel the job (the caller should stop it)
--   0  lease lost: the token no longer matches (reaped, or another daemon holds it); nothing changed
-- A lease that expired but was not yet reaped is still the caller's, so it is renewed.

--- @include "keys"
--- @include "now_ms"
--- @include "holds_lease"
--- @include "wrong_type"

local refused = wrong_type({KEYS[1], 'zset'})
if refused then return refused end

local prefix = ARGV[1]
local now = now_ms()
local deadline = now + tonumber(ARGV[2])
local reply = {now}
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local job_key = job_key_of(prefix, id)
  if holds_lease(job_key, token) then
    redis.call('ZADD', KEYS[1], deadline, id)  -- not XX: restores an entry that vanished
    if redis.call('HGET', job_key, 'cancel') then reply[#reply + 1] = 2 else reply[#reply + 1] = 1 end
  else
    reply[#reply + 1] = 0
  end
end
return reply
