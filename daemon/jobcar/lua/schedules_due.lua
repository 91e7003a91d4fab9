#!lua flags=no-writes
-- schedules_due: the queue's schedules whose tick is due, by Redis time (read-only).
--
-- KEYS[1] schedules  ZSET  name -> next tick ms
-- ARGV[1] prefix, ARGV[2] the most schedules to return
-- Returns {now_ms, ms until the earliest tick not yet due (-1: none), {spec JSON, next tick}..., {name, key,
-- type}...}: the last, the due schedules whose hash holds another type (fsck reports it), which cannot fire.

--- @include "keys"
--- @include "now_ms"

local now = now_ms()
-- Most reads find nothing due: the earliest tick alone answers them, in one read (ADR 0022).
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #head == 0 then return {now, -1, {}, {}} end
if tonumber(head[2]) > now then return {now, tonumber(head[2]) - now, {}, {}} end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local reply, broken = {}, {}
for _, name in ipairs(due) do
  local key = schedule_key_of(ARGV[1], name)
  local found = redis.pcall('HMGET', key, 'spec', 'next')
  if found.err then
    broken[#broken + 1] = {name, key, redis.call('TYPE', key).ok}
  elseif found[1] and found[2] and found[2] ~= '' then
    reply[#reply + 1] = found
  end
end
local later = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local next_in = -1
if #later > 0 then next_in = tonumber(later[2]) - now end
return {now, next_in, reply, broken}
