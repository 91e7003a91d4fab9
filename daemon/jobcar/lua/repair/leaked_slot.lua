#!lua flags=allow-oom
-- repair/leaked_slot: a concurrency slot held for a job that is not active is given back, and one held job
-- of its group goes back to pending to take it (for a fair type's total, the next key's in turn).
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix, ARGV[2] the job id,
-- ARGV[3] the limit group.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "turns"

local prefix, id, group = ARGV[1], ARGV[2], ARGV[3]
local running = prefix .. 'running:' .. group
if redis.call('TYPE', running).ok ~= 'set' or redis.call('SISMEMBER', running, id) == 0 then return 0 end
local state = redis.pcall('HGET', prefix .. 'job:' .. id, 'state')
if state == 'active' then return 0 end
redis.call('SREM', running, id)
let_go(prefix, group, 1)
return 1
