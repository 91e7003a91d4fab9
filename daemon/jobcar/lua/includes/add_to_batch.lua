--- @include "batch_counters"
--- @include "now_ms"
--- @include "tell_dependents"
--- @include "queue_name"

-- Count a job's end in its batch (`done`, `dead`, `canceled`: includes/batch_counters.lua). A batch sealed by its
-- producer (seal_batch.lua: every job of it is enqueued) whose jobs have all ended tells its callbacks once: the
-- script whose count makes it so, atomically with that count, sets `fired`. A job requeued from the dead-letter
-- queue later counts again but fires nothing more.

-- Tell the callbacks of a sealed batch whose every job has ended, unless told before. Returns whether it
-- did, and whether it left an entry for the daemons to carry (callbacks in the batch's queue are told in
-- this script when the batch ended done).
local function fire_batch(prefix, batch, key)
  local f = redis.call('HMGET', key, 'sealed', 'fired', 'total', 'done', 'dead', 'canceled')
  if not f[1] or f[2] then return false, false end
  local total, done = tonumber(f[3]) or 0, tonumber(f[4]) or 0
  local dead, canceled = tonumber(f[5]) or 0, tonumber(f[6]) or 0
  if done + dead + canceled < total then return false, false end
  redis.call('HSET', key, 'fired', now_ms())
  local counts = {queue = queue_name(prefix), batch = batch, total = total, done = done, dead = dead,
    canceled = canceled}
  return true, tell_dependents(prefix, key, 'batch:' .. batch, (dead + canceled == 0) and 'done' or 'dead', nil, counts)
end

-- True when this count ended the batch and left an entry for the daemons to carry to its callbacks.
local function add_to_batch(prefix, batch, field, by)
  local key = batch_key_of(prefix, batch)
  if not bump_batch(key, field, by) or by <= 0 then return false end
  local _, left = fire_batch(prefix, batch, key)
  return left
end
