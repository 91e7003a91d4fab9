#!lua flags=allow-oom
-- repair/orphan_handler_data: a job's log, steps or children (what its handlers wrote beside its hash) whose
-- job hash is gone is deleted: every script that deletes a job deletes them too (includes/handler_data.lua),
-- and nothing reads them without it.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix.
-- ARGV[2] the key, ARGV[3] the id of the job it belongs to.
-- Returns 1 when it repaired, 0 when what it repairs no longer holds (nothing written).

--- @include "keys"

local prefix, key, id = ARGV[1], ARGV[2], ARGV[3]
if key ~= log_key_of(prefix, id) and key ~= steps_key_of(prefix, id) and key ~= children_key_of(prefix, id) then
  return 0
end
if redis.call('EXISTS', job_key_of(prefix, id)) == 1 or redis.call('EXISTS', key) == 0 then return 0 end
redis.call('DEL', key)
return 1
