#!lua
-- announce: a daemon says it is alive (or, stopping, that it is gone); entries of daemons silent for
-- longer than the forget time are deleted on the way, so a kill -9ed daemon's entry does not stay.
--
-- KEYS[1] <namespace>:daemons  HASH daemon id -> its JSON object, with "started_ms" (Redis time of its first
--                              announce, kept by the later ones) and "seen_ms" (Redis time of this one) added
-- ARGV[1] the daemon's id
-- ARGV[2] its JSON object, both times left out; "" withdraws the entry (a daemon stopping)
-- ARGV[3] the forget time (ms)
-- ARGV[4] the daemon's started_ms as an earlier reply gave it: a renewal that reads nothing (TIME and HSET);
--         "" (or anything not a number) reads every entry, for this daemon's started_ms and to delete the
--         forgotten ones (a daemon's first announce, and one a minute)
-- Returns {entries deleted as forgotten, the daemon's started_ms}.

--- @include "now_ms"
--- @include "wrong_type"

local now = now_ms()
local known_start = tonumber(ARGV[4])
if known_start and ARGV[2] ~= '' then
  local times = string.format(',"started_ms":%.0f,"seen_ms":%.0f}', known_start, now)
  -- A daemons key of another type (written by hand) fails the HSET, the renewal's only command on it, and
  -- is refused naming it, not a bare WRONGTYPE: the TYPE is asked only then (ADR 0022).
  local written = redis.pcall('HSET', KEYS[1], ARGV[1], string.sub(ARGV[2], 1, -2) .. times)
  if type(written) == 'table' and written.err then
    return wrong_type({KEYS[1], 'hash'}) or redis.error_reply(written.err)
  end
  return {0, known_start}
end

-- One read of the entries: this daemon's own gives its first announce's time, the others are looked at for
-- the forget time. A daemons key of another type fails that read and is refused naming it, as above.
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
return {forgotten, started}
