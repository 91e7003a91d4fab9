#!lua flags=allow-oom
-- repair/schedule_missing: a name in the schedules ZSET without its hash leaves the ZSET.
-- KEYS[1..5] the queue's pending scheduled active dead wake, KEYS[6] its schedules ZSET; ARGV[1] its key
-- prefix, ARGV[2] the schedule's name, ARGV[3] its score when checked.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"

if redis.call('EXISTS', schedule_key_of(ARGV[1], ARGV[2])) == 1 then return 0 end
return redis.call('ZREM', KEYS[6], ARGV[2])
