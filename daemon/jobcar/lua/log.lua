#!lua
-- log: append lines to a running job's log (the handler API), keeping it within its bounds: the oldest
-- lines are dropped first, and counted.
--
-- KEYS[1] job  HASH  <prefix>job:<id>
-- KEYS[2] log  LIST  <prefix>log:<id>
-- ARGV[1] the attempt's lease token
-- ARGV[2] the most lines kept, ARGV[3] the most bytes kept (of the entries)
-- ARGV[4..] the entries, oldest first, each a JSON object {"at", "attempt", "line"} (built by the caller)
-- Touches the job's `log_bytes` (the entries' bytes kept), `log_dropped` (how many were dropped) and
-- `handler_data` fields. Not allowed to grow a server out of memory: that write fails, nothing is kept.
-- Returns {"ok", lines kept, dropped in all}, or {reason} when refused ("lease lost", "canceled"): then nothing
-- changed.

--- @include "attempt_refusal"
--- @include "wrong_type"

local refused = attempt_refusal(KEYS[1], ARGV[1])
if refused then return {refused} end
refused = wrong_type({KEYS[2], 'list'})
if refused then return refused end
local max_lines, max_bytes = tonumber(ARGV[2]), tonumber(ARGV[3])
local kept = tonumber(redis.call('HGET', KEYS[1], 'log_bytes') or '0') or 0
local bytes = 0
local entries = {}
for i = 4, #ARGV do
  entries[#entries + 1] = ARGV[i]
  bytes = bytes + #ARGV[i]
end
local length = redis.call('RPUSH', KEYS[2], unpack(entries))
-- `log_bytes` counts the list's older entries: none when the list was gone (deleted by fsck when it held
-- another type), whatever the field still says.
if length > #entries then bytes = bytes + kept end
local dropped = 0
while length > 0 and (length > max_lines or bytes > max_bytes) do
  bytes = bytes - #redis.call('LPOP', KEYS[2])
  length = length - 1
  dropped = dropped + 1
end
redis.call('HSET', KEYS[1], 'log_bytes', bytes, 'handler_data', '1')
local total = tonumber(redis.call('HGET', KEYS[1], 'log_dropped') or '0') or 0
if dropped > 0 then total = redis.call('HINCRBY', KEYS[1], 'log_dropped', dropped) end
return {'ok', length, total}
