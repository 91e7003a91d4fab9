#!lua flags=allow-oom
-- cancel: stop a job from running. A waiting job is deleted; a running one is flagged, and the
-- daemon running it sees the flag at its next heartbeat, stops the handler and acks it "canceled".
--
-- KEYS[1] pending    LIST  (a job of priority p > 0 waits in `pending:<p>`)
-- KEYS[2] scheduled  ZSET
-- KEYS[3] job        HASH  <prefix>job:<id>
-- ARGV[1] the queue's key prefix
-- ARGV[2] id
-- Touches <prefix>unique:<key> (released), <prefix>batch:<batch> (canceled += 1), <prefix>settled (the jobs
-- waiting for it are told: includes/tell_dependents.lua); a waiting job leaves <prefix>waiting and its
-- <prefix>deps:<id>.
-- Returns {result, state before}:
--   {"canceled", "pending"|"scheduled"|"held"|"waiting"}  deleted (a held job leaves its limit group's list)
--   {"cancel_requested", "active"}       flagged; the running daemon finishes it
--   {"not_cancelable", "dead"|"done"|"canceled"}  already finished; nothing changed
--   {"missing", ""}                      no such job
-- A job others wait for, while <prefix>settled holds another type, is refused (includes/tell_dependents.lua,
-- untold_refusal): nothing changed, and the reply names the key.

--- @include "keys"
--- @include "release_unique"
--- @include "pending_key"
--- @include "count_in_batch"
--- @include "unpark"
--- @include "tell_dependents"
--- @include "handler_data"
--- @include "count_pending"

local prefix, id = ARGV[1], ARGV[2]
local state = redis.call('HGET', KEYS[3], 'state')
if not state then return {'missing', ''} end
if state == 'active' then
  redis.call('HSET', KEYS[3], 'cancel', '1')
  return {'cancel_requested', state}
end
if state ~= 'pending' and state ~= 'scheduled' and state ~= 'waiting' and state ~= 'held' then
  return {'not_cancelable', state}
end
-- Before the first write: a job others wait for is not deleted while it could not tell them.
local marked = redis.call('HGET', KEYS[3], 'dependents')
local refused = untold_refusal(prefix, marked)
if refused then return refused end
if state == 'pending' then
  if redis.call('LREM', pending_key(KEYS[1], redis.call('HGET', KEYS[3], 'priority')), -1, id) == 0 then
    redis.pcall('LREM', released_key_of(prefix), -1, id)  -- let go by a limit (ADR 0014)
  end
elseif state == 'scheduled' then
  redis.call('ZREM', KEYS[2], id)
elseif state == 'waiting' then
  redis.call('ZREM', waiting_key_of(prefix), id)
  redis.call('DEL', deps_key_of(prefix, id))
elseif state == 'held' then
  local group = redis.call('HGET', KEYS[3], 'held')
  if group then
    redis.pcall('LREM', held_key_of(prefix, group), -1, id)
    forget_idle_group(prefix, group)
  end
end
if is_counted(state) then count_pending(prefix, redis.call('HGET', KEYS[3], 'type'), -1) end
release_unique(prefix, KEYS[3], id)
count_in_batch(prefix, KEYS[3], 'canceled', 1)
tell_dependents(prefix, KEYS[3], id, 'canceled', marked)
redis.call('DEL', KEYS[3])
drop_handler_data(prefix, id)
return {'canceled', state}
