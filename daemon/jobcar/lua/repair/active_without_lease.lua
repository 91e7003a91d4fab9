#!lua flags=allow-oom
-- repair/active_without_lease: an active job without a token, or without a deadline entry, goes back
-- to pending.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix, ARGV[2] the job id.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"
--- @include "job_sets"
--- @include "unlease"

local id = ARGV[2]
local job = job_key_of(ARGV[1], id)
if redis.call('HGET', job, 'state') ~= 'active' then return 0 end
local sets = job_sets(id)
local token = redis.call('HGET', job, 'token')
if #sets == 0 or (#sets == 1 and sets[1] == 'active' and not token) then
  unlease(job, id)
  return 1
end
return 0
