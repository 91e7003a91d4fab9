#!lua flags=allow-oom
-- repair/rebuild_deps: a waiting job's deps key that holds another type than a SET (written by something
-- else), or that is gone while the job still waits (deleted by hand), is rebuilt from the job's own `after`
-- field, every reference it was stored to wait for (a job that ran, and waits for the children its handler
-- made, from its children ZSET instead): the job must never run before its dependencies, and
-- what the key held (or its absence) cannot say which of them ended. fsck then asks each
-- of those dependencies how it stands, as for a lost dependency (fsck/waiting.py), so that one ended before
-- tells the job now. A waiting job without a readable `after` goes to the dead set with the reason. A key of
-- a job no longer waiting is only deleted.
-- KEYS[1..5] the queue's pending scheduled active dead wake; ARGV[1] its key prefix.
-- ARGV[2] the job id, ARGV[3] the type the key held when checked ("none": gone), ARGV[4] dead set max jobs, ARGV[5] dead
-- set max age ms.
-- Returns the references the SET was rebuilt with ({} when the job was not waiting or went to the dead set),
-- or 0 when the key no longer holds that type (nothing written).

--- @include "keys"
--- @include "now_ms"
--- @include "move_to_dead"

local prefix, id, seen = ARGV[1], ARGV[2], ARGV[3]
local deps = deps_key_of(prefix, id)
local held = redis.call('TYPE', deps).ok
if held ~= seen or held == 'set' then return 0 end
redis.call('DEL', deps)
local job = job_key_of(prefix, id)
if redis.pcall('HGET', job, 'state') ~= 'waiting' then return {} end
local attempt, after = unpack(redis.call('HMGET', job, 'attempt', 'after'))
local ok, refs, readable
if attempt then
  -- A job that ran waits for the children its handler made (await_children), whatever its `after` said.
  refs = redis.pcall('ZRANGE', children_key_of(prefix, id), 0, -1)
  readable = not refs.err and #refs > 0
else
  ok, refs = pcall(cjson.decode, after or '')
  readable = ok and type(refs) == 'table' and #refs > 0
  if readable then
    for _, ref in ipairs(refs) do readable = readable and type(ref) == 'string' end
  end
end
if not readable then
  redis.call('ZREM', waiting_key_of(prefix), id)
  local lost = held == 'none' and (deps .. ' was gone') or (deps .. ' held a ' .. held .. ', not a set')
  local named = attempt and 'its children (it waited for them)' or 'none (after)'
  move_to_dead(prefix, KEYS[4], job, id, now_ms(), 'its dependencies could not be read: ' .. lost ..
    ', and the job names ' .. named, tonumber(ARGV[4]), tonumber(ARGV[5]))
  return {}
end
for first = 1, #refs, 1000 do
  redis.call('SADD', deps, unpack(refs, first, math.min(first + 999, #refs)))
end
return refs
