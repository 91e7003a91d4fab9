#!lua flags=allow-oom
-- purge: delete dead jobs for good.
--
-- KEYS[1] dead  ZSET  id -> died-at ms
-- ARGV[1] the queue's key prefix
-- ARGV[2] the most jobs to delete in this call ("purge all" calls again until it returns 0)
-- ARGV[3..] ids to delete; none means the oldest dead jobs, up to ARGV[2]
-- Touches <prefix>job:<id> HASH and its handler data (deleted).
-- Returns the number of jobs deleted. Ids that are not in the dead set are skipped.

--- @include "keys"
--- @include "handler_data"

local prefix = ARGV[1]
local ids = {}
if #ARGV > 2 then
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
end
local deleted = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('DEL', job_key_of(prefix, id))
    drop_handler_data(prefix, id)
    deleted = deleted + 1
  end
end
return deleted
