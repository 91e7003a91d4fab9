#!lua
-- adopt: record jobs a running job's handler is about to enqueue as its children (the handler API), on the
-- parent's slot, before they are stored: a handler whose lease was lost makes no child.
--
-- KEYS[1] job       HASH  <prefix>job:<id>  (the parent)
-- KEYS[2] children  ZSET  <prefix>children:<id>  reference "<queue>/<id>" -> creation ms
-- ARGV[1] the attempt's lease token
-- ARGV[2] the most children a job may have
-- ARGV[3..] the children's references
-- Touches the parent's `handler_data` field. Not allowed to grow a server out of memory.
-- Returns "ok", "too many children" (the new references would take it past ARGV[2]: nothing recorded), or why it
-- was refused ("lease lost", "canceled").

--- @include "attempt_refusal"
--- @include "wrong_type"
--- @include "now_ms"

local refused = attempt_refusal(KEYS[1], ARGV[1])
if refused then return refused end
refused = wrong_type({KEYS[2], 'zset'})
if refused then return refused end
-- A child named again (a handler's retried call, or a later attempt making the same child) is no new child: only
-- the new references count against the bound, each once.
local new, seen = 0, {}
for i = 3, #ARGV do
  if not seen[ARGV[i]] and not redis.call('ZSCORE', KEYS[2], ARGV[i]) then new = new + 1 end
  seen[ARGV[i]] = true
end
if redis.call('ZCARD', KEYS[2]) + new > tonumber(ARGV[2]) then return 'too many children' end
local now = now_ms()
for i = 3, #ARGV do redis.call('ZADD', KEYS[2], 'NX', now, ARGV[i]) end
redis.call('HSET', KEYS[1], 'handler_data', '1')
return 'ok'
