#!lua flags=allow-oom
-- settle: tell a waiting job that some of its dependencies ended, all the same way, on the waiting job's
-- slot (ADR 0016). The daemons call it for each reference of an entry in a dependencies' <prefix>settled
-- list, and the producer for a dependency that had ended before it could register. Telling it twice
-- changes nothing.
--
-- KEYS[1] pending    LIST  (a job of priority p > 0 goes to `pending:<p>`)
-- KEYS[2] waiting    ZSET  id -> created ms
-- KEYS[3] dead       ZSET
-- KEYS[4] wake       LIST
-- KEYS[5] job        HASH  <prefix>job:<id>
-- (A release writes KEYS[1], KEYS[2] and KEYS[4] as includes/release_waiting.lua names them, from ARGV[1].)
-- ARGV[1] the queue's key prefix
-- ARGV[2] id
-- ARGV[3] how they ended: "done", "dead", "canceled" or "gone" (no such job when the producer registered)
-- ARGV[4] dead set max jobs, ARGV[5] dead set max age ms
-- ARGV[6] for a batch's callback, the batch's counts (a JSON object), else "": the job's payload (its
--         callback data, JSON) becomes {"batch": <counts>, "data": <that payload>} when it runs
-- ARGV[7..] the dependencies' references "<queue>/<id>"
-- Touches <prefix>deps:<id> SET (the references removed; deleted with the job's last one). Dependencies
-- that did not end done fail the job by its `on_dependency_failure`: "fail" (the default: to the dead-letter
-- set with the reason "dependency <reference> <outcome>", naming the first of them it waited for),
-- "cancel" (deleted, as a cancel does) or "run" (they count as done). Either way its own dependents are
-- told (includes/tell_dependents.lua).
-- Returns "pending" (those were its last dependencies: it runs now), "waiting" (others remain), "dead",
-- "canceled", or "ignored" (not waiting, or for none of these: told before).
-- A job that would end so while it has dependents of its own and <prefix>settled holds another type is
-- refused (includes/tell_dependents.lua, untold_refusal): nothing changed, and the reply names the key; the
-- daemons keep the entry that asked, and carry it again once fsck repaired the key.

--- @include "keys"
--- @include "now_ms"
--- @include "move_to_dead"
--- @include "release_unique"
--- @include "count_in_batch"
--- @include "tell_dependents"
--- @include "release_waiting"
--- @include "handler_data"

local prefix, id, outcome, counts = ARGV[1], ARGV[2], ARGV[3], ARGV[6]
local job_key = KEYS[5]
local refs = {}
for i = 7, #ARGV do refs[#refs + 1] = ARGV[i] end
-- Done (the common case): release_waiting checks the job and its dependencies itself.
if outcome == 'done' then return release_waiting(prefix, id, refs, counts) end
if redis.pcall('HGET', job_key, 'state') ~= 'waiting' then return 'ignored' end
local policy = redis.call('HGET', job_key, 'on_dependency_failure') or 'fail'
if policy == 'run' then return release_waiting(prefix, id, refs, counts) end

local deps = deps_key_of(prefix, id)
if redis.call('TYPE', deps).ok ~= 'set' then return 'ignored' end
local failed = nil  -- the first of them the job waited for, which its reason names
for _, ref in ipairs(refs) do
  if redis.call('SISMEMBER', deps, ref) == 1 then
    failed = ref
    break
  end
end
if not failed then return 'ignored' end
-- Before the first write: a job others wait for does not end while it could not tell them.
local marked = redis.call('HGET', job_key, 'dependents')
local refused = untold_refusal(prefix, marked)
if refused then return refused end
redis.call('ZREM', KEYS[2], id)
redis.call('DEL', deps)
if policy == 'cancel' then
  release_unique(prefix, job_key, id)
  count_in_batch(prefix, job_key, 'canceled', 1)
  tell_dependents(prefix, job_key, id, 'canceled', marked)
  redis.call('DEL', job_key)
  drop_handler_data(prefix, id)
  return 'canceled'
end
move_to_dead(prefix, KEYS[3], job_key, id, now_ms(), 'dependency ' .. failed .. ' ' .. outcome,
  tonumber(ARGV[4]), tonumber(ARGV[5]))
return 'dead'
