#!lua flags=no-writes
-- history: one queue's fleet-wide counts of finished attempts over the last one to two hours.
--
-- KEYS[1] <prefix>history  not read: it names the queue's slot (see count)
-- ARGV[1] the queue's key prefix
-- Returns {now_ms, this hour's fields, the previous hour's fields}, each field list flat:
--   {"<slot>|<type>|<outcome>", count, ...} with slot = floor(ms / 10 s).

--- @include "keys"
--- @include "now_ms"
--- @include "wrong_type"

local HOUR_MS = 3600000
local prefix = ARGV[1]
local now = now_ms()
local hour = math.floor(now / HOUR_MS)
local refused = wrong_type({history_key_of(prefix, hour), 'hash', history_key_of(prefix, hour - 1), 'hash'})
if refused then return refused end
local this_hour = redis.call('HGETALL', history_key_of(prefix, hour))
return {now, this_hour, redis.call('HGETALL', history_key_of(prefix, hour - 1))}
