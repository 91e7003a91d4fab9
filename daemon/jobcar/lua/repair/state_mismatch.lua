#!lua flags=allow-oom
-- repair/state_mismatch: the hash takes the state of the one set the id is in (an active job without
-- a token goes back to pending instead).
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix, ARGV[2] the job id.
-- ARGV[3] that set, ARGV[4] the hash's state the check saw.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"
--- @include "job_sets"
--- @include "unlease"

local id = ARGV[2]
local job = job_key_of(ARGV[1], id)
local sets = job_sets(id)
local state = redis.call('HGET', job, 'state')
if #sets ~= 1 or sets[1] ~= ARGV[3] or state == ARGV[3] or (state or '') ~= ARGV[4] then return 0 end
if ARGV[3] == 'active' and not redis.call('HGET', job, 'token') then
  unlease(job, id)
  return 1
end
redis.call('HSET', job, 'state', ARGV[3])
if ARGV[3] ~= 'active' then redis.call('HDEL', job, 'token') end
return 1
