#!lua flags=allow-oom
-- repair/leaked_slot: a concurrency slot held for a job that is not active is given back, and one held job
-- of each group it counted in (its type's total, its key's) goes back to pending to take it (for a fair
-- type's total, the next key's in turn).
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix, ARGV[2] the job id,
-- ARGV[3] the job type whose slot hash holds it.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"
--- @include "group_names"
--- @include "turns"

local prefix, id, job_type = ARGV[1], ARGV[2], ARGV[3]
local slots = slots_key_of(prefix, job_type)
if redis.call('TYPE', slots).ok ~= 'hash' then return 0 end
local key = redis.call('HGET', slots, id)
if not key then return 0 end
local state = redis.pcall('HGET', job_key_of(prefix, id), 'state')
if state == 'active' then return 0 end
redis.call('HDEL', slots, id)
let_go(prefix, job_type, 1)
if key ~= '' then let_go(prefix, key_group(job_type, key), 1) end
return 1
