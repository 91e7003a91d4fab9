#!lua flags=allow-oom
-- repair/handler_data_no_ttl: a job's log, steps or children that never expires while its job hash does (a
-- job kept after its ack: its handler data expires with it, includes/handler_data.lua) gets the job's PTTL.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix.
-- ARGV[2] the key, ARGV[3] the id of the job it belongs to.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"

local prefix, key, id = ARGV[1], ARGV[2], ARGV[3]
if key ~= log_key_of(prefix, id) and key ~= steps_key_of(prefix, id) and key ~= children_key_of(prefix, id) then
  return 0
end
local ttl = redis.call('PTTL', job_key_of(prefix, id))
if ttl <= 0 or redis.call('PTTL', key) ~= -1 then return 0 end
redis.call('PEXPIRE', key, ttl)
return 1
