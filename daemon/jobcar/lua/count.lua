#!lua
-- count: add one daemon's counts of finished attempts to its queue's fleet-wide history.
--
-- KEYS[1] <prefix>history  not written: it names the queue's slot; counts go to <prefix>history:<hour>
-- ARGV[1] the queue's key prefix
-- ARGV[2..] pairs: field, count; a field is "<type>|<outcome>", outcome one of done, failed, dead
-- Touches <prefix>history:<hour> HASH "<slot>|<type>|<outcome>" -> count, where hour = floor(now / 1 h)
--   and slot = floor(now / 10 s) (Redis time); each hour's hash expires two hours after the hour ends.
-- Returns the number of fields counted. Not allowed under OOM: a count is never worth a job's memory.

--- @include "keys"
--- @include "now_ms"
--- @include "wrong_type"

local HOUR_MS, SLOT_MS = 3600000, 10000
local prefix = ARGV[1]
local now = now_ms()
local hour, slot = math.floor(now / HOUR_MS), math.floor(now / SLOT_MS)
local key = history_key_of(prefix, hour)
-- A count of another type (written by hand) is refused naming it, before the first write.
local refused = wrong_type({key, 'hash'})
if refused then return refused end
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', key, slot .. '|' .. ARGV[i], tonumber(ARGV[i + 1]))
end
redis.call('PEXPIREAT', key, (hour + 3) * HOUR_MS)
return (#ARGV - 1) / 2
