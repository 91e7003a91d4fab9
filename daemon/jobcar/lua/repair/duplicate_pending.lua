#!lua flags=allow-oom
-- repair/duplicate_pending: an id listed more than once in pending keeps one entry, the one nearest
-- the right end (the first to be leased).
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix, ARGV[2] the job id.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

local id = ARGV[2]
local n = #redis.call('LPOS', KEYS[1], id, 'COUNT', 0)
if n < 2 then return 0 end
redis.call('LREM', KEYS[1], n - 1, id)
return 1
