#!lua flags=allow-oom
-- schedule_state: pause, resume or remove a schedule (an operator's script: allowed on a full server).
--
-- KEYS[1] schedule   HASH  <prefix>schedule:<name>
-- KEYS[2] schedules  ZSET  name -> next tick ms
-- ARGV[1] prefix, ARGV[2] name, ARGV[3] pause | resume | remove
-- ARGV[4] resume: the tick to wait at, the first after now (ticks passed while paused are not fired)
-- Returns 1 changed, 0 already so, -1 no such schedule.

--- @include "wrong_type"

local refused = wrong_type({KEYS[1], 'hash', KEYS[2], 'zset'})
if refused then return refused end
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local action = ARGV[3]
if action == 'remove' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 1
end
local paused = redis.call('HGET', KEYS[1], 'paused') == '1'
if action == 'pause' then
  if paused then return 0 end
  redis.call('HSET', KEYS[1], 'paused', '1')
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 1
end
if not paused then return 0 end
redis.call('HDEL', KEYS[1], 'paused')
local finished = redis.call('HGET', KEYS[1], 'next') == ''
if not finished then
  redis.call('HSET', KEYS[1], 'next', ARGV[4])
  if ARGV[4] == '' then
    redis.call('ZREM', KEYS[2], ARGV[2])
  else
    redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
  end
end
return 1
