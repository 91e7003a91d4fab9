#!lua flags=allow-oom
-- repair/schedule_unindexed: a schedule neither paused nor finished goes into the schedules ZSET at the
-- tick its hash waits at, so that the daemons fire it.
-- KEYS[1..5] the queue's pending scheduled active dead wake, KEYS[6] its schedules ZSET; ARGV[1] its key
-- prefix, ARGV[2] the schedule's name, ARGV[3] the tick its hash held when checked.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"

local found = redis.call('HMGET', schedule_key_of(ARGV[1], ARGV[2]), 'next', 'paused')
if found[1] ~= ARGV[3] or found[2] == '1' then return 0 end
if redis.call('ZSCORE', KEYS[6], ARGV[2]) == ARGV[3] then return 0 end
redis.call('ZADD', KEYS[6], ARGV[3], ARGV[2])
return 1
