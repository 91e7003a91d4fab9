#!lua flags=allow-oom
-- settle: tell a waiting job that one of its dependencies ended, on the waiting job's slot (ADR 0016). The
-- daemons call it for each reference of an entry in a dependency's <prefix>settled list, and the producer
-- for a dependency that had ended before it could register. Telling it twice changes nothing.
--
-- KEYS[1] pending    LIST  (a job of priority p > 0 goes to `pending:<p>`)
-- KEYS[2] waiting    ZSET  id -> created ms
-- KEYS[3] dead       ZSET
-- KEYS[4] wake       LIST
-- KEYS[5] job        HASH  <prefix>job:<id>
-- ARGV[1] the queue's key prefix
-- ARGV[2] id
-- ARGV[3] the dependency's reference "<queue>/<id>"
-- ARGV[4] how it ended: "done", "dead", "canceled" or "gone" (no such job when the producer registered)
-- ARGV[5] dead set max jobs, ARGV[6] dead set max age ms
-- ARGV[7] (optional) for a batch's callback: the batch's counts, a JSON object; the job's payload (its
--         callback data, JSON) becomes {"batch": <counts>, "data": <that payload>} when it runs
-- Touches <prefix>deps:<id> SET (the reference removed; deleted with the job's last one). A dependency that
-- did not end done fails the job by its `on_dependency_failure`: "fail" (the default: to the dead-letter
-- set with the reason "dependency <reference> <outcome>"), "cancel" (deleted, as a cancel does) or "run"
-- (counts as done). Either way its own dependents are told (includes/tell_dependents.lua).
-- Returns "pending" (that was its last dependency: it runs now), "waiting" (others remain), "dead",
-- "canceled", or "ignored" (not waiting, or not for this dependency: told before).

--- @include "now_ms"
--- @include "wake"
--- @include "pending_key"
--- @include "move_to_dead"
--- @include "release_unique"
--- @include "count_in_batch"
--- @include "tell_dependents"

local prefix, id, ref, outcome = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local job_key = KEYS[5]
if redis.pcall('HGET', job_key, 'state') ~= 'waiting' then return 'ignored' end
local deps = prefix .. 'deps:' .. id
local removed = redis.pcall('SREM', deps, ref)
if removed ~= 1 then return 'ignored' end

local policy = redis.call('HGET', job_key, 'on_dependency_failure') or 'fail'
if outcome ~= 'done' and policy ~= 'run' then
  redis.call('ZREM', KEYS[2], id)
  redis.call('DEL', deps)
  if policy == 'cancel' then
    release_unique(prefix, job_key, id)
    count_in_batch(prefix, job_key, 'canceled', 1)
    tell_dependents(prefix, job_key, id, 'canceled')
    redis.call('DEL', job_key)
    return 'canceled'
  end
  move_to_dead(prefix, KEYS[3], job_key, id, now_ms(), 'dependency ' .. ref .. ' ' .. outcome,
    tonumber(ARGV[5]), tonumber(ARGV[6]))
  return 'dead'
end
if redis.call('SCARD', deps) > 0 then return 'waiting' end
if ARGV[7] and ARGV[7] ~= '' then
  -- Spliced, not re-encoded: cjson would round the producer's numbers.
  local data = redis.call('HGET', job_key, 'payload') or 'null'
  redis.call('HSET', job_key, 'payload', '{"batch":' .. ARGV[7] .. ',"data":' .. data .. '}')
end
redis.call('ZREM', KEYS[2], id)
redis.call('HSET', job_key, 'state', 'pending')
redis.call('LPUSH', pending_key(KEYS[1], redis.call('HGET', job_key, 'priority')), id)
wake(KEYS[4])
return 'pending'
