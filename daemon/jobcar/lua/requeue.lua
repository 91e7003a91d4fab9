#!lua flags=allow-oom
-- requeue: move dead jobs back to pending with their attempts reset (after fixing a handler).
--
-- KEYS[1] dead     ZSET  id -> died-at ms
-- KEYS[2] pending  LIST
-- KEYS[3] wake     LIST
-- ARGV[1] the queue's key prefix
-- ARGV[2] the most jobs to move in this call ("requeue all" calls again until it returns 0)
-- ARGV[3..] ids to requeue; none means the oldest dead jobs, up to ARGV[2]
-- Touches <prefix>job:<id> HASH (state=pending, attempt=0), <prefix>batch:<batch> (dead -= 1).
-- Returns the number of jobs moved. Ids that are not in the dead set are skipped.
-- The unique lock a job had was released when it died; a requeued job does not take it again.

--- @include "keys"
--- @include "now_ms"
--- @include "wake"
--- @include "count_in_batch"
--- @include "move_to_pending"
--- @include "wrong_type"

local refused = wrong_type({KEYS[1], 'zset', KEYS[2], 'list'})
if refused then return refused end

local prefix = ARGV[1]
local ids = {}
if #ARGV > 2 then
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
end

local now = now_ms()
local moved = 0
for _, id in ipairs(ids) do
  -- ZREM first: an id named twice, or not dead, is moved at most once.
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local job_key = job_key_of(prefix, id)
    -- An id without a hash, or whose key holds another type (fsck's to report), only leaves the set.
    if redis.call('TYPE', job_key).ok == 'hash' then
      redis.call('HSET', job_key, 'attempt', 0, 'run_at', now)
      redis.call('HDEL', job_key, 'finished', 'deferrals')
      count_in_batch(prefix, job_key, 'dead', -1)
      move_to_pending(prefix, job_key, KEYS[2], id)
      moved = moved + 1
    end
  end
end
if moved > 0 then wake(KEYS[3]) end
return moved
