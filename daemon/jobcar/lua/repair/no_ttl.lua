#!lua flags=allow-oom
-- repair/no_ttl: a done or canceled job hash, in no set, that never expires gets a TTL.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix, ARGV[2] the job id.
-- ARGV[3] the TTL in ms.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"
--- @include "job_sets"

local id = ARGV[2]
local job = job_key_of(ARGV[1], id)
local state = redis.call('HGET', job, 'state')
if (state ~= 'done' and state ~= 'canceled') or redis.call('PTTL', job) ~= -1 or #job_sets(id) > 0 then return 0 end
redis.call('PEXPIRE', job, ARGV[3])
return 1
