#!lua flags=no-writes
-- log_read: a job's log lines from an index on, or its last lines, with its state: in one script, since a log
-- write drops the oldest lines while a reader follows them.
--
-- KEYS[1] job  HASH  <prefix>job:<id>
-- KEYS[2] log  LIST  <prefix>log:<id>
-- ARGV[1] the index of the first line wanted, counting every line ever written (the dropped ones too), or ""
-- ARGV[2] how many of the last lines are wanted, or ""
-- Returns {state, lines dropped, the index of the first line returned (counted the same way), {line...}}.

local state = redis.call('HGET', KEYS[1], 'state')
local dropped = tonumber(redis.call('HGET', KEYS[1], 'log_dropped') or '0') or 0
if redis.call('TYPE', KEYS[2]).ok ~= 'list' then return {state, dropped, dropped, {}} end
local length = redis.call('LLEN', KEYS[2])
local start
if ARGV[2] ~= '' then
  start = math.max(0, length - tonumber(ARGV[2]))
else
  start = math.max(0, tonumber(ARGV[1]) - dropped)
end
return {state, dropped, dropped + start, redis.call('LRANGE', KEYS[2], start, -1)}
