#!lua flags=allow-oom
-- await_children: a running job's handler ends its attempt waiting for the job's children (the handler API):
-- the job leaves active for waiting, its dependencies its children, as a job enqueued with `after` waits
-- (ADR 0016). The caller then registers it with each child (`depend`, on the child's slot) and settles it
-- for those that had ended; once they all have, it runs again. The attempt is not spent.
--
-- KEYS[1] active    ZSET
-- KEYS[2] waiting   ZSET  id -> created ms
-- KEYS[3] job       HASH  <prefix>job:<id>
-- KEYS[4] children  ZSET  <prefix>children:<id>
-- ARGV[1] the queue's key prefix
-- ARGV[2] id
-- ARGV[3] the attempt's lease token
-- ARGV[4] what a child that dies or is canceled does to the job (its `on_dependency_failure`): "run" (it runs
--         again all the same, and reads how its children ended), "fail" or "cancel"
-- ARGV[5..] references of children not to wait for: its continuations, which wait for the job itself
-- Touches <prefix>deps:<id> SET (the children's references), the job's limit slots (given back), its
-- `attempt` (given back), `state` and `on_dependency_failure` fields.
-- Returns {"waiting", reference...} (the children, for the caller to register with), or {reason} when
-- refused ("lease lost", "canceled", "no children"): then nothing changed.

--- @include "keys"
--- @include "attempt_refusal"
--- @include "wrong_type"
--- @include "release_slots"
--- @include "call_in_chunks"

local prefix, id, token = ARGV[1], ARGV[2], ARGV[3]
local job_key = KEYS[3]
local refused = attempt_refusal(job_key, token)
if refused then return {refused} end
local deps = deps_key_of(prefix, id)
refused = wrong_type({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[4], 'zset', deps, 'set'})
if refused then return refused end
local skipped = {}
for i = 5, #ARGV do skipped[ARGV[i]] = true end
local children = {}
for _, ref in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  if not skipped[ref] then children[#children + 1] = ref end
end
if #children == 0 then return {'no children'} end

local slots, created = unpack(redis.call('HMGET', job_key, 'slots', 'created'))
redis.call('ZREM', KEYS[1], id)
release_slots(prefix, id, slots)
redis.call('HINCRBY', job_key, 'attempt', -1)
redis.call('HDEL', job_key, 'token', 'started', 'slots')
redis.call('HSET', job_key, 'state', 'waiting', 'on_dependency_failure', ARGV[4])
redis.call('DEL', deps)
call_in_chunks('SADD', deps, children)
redis.call('ZADD', KEYS[2], tonumber(created) or 0, id)
table.insert(children, 1, 'waiting')
return children
