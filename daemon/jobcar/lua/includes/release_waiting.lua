--- @include "keys"
--- @include "now_ms"
--- @include "wake"
--- @include "pending_key"
--- @include "count_pending"

-- A waiting job told that its dependencies `refs` ("<queue>/<id>") ended done, or count as done: they leave
-- its <prefix>deps:<id>, and with the last of them it becomes pending, ready from now (its wait for the
-- others is no wait in the queue). For a batch's callback, `counts` (the batch's, JSON) goes around its
-- payload, its callback data: {"batch": <counts>, "data": <payload>}, spliced, not re-encoded (cjson would
-- round the producer's numbers). Returns "pending", "waiting" (others remain) or "ignored" (not waiting,
-- or for none of these: told before).
local function release_waiting(prefix, id, refs, counts)
  local job_key = job_key_of(prefix, id)
  if redis.pcall('HGET', job_key, 'state') ~= 'waiting' then return 'ignored' end
  local deps = deps_key_of(prefix, id)
  if redis.call('TYPE', deps).ok ~= 'set' then return 'ignored' end
  local removed = 0
  for first = 1, #refs, 1000 do
    removed = removed + redis.call('SREM', deps, unpack(refs, first, math.min(first + 999, #refs)))
  end
  if removed == 0 then return 'ignored' end
  if redis.call('SCARD', deps) > 0 then return 'waiting' end
  if counts and counts ~= '' then
    local data = redis.call('HGET', job_key, 'payload') or 'null'
    redis.call('HSET', job_key, 'payload', '{"batch":' .. counts .. ',"data":' .. data .. '}')
  end
  redis.call('ZREM', waiting_key_of(prefix), id)
  redis.call('HSET', job_key, 'state', 'pending', 'run_at', now_ms())
  local fields = redis.call('HMGET', job_key, 'priority', 'type')
  redis.call('LPUSH', pending_key(pending_key_of(prefix), fields[1]), id)
  count_pending(prefix, fields[2], 1)
  wake(wake_key_of(prefix))
  return 'pending'
end
