#!lua
-- announce: a daemon's sweep of the fleet's entries, at its first announce and once a minute: entries of daemons
-- silent for longer than the forget time are deleted, so a kill -9ed daemon's entry does not stay. The daemon
-- writes its own entry itself (HSET, fleet.py), with the times this answers (ADR 0022).
--
-- KEYS[1] <namespace>:daemons  HASH daemon id -> its JSON object, "started_ms" (Redis time of its first
--                              announce) and "seen_ms" (Redis time of its last) among its fields
-- ARGV[1] the sweeping daemon's id
-- ARGV[2] the forget time (ms)
-- Returns {entries deleted as forgotten, the daemon's started_ms (its entry's, else now), the Redis time now
-- (ms)}. A daemons key of another type fails the read and is refused naming it; the TYPE is asked only then.

--- @include "now_ms"
--- @include "wrong_type"

local now = now_ms()
local entries = redis.pcall('HGETALL', KEYS[1])
if entries.err then return wrong_type({KEYS[1], 'hash'}) or redis.error_reply(entries.err) end

local forget_before = now - tonumber(ARGV[2])
local started = now
local forgotten = 0
for i = 1, #entries, 2 do
  local ok, entry = pcall(cjson.decode, entries[i + 1])
  if not (ok and type(entry) == 'table') then entry = {} end
  if entries[i] == ARGV[1] then
    started = tonumber(entry.started_ms) or now
  elseif (tonumber(entry.seen_ms) or 0) < forget_before then
    redis.call('HDEL', KEYS[1], entries[i])
    forgotten = forgotten + 1
  end
end
return {forgotten, started, now}
