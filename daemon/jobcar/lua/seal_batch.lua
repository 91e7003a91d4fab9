#!lua flags=allow-oom
-- seal_batch: the producer has enqueued every job of a batch; the batch's callbacks (jobs stored before,
-- waiting for "<queue>/batch:<id>") are told once all of its jobs have ended (ADR 0016).
--
-- KEYS[1] batch  HASH  <prefix>batch:<batch>
-- ARGV[1] the queue's key prefix
-- ARGV[2] the batch id
-- ARGV[3..] references "<queue>/<id>" of the callbacks (none: only sealed)
-- Touches <prefix>dependents:batch:<batch> SET, the batch's `sealed` and `dependents` fields; when every
-- job has ended already, <prefix>settled (includes/add_to_batch.lua).
-- Returns "sealed" (its callbacks are told when its last job ends), "complete" (every job had ended: told
-- now), or "fired" (told before, by an earlier seal: the callbacks named now are not, and nothing changed).
-- A seal that would tell callbacks now while <prefix>settled holds another type is refused: nothing changed,
-- and the reply names the key.

--- @include "keys"
--- @include "wrong_type"
--- @include "add_to_batch"

local refused = wrong_type({KEYS[1], 'hash'})
if refused then return refused end
local prefix, batch = ARGV[1], ARGV[2]
local f = redis.call('HMGET', KEYS[1], 'fired', 'dependents', 'total', 'done', 'dead', 'canceled')
if f[1] then return 'fired' end
-- Before the first write: a seal that would fire the batch (every job ended) with callbacks to tell does
-- not, while <prefix>settled holds another type (includes/tell_dependents.lua).
local ended = (tonumber(f[4]) or 0) + (tonumber(f[5]) or 0) + (tonumber(f[6]) or 0)
if ended >= (tonumber(f[3]) or 0) then
  refused = untold_refusal(prefix, (#ARGV >= 3 or f[2]) and '1' or nil)
  if refused then return refused end
end
if #ARGV >= 3 then
  local refs = {}
  for i = 3, #ARGV do refs[#refs + 1] = ARGV[i] end
  redis.call('SADD', dependents_key_of(prefix, 'batch:' .. batch), unpack(refs))
  redis.call('HSET', KEYS[1], 'dependents', '1')
end
redis.call('HSET', KEYS[1], 'sealed', '1')
redis.call('PEXPIRE', KEYS[1], BATCH_TTL_MS)
if fire_batch(prefix, batch, KEYS[1]) then return 'complete' end  -- its first value: it fired
return 'sealed'
