#!lua
-- step: keep the result of a durable step of a running job (the handler API): a later attempt reads it back
-- instead of doing the step again. A step written again is replaced.
--
-- KEYS[1] job    HASH  <prefix>job:<id>
-- KEYS[2] steps  HASH  <prefix>steps:<id>
-- ARGV[1] the attempt's lease token
-- ARGV[2] the step's name
-- ARGV[3] "<ms> <result bytes>" (its size already checked by the caller)
-- ARGV[4] the most steps a job keeps
-- Touches the job's `handler_data` field. Not allowed to grow a server out of memory.
-- Returns "ok", "too many steps" (a new step past ARGV[4]: nothing kept), or why the write was refused
-- ("lease lost", "canceled"): then nothing changed.

--- @include "attempt_refusal"
--- @include "wrong_type"

local refused = attempt_refusal(KEYS[1], ARGV[1])
if refused then return refused end
refused = wrong_type({KEYS[2], 'hash'})
if refused then return refused end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 and redis.call('HLEN', KEYS[2]) >= tonumber(ARGV[4]) then
  return 'too many steps'
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[1], 'handler_data', '1')
return 'ok'
