#!lua
-- schedule_set: create a schedule or change its spec. An unchanged spec keeps the tick it waits at, so a
-- daemon restarting with the same config neither fires a tick twice nor skips one.
--
-- KEYS[1] schedule   HASH  <prefix>schedule:<name>
-- KEYS[2] schedules  ZSET  name -> next tick ms
-- ARGV[1] prefix, ARGV[2] name, ARGV[3] the spec (JSON), ARGV[4] its digest, ARGV[5] origin: config | api
-- ARGV[6] the first tick of a new or changed spec ("": none)
-- Returns "created", "changed" or "unchanged". A changed spec keeps its counts and its pause.

--- @include "wrong_type"

local refused = wrong_type({KEYS[1], 'hash', KEYS[2], 'zset'})
if refused then return refused end
local found = redis.call('HMGET', KEYS[1], 'digest', 'paused')
redis.call('HSET', KEYS[1], 'origin', ARGV[5])
if found[1] == ARGV[4] then return 'unchanged' end
redis.call('HSET', KEYS[1], 'spec', ARGV[3], 'digest', ARGV[4], 'next', ARGV[6])
if ARGV[6] == '' or found[2] == '1' then
  redis.call('ZREM', KEYS[2], ARGV[2])
else
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[2])
end
if found[1] then return 'changed' end
return 'created'
