#!lua flags=allow-oom
-- repair/dead_over_limit: trim the dead set towards its bounds, as every death does. Bounded per call
-- like every transition; the caller repeats it until it returns 0.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix.
-- ARGV[2] unused, ARGV[3] max jobs, ARGV[4] max age ms.
-- Returns how many dead jobs it deleted.

--- @include "now_ms"
--- @include "trim_dead"

local before = redis.call('ZCARD', KEYS[4])
trim_dead(ARGV[1], KEYS[4], tonumber(ARGV[3]), tonumber(ARGV[4]), now_ms())
return before - redis.call('ZCARD', KEYS[4])
