#!lua flags=allow-oom
-- repair/waiting_for_nothing: a job waiting for others with none left to wait for (its deps SET emptied or
-- deleted by hand) runs: it becomes pending, as the settle of its last dependency would have made it.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix, ARGV[2] the job id.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"
--- @include "now_ms"
--- @include "wake"
--- @include "pending_key"

local prefix, id = ARGV[1], ARGV[2]
local job = job_key_of(prefix, id)
if redis.pcall('HGET', job, 'state') ~= 'waiting' then return 0 end
-- A deps key of another type is not nothing: what the job waits for cannot be read there, and running it
-- could run it before its dependencies (repair/mistyped_deps.lua rebuilds it instead).
local deps = redis.pcall('SCARD', deps_key_of(prefix, id))
if type(deps) ~= 'number' or deps > 0 then return 0 end
redis.call('DEL', deps_key_of(prefix, id))
redis.call('ZREM', waiting_key_of(prefix), id)
redis.call('HSET', job, 'state', 'pending', 'run_at', now_ms())
redis.call('LPUSH', pending_key(KEYS[1], redis.call('HGET', job, 'priority')), id)
wake(KEYS[5])
return 1
