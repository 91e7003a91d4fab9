#!lua
-- announce: a daemon's sweep: it says it is alive (or, stopping, that it is gone), and entries of daemons silent
-- for longer than the forget time are deleted on the way, so a kill -9ed daemon's entry does not stay. A daemon
-- sweeps at its first announce and once a minute; the renewals between are an HSET of its own entry, whose
-- times it takes from this reply (fleet.py, ADR 0022).
--
-- KEYS[1] <namespace>:daemons  HASH daemon id -> its JSON object, with "started_ms" (Redis time of its first
--                              announce, kept by the later ones) and "seen_ms" (Redis time of this one) added
-- ARGV[1] the daemon's id
-- ARGV[2] its JSON object, both times left out; "" withdraws the entry (a daemon stopping)
-- ARGV[3] the forget time (ms)
-- Returns {entries deleted as forgotten, the daemon's started_ms, the Redis time now (ms)}.

--- @include "now_ms"
--- @include "wrong_type"

local now = now_ms()

-- One read of the entries: this daemon's own gives its first announce's time, the others are looked at for
-- the forget time. A daemons key of another type fails that read and is refused naming it; the TYPE is asked
-- only then.
local entries = redis.pcall('HGETALL', KEYS[1])
if entries.err then return wrong_type({KEYS[1], 'hash'}) or redis.error_reply(entries.err) end

local forget_before = now - tonumber(ARGV[3])
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
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  -- The object is the daemon's own JSON ("{...}"): its last brace gives way to the two times.
  local times = string.format(',"started_ms":%.0f,"seen_ms":%.0f}', started, now)
  redis.call('HSET', KEYS[1], ARGV[1], string.sub(ARGV[2], 1, -2) .. times)
end
return {forgotten, started, now}
