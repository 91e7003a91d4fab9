#!lua flags=allow-oom
-- ack: finish a leased job successfully, or as canceled when an operator asked for that.
--
-- KEYS[1] active  ZSET
-- KEYS[2] job     HASH  <prefix>job:<id>
-- ARGV[1] the queue's key prefix
-- ARGV[2] id
-- ARGV[3] lease token
-- ARGV[4] final state: "done" or "canceled"
-- ARGV[5] retention in ms: 0 deletes the job; otherwise the job hash (state, finished, result) stays
--         readable that long
-- ARGV[6] result bytes to keep with the job (already bounded by the caller; "" for none)
-- Touches <prefix>unique:<key> (released), <prefix>batch:<batch> (done or canceled += 1).
-- Returns 1 when finished, 0 when the lease was lost (nothing changed).

local prefix, id, token, final = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local retention = tonumber(ARGV[5])
if not holds_lease(KEYS[2], token) then return 0 end

redis.call('ZREM', KEYS[1], id)
release_unique(prefix, KEYS[2], id)
count_in_batch(prefix, KEYS[2], final, 1)
if retention > 0 then
  redis.call('HSET', KEYS[2], 'state', final, 'finished', now_ms())
  redis.call('HDEL', KEYS[2], 'token', 'cancel')
  if ARGV[6] ~= '' then redis.call('HSET', KEYS[2], 'result', ARGV[6]) end
  redis.call('PEXPIRE', KEYS[2], retention)
else
  redis.call('DEL', KEYS[2])
end
return 1
