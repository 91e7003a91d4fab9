#!lua flags=allow-oom
-- repair/stale_unique: a unique lock held by a missing or finished job is deleted.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix.
-- ARGV[2] the lock's key, ARGV[3] the job id it held when checked.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"

local lock = ARGV[2]
local holder = redis.call('GET', lock)
if holder ~= ARGV[3] then return 0 end
local state = redis.call('HGET', job_key_of(ARGV[1], holder), 'state')
if state == 'pending' or state == 'scheduled' or state == 'active' then return 0 end
redis.call('DEL', lock)
return 1
