#!lua flags=allow-oom
-- repair/orphan_hash: a job hash in no state set goes where its state says; a held one (its limit group's
-- list lost it) goes back to pending, where the lease holds it again if its group is still full.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix, ARGV[2] the job id.
-- ARGV[3] the state the check saw.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"
--- @include "now_ms"
--- @include "wake"
--- @include "job_sets"
--- @include "pending_key"

local id = ARGV[2]
local job = job_key_of(ARGV[1], id)
local state = redis.call('HGET', job, 'state')
if state ~= ARGV[3] or #job_sets(id) > 0 then return 0 end
local now = now_ms()
if state == 'pending' or state == 'held' then
  redis.call('HSET', job, 'state', 'pending')
  redis.call('LPUSH', pending_key(KEYS[1], redis.call('HGET', job, 'priority')), id)
  wake(KEYS[5])
elseif state == 'scheduled' then
  local run_at = tonumber(redis.call('HGET', job, 'run_at') or '') or now
  redis.call('ZADD', KEYS[2], run_at, id)
  wake(KEYS[5])
elseif state == 'dead' then
  redis.call('ZADD', KEYS[4], now, id)
elseif state == 'waiting' then
  redis.call('ZADD', waiting_key_of(ARGV[1]), tonumber(redis.call('HGET', job, 'created') or '') or now, id)
else
  return 0
end
return 1
